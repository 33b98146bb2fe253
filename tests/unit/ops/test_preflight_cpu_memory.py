"""`rlctl check` judges a trainer rank on a `gpu: CPU` site (its slot's share of the nodes' `memory_gb`) with the
activations the torch trainer keeps there: fp32, without autocast (`rlctl.profiler.actmem.FP32`), not the bf16 figures
and weight copies of a GPU's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rlctl.ops import counts
from rlctl.profiler.actmem import job_activations
from tests.unit.ops.test_preflight import load, refused, two_site_inventory


def test_a_cpu_trainer_is_judged_with_its_fp32_activations(tmp_path: Path) -> None:
    """Qwen2.5-7B on one CPU slot of 250 GB (225 usable), a rank's share of a cut 8,192 tokens: its state 125.9 GB,
    its activations 112.1 GB in fp32, refused; priced as on a GPU (89.4 GB: bf16, with 14.2 GB of weight copies the CPU
    trainer does not make), as until 2026-12-07, it fit (213.3 GB)."""
    job = load(
        tmp_path,
        inventory=[two_site_inventory(tmp_path, listen="auto", memory_gb=500)],  # 2 slots a node
        model={"kind": "builtin", "name": "qwen2.5-7b"},
        task={"kind": "lengths", "prompt_tokens": 512, "median_output_tokens": 2000, "max_output_tokens": 3584},
        batch={"prompts_per_iteration": 4, "samples_per_prompt": 4},
        placement={"trainer": {"site": "t", "gpus": 1}, "rollout": [{"site": "r", "gpus": 1}]},
    )
    assert counts.plan_counts(job, job.spec)["trainer"]["parallel"] == {"tp": 1, "pp": 1, "dp": 1}
    (p,) = refused(job, "batch.train_micro_batch_tokens")
    assert p.message == (
        "the trainer's 1 rank(s) at tp 1 pp 1 dp 1 need 236.0 GB each (weights and gradients 32.5 GB, optimizer state "
        "91.4 GB, activations (fp32) of a cut's 8,192 tokens a rank 112.1 GB), and a slot of site 't' gets 250 GB of "
        "its nodes' memory_gb (90% usable)"
    )
    gpu = job_activations(job.spec, job.spec.model.arch)
    assert gpu is not None and round(gpu.rank_bytes() / 1e9, 1) == 89.4  # (the figure a GPU site's rank is judged by)
    cpu = job_activations(job.spec, job.spec.model.arch, cpu=True)
    assert cpu == dataclasses.replace(gpu, fp32=True) and round(cpu.rank_bytes() / 1e9, 1) == 112.1


def test_a_megatron_rank_of_a_split_is_judged_with_the_full_weights_it_gathers_to_publish(tmp_path: Path) -> None:
    """A megatron rank at tp 2 (a CPU site's: a GPU's stops at start) keeps the model's full HF tensors in fp32 after
    each publish (`MegatronBackend.weights`: rank 0 checkpoints from them) and gathers one tensor's tp parts at a time:
    Qwen2.5-7B's 30.5 GB and its lm_head's 2.2 GB priced beside the rank's half of the state; versus its state
    alone (a torch rank at tp 2 and a megatron rank at tp 1 hold no such copy)."""
    from rlctl.launch.agentenv import ParallelConfig
    from rlctl.ops.preflight.memory import trainer_memory
    from rlctl.planner.split import shard_rule

    job = load(
        tmp_path,
        inventory=[two_site_inventory(tmp_path, listen="auto", memory_gb=500)],
        model={"kind": "builtin", "name": "qwen2.5-7b"},
        placement={"trainer": {"site": "t", "gpus": 2}, "rollout": [{"site": "r", "gpus": 1}]},
    )
    site = job.inventory.sites["t"]
    megatron = job.spec.model_copy(update={"trainer": job.spec.trainer.model_copy(update={"backend": "megatron"})})
    split = ParallelConfig("trainer", 2, 1, dp=1)
    torch_tp2 = trainer_memory(job.spec, "t", site, split)
    tp2 = trainer_memory(megatron, "t", site, split)
    tp1 = trainer_memory(megatron, "t", site, ParallelConfig("trainer", 1, 1, dp=1))
    assert torch_tp2 is not None and tp2 is not None and tp1 is not None
    arch = job.spec.model.arch
    gathered = 4 * (arch.params + arch.vocab * arch.hidden)  # the full weights and the lm_head's parts, in fp32
    assert round(gathered / 1e9, 1) == 32.7
    assert tp2.need_gb - tp2.activations_gb == pytest.approx(
        torch_tp2.need_gb - torch_tp2.activations_gb + gathered / 1e9
    )
    assert ", the full weights gathered to publish 32.7 GB (fp32)" in tp2.why
    assert "gathered to publish" not in tp1.why + torch_tp2.why
    # the planner prices a layout with it alike (its ShardRule's, as the plan's workload), none on a GPU site (where a
    # megatron rank of a split stops at start)
    assert shard_rule(megatron, arch, cpu=True).export_bytes == gathered
    assert shard_rule(megatron, arch, cpu=False).export_bytes == shard_rule(job.spec, arch, cpu=True).export_bytes == 0
