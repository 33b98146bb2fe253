"""The tensor-parallel degrees a plan gives each role are those its engine and trainer shard the model over
(`rlctl.planner.split`): vLLM's key/value heads split over tp below their count and are replicated on tp / kv_heads
GPUs above it, megatron's never replicated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rlctl.config import load_job
from rlctl.hardware import CATALOG
from rlctl.models.catalog import BUILTIN_MODELS, ModelArch
from rlctl.planner.inputs import PlanOptions
from rlctl.planner.plan import make_plan
from rlctl.planner.split import rollout_tp_refusal, trainer_tp_refusal
from rlctl.profiler.analytical import generation_entries, training_entries
from tests.conftest import ROOT

# Phi-4's attention: 40 query heads over 10 key/value heads (phi4-14b's figures, as a `kind: arch` model writes them)
PHI4_LIKE = {
    "kind": "arch",
    "name": "phi4-like",
    "layers": 40,
    "hidden": 5120,
    "heads": 40,
    "kv_heads": 10,
    "vocab": 100352,
    "intermediate": 17920,
    "params": 14.66e9,
}


def _arch(heads: int, kv_heads: int) -> ModelArch:
    return ModelArch("m", 4, 64 * heads, heads, kv_heads, 1024, 256 * 8 * 3, 1e9)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "runs"),
    [
        (40, 10, [1, 2]),  # Phi-4: 4 and 8 neither divide 10 nor are multiples of it
        (28, 4, [1, 2, 4]),  # Qwen2.5-7B: 8 does not divide the 28 query heads
        (32, 2, [1, 2, 4, 8]),  # 4 and 8 replicate each of 2 key/value heads on 2 and 4 GPUs
        (48, 6, [1, 2]),  # 4 does not divide 6, 8 is not a multiple of it
        (32, 8, [1, 2, 4, 8]),
    ],
)
def test_vllm_shards_the_key_value_heads_below_their_count_and_replicates_them_above(
    heads: int, kv_heads: int, runs: list[int]
) -> None:
    assert [tp for tp in (1, 2, 4, 8) if rollout_tp_refusal(_arch(heads, kv_heads), tp) is None] == runs


def test_the_trainer_never_replicates_a_key_value_head() -> None:
    assert [tp for tp in (1, 2, 4, 8) if trainer_tp_refusal(_arch(32, 2), tp) is None] == [1, 2]
    assert trainer_tp_refusal(_arch(32, 2), 4) == "4 does not divide the model's num_key_value_heads 2; use a divisor"


def test_the_analytical_profile_prices_only_the_tps_each_role_runs() -> None:
    phi4, qwen = BUILTIN_MODELS["phi4-14b"], BUILTIN_MODELS["qwen2.5-7b"]
    h20 = CATALOG["H20"]
    assert [e.tp for e in generation_entries(phi4, h20, gpus_per_node=8)] == [1, 2]
    assert sorted({e.tp for e in training_entries(phi4, h20, gpus_per_node=8, algorithm="grpo")}) == [1, 2]
    # a 7B Qwen2 (28 heads, 4 key/value heads) keeps the tps it had
    assert [e.tp for e in generation_entries(qwen, h20, gpus_per_node=8)] == [1, 2, 4]
    assert sorted({e.tp for e in training_entries(qwen, h20, gpus_per_node=8, algorithm="grpo")}) == [1, 2, 4]


def _cross_dc(tmp: Path, model: dict[str, Any]) -> Path:
    job = yaml.safe_load((ROOT / "jobs/cross-dc-7b.yaml").read_text())
    job["inventory"] = [str(ROOT / "jobs" / p) for p in job["inventory"]]
    job["model"] = model
    job["task"]["max_output_tokens"] = 15872  # within Phi-4's 16384 positions (512 prompt tokens)
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


@pytest.mark.parametrize("model", [{"kind": "builtin", "name": "phi4-14b"}, PHI4_LIKE], ids=["builtin", "arch"])
def test_a_plan_gives_a_rollout_unit_a_tp_vllm_runs_phi4_at(tmp_path: Path, model: dict[str, Any]) -> None:
    job = load_job(_cross_dc(tmp_path, model))
    plan = make_plan(job, options=PlanOptions(sim_iterations=2))
    tps = {a["role"]: a["config"]["tp"] for a in plan["allocation"]}
    assert tps["rollout"] in (1, 2), plan["allocation"]  # was tp 8 × dp 4 on the 32 H20s: 8 of 10 key/value heads
    assert trainer_tp_refusal(job.spec.model.arch, tps["trainer"]) is None
