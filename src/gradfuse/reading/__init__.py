"""Reading what was found, and the answer: which sentences of the chosen passages answer the question, whether any
does, and what the answer says.

- evidence.py: the Evidence record of one scored sentence (or table row), how passages are cut into them, the quotes;
- scoring.py: `[evidence]`, which scorer values the sentences, and the LM-free ones (stage 2's LM scorers per
  sentence are rerank/sentences.py);
- support.py: the default evidence scorer and "not found" (support.json: its weights, fitted by
  bench/fit_support.py);
- reader.py: the reader trained here (READER.md: its model card), a signal of support.py where a fit chooses it;
  local_reader.py: a local cross-encoder or NLI folder in its role (`[evidence] reader`);
- answering.py: the answer path, evidence → support → "not found" → the answer.

Only answering.py imports the query pipeline and the generators; nothing here imports a shell, and rerank/ never
imports reading/."""
