"""A vLLM engine keeps the latest PUSH_TIMES_KEPT weight-load times (`push_s`), versus one per load for ever: a unit
of a job of weeks loads a version per trainer step, 10^5 and more. vLLM itself is faked: only the engine's
bookkeeping is under test (its loads are tests/vllm's)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch

from rlctl.engines import vllm as engine_module
from rlctl.models.hf import QWEN2, TinyGPTConfig
from tests.unit.fake_vllm import fake_vllm


def test_an_engine_keeps_the_latest_weight_load_times_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_vllm(monkeypatch)
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
