# rlctl — the README's two commands are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
UCX_STAMP := $(VENV)/.ucx-installed

.PHONY: demo test lint unit integration services-up services-down bench clean

# torch first, pinned: on these machines `torch==2.13.0` is a local CPU build; an open range would pull
# a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0 numpy
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# The optional UCX transport (ucxx, TCP transport without a GPU) for the tests and benchmarks, so its
# tests run in CI rather than skip. Not needed by the demo.
$(UCX_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[ucx]' || echo "ucxx could not be installed: the UCX tests will be skipped"
	touch $(UCX_STAMP)

demo: $(STAMP)
	$(BIN)/rlctl launch jobs/demo.yaml

lint: $(STAMP)
	$(BIN)/ruff check rlctl tests bench
	$(BIN)/ruff format --check rlctl tests bench
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

# Integration tests need root: they start SLURM, sshd and network namespaces, and always stop them.
integration: $(STAMP) $(UCX_STAMP)
	trap 'bash tests/services/all.sh down' EXIT; \
	bash tests/services/all.sh up && \
	RLCTL_REQUIRE_SERVICES=1 $(BIN)/pytest -q tests/integration

test: lint unit integration

services-up:
	bash tests/services/all.sh up

services-down:
	bash tests/services/all.sh down

bench: $(STAMP) $(UCX_STAMP)
	$(BIN)/python -m bench all

clean:
	rm -rf $(VENV) runs .mypy_cache .ruff_cache
