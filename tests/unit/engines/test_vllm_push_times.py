"""A vLLM engine keeps the latest PUSH_TIMES_KEPT weight-load times (`push_s`), versus one per load for ever: a unit
of a job of weeks loads a version per trainer step, 10^5 and more. vLLM itself is faked: only the engine's
bookkeeping is under test (its loads are tests/vllm's)."""

from __future__ import annotations

import json
import statistics
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from rlctl.engines import vllm as engine_module
from rlctl.models.hf import QWEN2, TinyGPTConfig


class _LLM:
    def __init__(self, **kwargs: Any) -> None:
        self.llm_engine = types.SimpleNamespace(reset_prefix_cache=lambda **k: True)
        self.rpcs = 0

    def collective_rpc(self, fn: Any, **kwargs: Any) -> None:
        self.rpcs += 1


def _fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    vllm = types.ModuleType("vllm")
    vllm.LLM = _LLM  # type: ignore[attr-defined]
    vllm.__version__ = "0.0-fake"  # type: ignore[attr-defined]
    vllm.platforms = types.SimpleNamespace(current_platform=types.SimpleNamespace(is_cpu=lambda: False))  # type: ignore[attr-defined]
    params = types.ModuleType("vllm.sampling_params")
    params.RequestOutputKind = types.SimpleNamespace(DELTA="delta")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", params)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def test_an_engine_keeps_the_latest_weight_load_times_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_vllm(monkeypatch)
    config = TinyGPTConfig(architecture=QWEN2).to_hf()  # the engine reads its context there (max_model_len)
    (tmp_path / "config.json").write_text(json.dumps(config))
    engine = engine_module.VllmEngine(tmp_path, eos_token_ids=[0], weights_via_file=False, weight_transfer=False)
    weights = {"w": torch.zeros(2)}
    loads = 3000
    for v in range(1, loads + 1):
        engine.load_weights(weights, v)
    assert (engine.version, engine.llm.rpcs) == (loads, loads)
    assert len(engine.push_s) < loads  # was: one per load
    assert len(engine.push_s) == engine_module.PUSH_TIMES_KEPT
    assert statistics.median(engine.push_s) >= 0.0  # what its readers print (tests/vllm)
