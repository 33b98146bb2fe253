"""A Qwen MoE's config.json with no layer holding experts (`num_experts` 0, a `decoder_sparse_step` past the last
layer, `mlp_only_layers` naming every layer: valid in HF, where every MLP is dense) is planned and profiled as the
dense model it builds, versus a pydantic traceback from `rlctl plan` (its profile's `ModelSpec` refused experts 0, or
dense_layers 2 not fewer than layers 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlctl.models.hf import QWEN3_MOE, TinyGPTConfig
from rlctl.models.moe import MoeConfig
from rlctl.profiler.profile import ModelSpec
from tests.conftest import run_cli
from tests.unit.planner.test_planner_context import _job

NO_EXPERTS: dict[str, dict[str, Any]] = {
    "zero-experts": {"num_experts": 0},
    "step-past-the-layers": {"decoder_sparse_step": 4},
    "every-layer-dense": {"mlp_only_layers": [0, 1]},
}


@pytest.mark.parametrize("keys", NO_EXPERTS.values(), ids=NO_EXPERTS.keys())
def test_a_moe_config_without_a_sparse_layer_is_described_as_dense(keys: dict[str, Any]) -> None:
    moe = MoeConfig(**{"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, **keys})
    config = TinyGPTConfig(architecture=QWEN3_MOE, num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                           num_key_value_heads=4, moe=moe)  # fmt: skip
    dense = TinyGPTConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=4)
    arch = config.arch("m")
    assert (arch.experts, arch.expert_intermediate, arch.active_params, arch.token_intermediate) == (0, 0, None, None)
    assert arch.params == config.num_params() == dense.num_params() + 2 * 2 * config.head_dim  # (Qwen3: q_norm, k_norm)
    spec = ModelSpec.of(arch)
    assert spec.experts is None and spec.arch == arch


@pytest.mark.parametrize("keys", NO_EXPERTS.values(), ids=NO_EXPERTS.keys())
def test_plan_and_profile_run_on_an_hf_moe_without_a_sparse_layer(tmp_path: Path, keys: dict[str, Any]) -> None:
    pytest.importorskip("transformers")
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    spec = {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "head_dim": 32,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "max_position_embeddings": 4096, **keys}  # fmt: skip
    Qwen3MoeForCausalLM(Qwen3MoeConfig(**spec)).save_pretrained(tmp_path / "model")
    (tmp_path / "model/tokenizer.json").write_text('{"version": "1.0", "model": {"type": "WordLevel"}}\n')
    path = _job(tmp_path, {"kind": "hf", "path": str(tmp_path / "model")}, max_output_tokens=1000)
    res = run_cli("plan", str(path))
    assert res.exit_code == 0, (res.stdout[-500:], res.stderr)
    res = run_cli("profile", "--job", str(path), "-o", str(tmp_path / "p.yaml"))
    assert res.exit_code == 0, (res.stdout[-500:], res.stderr)
    assert "experts" not in (tmp_path / "p.yaml").read_text()
