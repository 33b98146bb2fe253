"""A vLLM engine reads its checkpoint's config.json once as it starts and takes from that reading what vLLM is told
(eos ids, the CPU K/V space, max_model_len, the architecture of a config that names none), versus once for each of
them. vLLM is faked (tests/unit/fake_vllm.py): the arguments it is built with are recorded."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from rlctl.engines.vllm import VllmEngine
from rlctl.models.hf import QWEN3, TinyGPTConfig
from tests.unit.fake_vllm import fake_vllm
from tests.unit.hf_checkpoints import config_reads


def test_an_engine_reads_config_json_once_as_it_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_vllm(monkeypatch, cpu=True)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "")  # (so that the engine's setting of it is undone after the test)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
    written = TinyGPTConfig(architecture=QWEN3, max_position_embeddings=1 << 20, eos_token_id=[2, 5]).to_hf()
    del written["architectures"], written["head_dim"]  # read by its model_type; Qwen3Config's head_dim 128
    (tmp_path / "config.json").write_text(json.dumps(written))
    reads = config_reads(monkeypatch)  # (every way config.json is read: `read_config_bytes`, Path.read_*)
    engine = VllmEngine(tmp_path, max_batch_size=64, context=65536, weights_via_file=False, weight_transfer=False)
    assert reads == [tmp_path / "config.json"]  # was 6: eos ids, K/V space (and its max_model_len), … architecture
    llm: Any = engine.llm
    assert llm.kwargs["max_model_len"] == 65536
    assert llm.kwargs["hf_overrides"] == {"architectures": [QWEN3]}
    assert engine.eos_ids == (2, 5)
    # 2 (K, V) × 3 layers × 3 kv heads × 128 × 4 bytes a position, 2^16 positions, 64 rows, +25 %
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "45"
