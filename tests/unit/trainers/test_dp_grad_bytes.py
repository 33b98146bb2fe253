"""The gradient bytes the planner prices a data-parallel step's reduction at (`rlctl.planner.costs.dp_reduced_bytes`)
are those the trainer hands its collectives, counted in a real step of 2 gloo ranks: the unsharded torch trainer and
megatron all-reduce their fp32 gradients once a step (`rlctl.rl.gradsum`), FSDP2 reduce-scatters them in fp32 in
every backward (a cut of the step's samples)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from rlctl.config.job import Job
from rlctl.config.pipeline import Batch
from rlctl.models.tinygpt import TinyGPT
from rlctl.planner.costs import dp_reduced_bytes, step_cuts
from rlctl.planner.inputs import profile_for, train_cost
from rlctl.planner.plan import train_workload
from rlctl.profiler.traincost import TrainingPasses
from tests.unit.ops.test_preflight import gpu_job
from tests.unit.trainers.ranks import ENV, start_rank
from tests.unit.trainers.test_fsdp import CFG, iterations

SCRIPT = Path(__file__).with_name("dp_grad_rank.py")
EVEN = dataclasses.replace(CFG, vocab_size=68)  # every tensor shards evenly over 2 ranks: FSDP2 pads none
MICRO = 3  # 16 samples: 6 cuts


def collectives(tmp_path: Path, kind: str) -> list[list[tuple[str, str, int]]]:
    """Each rank's collectives of one GRPO step of `kind` ('torch', 'fsdp', 'megatron') on 2 gloo ranks."""
    torch.manual_seed(0)
    TinyGPT(EVEN).save_pretrained(tmp_path / "model")
    torch.save(iterations()[0], tmp_path / "samples.pt")
    argv = [str(tmp_path / "rdv"), kind, str(tmp_path / "model"), str(tmp_path / "samples.pt"), str(MICRO)]
    procs = [start_rank(SCRIPT, [str(r), "2", *argv, str(tmp_path / f"out-{r}.pt")], ENV) for r in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    return [torch.load(tmp_path / f"out-{r}.pt", weights_only=False) for r in range(2)]


def planned_bytes(tmp_path: Path, kind: str) -> float:
    """The planner's figure for this model and batch, as `rlctl plan` prices it (`plan.train_workload`)."""
    job = gpu_job(tmp_path, trainer_gpus=2, backend="megatron" if kind == "megatron" else "torch")
    spec = job.spec
    trainer = spec.trainer.model_copy(update={"shard": "fsdp" if kind == "fsdp" else "none"})
    batch = Batch(prompts_per_iteration=4, samples_per_prompt=4, train_micro_batch_samples=MICRO)
    job = Job(spec.model_copy(update={"trainer": trainer, "batch": batch}), job.inventory, job.path)
    w = train_workload(job, EVEN.arch("tiny"), train_cost(job, profile_for(job, None), TrainingPasses()), tokens=1e4)
    assert w.shards_always == (kind == "fsdp") and step_cuts(w) == (6, MICRO)
    return dp_reduced_bytes(w, tp=1, pp=1, dp=2, fsdp=kind == "fsdp")


@pytest.mark.parametrize(
    ("kind", "collective"), [("torch", "all_reduce"), ("fsdp", "reduce_scatter_single"), ("megatron", "all_reduce")]
)
def test_the_planner_prices_the_gradient_bytes_the_trainer_reduces(tmp_path: Path, kind: str, collective: str) -> None:
    params = sum(p.numel() for p in TinyGPT(EVEN).parameters())
    assert EVEN.arch("tiny").params == params
    for calls in collectives(tmp_path, kind):
        grads = [(name, dtype, n) for name, dtype, n in calls if dtype == "torch.float32"]
        assert {name for name, _, _ in grads} == {collective}  # (the step's summed figures: one float64 all-reduce)
        sent = sum(n for _, _, n in grads)
        assert sent == 4 * params * (6 if kind == "fsdp" else 1)  # fp32: every cut's backward (FSDP2), or once
        assert planned_bytes(tmp_path, kind) == sent
