"""Getting documents in: each file format's reader (readers/, the parser worker that isolates them), records from
BEIR and JSONL inputs and their chunking into passages (documents.py), and a folder's files as documents
(files.py).

The pipeline's first step: it imports nothing of the later ones (embedding, sources, indexing, federation, ...),
only the package's shared records (candidate.py, access/, checked.py, folders.py).
"""
