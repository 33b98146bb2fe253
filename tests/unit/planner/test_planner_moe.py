"""A MoE's figures in the planner: memory (weights, gradients, optimizer state, KV room) is of every parameter, a
token's FLOPs of its active ones (`ModelArch.active`: Qwen3-30B-A3B's 3.35e9 of 30.5e9), from the built-in, an HF
directory's config.json and a `kind: arch` job alike, and kept through a profile file."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rlctl.config.model import ArchModel
from rlctl.hardware import CATALOG
from rlctl.models.catalog import BUILTIN_MODELS
from rlctl.models.hfdir import check_hf_dir
from rlctl.profiler.analytical import (
    analytical_profile,
    decode_step_s,
    kv_capacity_tokens,
    prefill_s_per_token,
    training_entries,
)
from rlctl.profiler.profile import load_profile, save_profile

MOE = BUILTIN_MODELS["qwen3-30b-a3b"]
DENSE = dataclasses.replace(MOE, active_params=None)  # the same weights, every one computing


def test_training_is_priced_by_the_active_parameters_and_held_by_all_of_them() -> None:
    g = CATALOG["H800"]
    moe = {(e.tp, e.pp): e for e in training_entries(MOE, g, gpus_per_node=8, algorithm="grpo")}
    dense = {(e.tp, e.pp): e for e in training_entries(DENSE, g, gpus_per_node=8, algorithm="grpo")}
    assert set(moe) == set(dense)
    for key, e in moe.items():  # (tp > 1 adds all-reduces of the activations: of the tokens, not the parameters)
        if key[0] == 1:
            assert e.gpu_s_per_token == pytest.approx(dense[key].gpu_s_per_token * MOE.active / MOE.params)
        assert (e.fixed_bytes_per_gpu, e.sharded_bytes_per_gpu) == (
            dense[key].fixed_bytes_per_gpu,
            dense[key].sharded_bytes_per_gpu,
        )


def test_generation_is_priced_by_the_active_parameters_and_holds_all_of_them() -> None:
    g = CATALOG["H800"]
    share = MOE.active / MOE.params  # 0.11
    assert prefill_s_per_token(MOE, g, tp=1) == pytest.approx(prefill_s_per_token(DENSE, g, tp=1) * share)
    assert kv_capacity_tokens(MOE, g, tp=1) == kv_capacity_tokens(DENSE, g, tp=1)
    # a large batch is compute bound: the MoE's step is the active share of the dense one's (less the fixed part)
    moe, dense = (decode_step_s(m, g, tp=1, batch=4096, context=1024) for m in (MOE, DENSE))
    assert moe < 0.5 * dense


def test_an_hf_moe_checkpoint_and_a_kind_arch_model_carry_the_active_count(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from tests.unit.hf_checkpoints import write_checkpoint

    ref = write_checkpoint("qwen3moe-dense1-hd32", tmp_path / "model")
    arch = check_hf_dir(tmp_path / "model").arch
    expert = 3 * 64 * 32  # gate, up, down of 32 wide over hidden 64; layer 0 of 2 has experts, top 2 of 8
    assert arch.params == sum(p.numel() for p in ref.parameters())
    assert arch.active == arch.active_params == arch.params - (8 - 2) * expert
    figures = {"name": "m", "layers": 48, "hidden": 2048, "heads": 32, "kv_heads": 4, "vocab": 151936,
               "intermediate": 6144, "params": 30.5e9, "head_dim": 128}  # fmt: skip
    job_model = ArchModel.model_validate({"kind": "arch", **figures, "active_params": 3.35e9})
    assert job_model.arch.active == 3.35e9 and job_model.model_dump()["active_params"] == 3.35e9
    assert ArchModel.model_validate({"kind": "arch", **figures}).arch.active == 30.5e9  # dense: every parameter
    assert "active_params" not in ArchModel.model_validate({"kind": "arch", **figures}).model_dump()


def test_a_qwen2_moe_checkpoint_counts_its_shared_expert_as_active(tmp_path: Path) -> None:
    """A Qwen2MoE's shared expert and its gate run for every token: active, beside the router and the top k; and the
    built-in Qwen2-57B-A14B is priced by its 14.2e9 active parameters, held by all 57.4e9."""
    pytest.importorskip("transformers")
    from tests.unit.hf_checkpoints import write_checkpoint

    ref = write_checkpoint("qwen2moe-dense1", tmp_path / "model")
    arch = check_hf_dir(tmp_path / "model").arch
    expert = 3 * 64 * 32  # gate, up, down of 32 wide over hidden 64; layer 0 of 2 has experts, top 2 of 8
    shared = sum(p.numel() for n, p in ref.named_parameters() if "shared_expert" in n)
    assert shared == 3 * 64 * 48 + 64  # the shared expert (48 wide) and its gate [1, 64]
    assert arch.params == sum(p.numel() for p in ref.parameters())
    assert arch.active == arch.params - (8 - 2) * expert
    big, g = BUILTIN_MODELS["qwen2-57b-a14b"], CATALOG["H800"]
    dense = dataclasses.replace(big, active_params=None)
    share = big.active / big.params  # 0.25
    assert prefill_s_per_token(big, g, tp=1) == pytest.approx(prefill_s_per_token(dense, g, tp=1) * share)
    assert kv_capacity_tokens(big, g, tp=1) == kv_capacity_tokens(dense, g, tp=1)


def test_a_profile_of_a_moe_keeps_its_active_count(tmp_path: Path) -> None:
    prof = analytical_profile(MOE, {"h": (CATALOG["H800"], 8, 2.85)})
    save_profile(prof, tmp_path / "p.yaml")
    again = load_profile(tmp_path / "p.yaml")
    assert again.model.arch == MOE and again.model.arch.active == 3_353_032_704
