"""One GRPO step through the trainer's backend path at tensor parallel 2 (two gloo processes, one tp group,
data parallel 1) against the same step at tp = 1: the learner hands both tp ranks the same samples, sums
gradients over the data-parallel group only (none here), clips by the norm over both shards, and each rank
steps its own shard; the full HF weights both ranks publish are the same bytes and move as tp = 1's do."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from rlctl.models.tinygpt import TinyGPT
from tests.unit.hf_checkpoints import write_checkpoint
from tests.unit.trainers.megatron_required import require_megatron
from tests.unit.trainers.ranks import spawn_ranks
from tests.unit.trainers.test_megatron_backend import rollouts

pytest.importorskip("transformers")
RANK = Path(__file__).with_name("megatron_grpo_rank.py")
# tied embeddings (vocab-parallel at both ends) with a replicated o_proj bias; grouped-query attention with
# an untied, vocab-parallel lm_head; Qwen3's q/k norms, whose gradient the tp ranks sum before the step
VARIANTS = ["llama-bias-tied", "llama-hd64-eos3", "qwen3-tied-hd32"]


def run_ranks(
    tmp_path: Path, name: str, *, world: int, tp: int, checkpoints: list[Path], pp: int = 1
) -> list[subprocess.Popen[str]]:
    return spawn_ranks(
        RANK, world=world, tp=tp, pp=pp, rendezvous=tmp_path / f"{name}.rendezvous",
        out=lambda r: tmp_path / f"{name}-{r}.pt", checkpoints=checkpoints, extra=(str(tmp_path / "samples.pt"),),
    )  # fmt: skip


@pytest.mark.timeout(400)
def test_a_grpo_step_at_tp2_moves_the_weights_as_at_tp1(tmp_path: Path) -> None:
    require_megatron()
    checkpoints = [tmp_path / v for v in VARIANTS]
    before: dict[str, dict[str, torch.Tensor]] = {}
    batch: dict[str, Any] = {}
    for variant, path in zip(VARIANTS, checkpoints, strict=True):
        write_checkpoint(variant, path)
        model = TinyGPT.from_pretrained(path)
        before[str(path)] = {k: v.clone() for k, v in model.state_dict().items()}
        batch[str(path)] = copy.deepcopy(rollouts(model, prompts=3, group=4, seed=0))
    torch.save(batch, tmp_path / "samples.pt")
    procs = run_ranks(tmp_path, "tp2", world=2, tp=2, checkpoints=checkpoints)
    procs += run_ranks(tmp_path, "tp1", world=1, tp=1, checkpoints=checkpoints)
    errors = [p.communicate(timeout=360)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(e[-3000:] for e in errors)
    tp2 = [torch.load(tmp_path / f"tp2-{r}.pt", weights_only=False) for r in (0, 1)]
    (tp1,) = [torch.load(tmp_path / "tp1-0.pt", weights_only=False)]
    for c in map(str, checkpoints):
        got0, got1, want = tp2[0][c], tp2[1][c], tp1[c]
        assert got0["dp"] == got1["dp"] == [0, 1]  # one tp group: both ranks are data-parallel rank 0 of 1
        # the roots of one version publish the same bytes
        assert list(got0["weights"]) == list(got1["weights"]) == list(want["weights"])
        assert all(torch.equal(got0["weights"][k], got1["weights"][k]) for k in got0["weights"]), c
        s2, s1 = got0["stats"], want["stats"]
        assert s2["loss"] == pytest.approx(s1["loss"], abs=1e-6)
        assert s2["tokens"] == s1["tokens"]
        assert s2["grad_norm"] == pytest.approx(s1["grad_norm"], rel=1e-5)  # the norm over both shards
        for k, w in want["weights"].items():  # the same update up to fp32 rounding (as test_megatron_backend)
            step = (w - before[c][k]).norm()
            assert step > 0, k
            tolerance = 5e-2 if k.endswith("k_proj.bias") else 2e-3
            assert (got0["weights"][k] - w).norm() <= tolerance * step, (c, k)
