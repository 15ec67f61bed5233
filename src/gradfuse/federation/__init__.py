"""Asking many sources at once: which sources a workspace has, each opened when asked (catalog.py), each source's
workers and circuit breaker (guard.py), the concurrent fan-out with its deadlines and failures
(federated.py), and the routing summaries of engines and remotes, made in the background (summaries.py).

It imports the steps before it (ingest/, embedding/, sources/, indexing/), never selection/ or a later one.
"""
