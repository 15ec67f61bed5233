"""The local language models' weights, shared by the steps that run one: the scoring LM of stage 2 (rerank/) and a
local generator (generate/). It imports none of the pipeline's steps."""
