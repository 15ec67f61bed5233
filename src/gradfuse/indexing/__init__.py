"""Building a source: documents read (ingest/), embedded (embedding/) and written into a source kind's store
(sources/), then published as a new version (build.py, under a lock: lock.py); a table of PostgreSQL loaded with
`--into` (postgres_load.py).

It imports ingest/, embedding/ and sources/, never federation/ or a later step.
"""

from gradfuse.indexing.build import BuildReport, build_source

__all__ = ["BuildReport", "build_source"]
