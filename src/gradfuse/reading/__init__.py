"""Reading what was found: which sentences of the chosen passages answer the question, and whether any does.

It may import the candidate record, the encoder (sources/) and the evidence record (evidence.py); never the query
pipeline, a shell or the generators."""
