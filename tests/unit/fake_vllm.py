"""A stand-in for the `vllm` module where only the rollout engine's own bookkeeping is under test (vLLM's behaviour is
tests/vllm's): `vllm.LLM` records the arguments it is built with and counts collective RPCs."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest


class FakeLLM:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.llm_engine = types.SimpleNamespace(reset_prefix_cache=lambda **k: True)
        self.rpcs = 0

    def collective_rpc(self, fn: Any, **kwargs: Any) -> None:
        self.rpcs += 1


def fake_vllm(monkeypatch: pytest.MonkeyPatch, *, cpu: bool = False) -> None:
    """`import vllm` gives the fake (its platform a CPU where `cpu`), its engine core in this process."""
    vllm = types.ModuleType("vllm")
    vllm.LLM = FakeLLM  # type: ignore[attr-defined]
    vllm.__version__ = "0.0-fake"  # type: ignore[attr-defined]
    vllm.platforms = types.SimpleNamespace(current_platform=types.SimpleNamespace(is_cpu=lambda: cpu))  # type: ignore[attr-defined]
    params = types.ModuleType("vllm.sampling_params")
    params.RequestOutputKind = types.SimpleNamespace(DELTA="delta")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", params)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
