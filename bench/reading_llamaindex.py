"""LlamaIndex's default query engine on the reading benchmark, with the same LLM, encoder and passages as
`make bench-reading-llm`: the row beside gradfuse's written answers (issue 70).

The passages are the ones gradfuse built from the six document families (`make bench-reading` builds them), with
the vectors it stored, as LlamaIndex nodes in one `VectorStoreIndex`; a question is asked with
`index.as_query_engine()` as LlamaIndex sets it up by default (the two most similar nodes, its text-QA prompt,
"compact" synthesis). The query's vector comes from the same MiniLM encoder. The LLM is Qwen2.5-Coder-0.5B-Instruct
behind llama.cpp's server (bench/llm_server.py), reached through a small `CustomLLM` that sends LlamaIndex's prompt
as one chat message by the `openai` SDK (llama-index-llms-openai-like would pin another `openai` than gradfuse's).

Rows: the answer holds the fact (answerable, whatever else it says); it declines (no answer; answerable: wrongly),
read from its words ("not mentioned", "does not provide", "I don't know" …), since the engine has no "not found" of
its own (a right answer that also says "not mentioned" counts as both).

    python bench/reading_llamaindex.py      # make bench-reading-llamaindex: results/reading/llamaindex/
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.embeddings import BaseEmbedding
from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.schema import TextNode
from openai import OpenAI

from llm_server import GGUFS, LICENCE, served
from reading import QUESTIONS, ROOT, WORK, holds

from gradfuse.embedding.encoder import load_encoder
from gradfuse.eval.record import ResultsFile
from gradfuse.sources.docstore import DocStore

OUT = ROOT / "results" / "reading" / "llamaindex"
LLM = "qwen0.5b"
# How an answer says that its context does not answer (LlamaIndex's engine has no "not found" of its own).
DECLINES = re.compile(r"\b(not (mentioned|provided|specified|stated|found|included|available|contain\w*|say)|"
                      r"no (information|mention)|does(n't| not) (say|mention|specify|provide|contain|state|include)|"
                      r"(don't|do not|cannot|can't|unable to) (know|answer|determine|find)|not possible to)\b",
                      re.IGNORECASE)


class EndpointLLM(CustomLLM):
    """An OpenAI-compatible chat endpoint as a LlamaIndex completion LLM: its prompt as one user message."""

    url: str
    key: str
    max_tokens: int = 128

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(context_window=8192, num_output=self.max_tokens, model_name=LLM)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs) -> CompletionResponse:
        reply = OpenAI(base_url=f"{self.url}/v1", api_key=self.key).chat.completions.create(
            model="default", messages=[{"role": "user", "content": prompt}], max_tokens=self.max_tokens,
            temperature=0)
        return CompletionResponse(text=reply.choices[0].message.content or "")

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs):
        yield self.complete(prompt)


class GradfuseEncoder(BaseEmbedding):
    """The MiniLM encoder gradfuse embedded the passages with (query vectors only: the nodes carry theirs)."""

    def _get_query_embedding(self, query: str) -> list[float]:
        return load_encoder("all-MiniLM-L6-v2").encode_query(query).tolist()

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        raise RuntimeError("the nodes carry gradfuse's vectors")


def nodes() -> list[TextNode]:
    """Every passage gradfuse built for the six families, with its stored vector."""
    found = []
    for source in sorted((WORK / "ws" / "sources").iterdir()):
        version = source / (source / "CURRENT").read_text().strip()
        vectors = np.load(version / "embeddings.npy")
        store = DocStore(version / "docs.sqlite")
        candidates = store.candidates(source.name, list(range(len(vectors))), [0.0] * len(vectors))
        found += [TextNode(text=c.text, id_=f"{source.name}/{c.doc_id}", embedding=vectors[i].astype(float).tolist(),
                           metadata={"file": Path(c.location.file).name if c.location else c.doc_id})
                  for i, c in enumerate(candidates)]
    return found


def main() -> int:
    if not (WORK / "ws" / "sources").is_dir():
        raise SystemExit("run make bench-reading first: it builds the passages this bench reads")
    questions = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
    Settings.embed_model = GradfuseEncoder()
    index = VectorStoreIndex(nodes())
    with served(LLM) as url:
        Settings.llm = EndpointLLM(url=url, key=os.environ["LLM_KEY"])
        engine = index.as_query_engine()
        results = ResultsFile.start(OUT, "python bench/reading_llamaindex.py", questions=len(questions),
                                    llm=f"{GGUFS[LLM][0]}, {LICENCE}", engine="VectorStoreIndex.as_query_engine()",
                                    passages=len(index.docstore.docs))
        rows = []
        for n, question in enumerate(questions, start=1):
            started = time.perf_counter()
            text = str(engine.query(question["question"]))
            rows.append({"id": question["id"], "family": question["family"],
                         "answerable": question["kind"] == "answerable", "answer": text,
                         "declined": bool(DECLINES.search(text)), "holds": holds(question, text),
                         "seconds": time.perf_counter() - started})
            if n % 20 == 0:
                print(f"{n}/{len(questions)}", flush=True)
    for family in [*dict.fromkeys(r["family"] for r in rows), "all"]:
        chosen = [r for r in rows if family in ("all", r["family"])]
        answerable = [r for r in chosen if r["answerable"]]
        unanswerable = [r for r in chosen if not r["answerable"]]
        results.add(family, {
            "answer holds": round(np.mean([r["holds"] for r in answerable]), 3),
            "declined": round(np.mean([r["declined"] for r in unanswerable]), 3),
            "declined wrongly": round(np.mean([r["declined"] for r in answerable]), 3),
            "seconds p50": round(float(np.median([r["seconds"] for r in chosen])), 2)})
    (OUT / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = ["# Reading: LlamaIndex's default query engine, the same LLM and passages", "",
             f"{results.provenance} {len(questions)} questions of the reading benchmark (evaluation only); "
             f"{results.header['passages']} passages (gradfuse's, with its vectors) in one `VectorStoreIndex`, "
             f"asked by `as_query_engine()` with its defaults; LLM: {results.header['llm']}, behind llama.cpp's "
             "server. A decline is read from the answer's words (bench/reading_llamaindex.py).", "",
             "| family | answer holds | declined (no answer) | declined wrongly (answerable) | seconds p50 |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {name} | {r['answer holds']} | {r['declined']} | {r['declined wrongly']} | {r['seconds p50']} |"
              for name, r in results.rows.items()]
    results.finish("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
