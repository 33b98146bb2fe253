"""PPO through the trainer's learner at tensor parallel 2, pipeline parallel 2 and data parallel 2 (two gloo
processes each) against the same two iterations at tp = pp = dp = 1: the ranks of a tp or pp group train the
same samples (GAE's reference log-probs and values included), a data-parallel rank its share of each
micro-batch, with the shares' advantages gathered before they are whitened; gradients are summed over the
data-parallel group only, each model clipped by the norm over every shard (the value head, whole on every rank,
counted once). The policy every rank publishes and the critic's values of fixed tokens then move as at 1 rank,
and are the same on every rank."""

from __future__ import annotations

import copy
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
RANK = Path(__file__).with_name("megatron_ppo_rank.py")
# tied embeddings (vocab-parallel at both ends; at pp 2 the policy's copy on the last stage, the critic's trunk
# none) with a replicated o_proj bias; grouped-query attention with an untied, vocab-parallel lm_head; Qwen3's
# q/k norms in the policy and the critic's trunk (their gradients summed over the tp group)
VARIANTS = ["llama-bias-tied", "llama-hd64-eos3", "qwen3-bias-hd32"]


def run(directory: Path, name: str, *, world: int, tp: int, pp: int) -> list[dict[str, Any]]:
    procs = spawn_ranks(
        RANK, world=world, tp=tp, pp=pp, rendezvous=directory / f"{name}.rendezvous",
        out=lambda r: directory / f"{name}-{r}.pt", checkpoints=[directory / v for v in VARIANTS],
        extra=(str(directory / "samples.pt"),),
    )  # fmt: skip
    errors = [p.communicate(timeout=360)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * world, "\n".join(e[-3000:] for e in errors)
    return [torch.load(directory / f"{name}-{r}.pt", weights_only=False) for r in range(world)]


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], dict[str, dict[str, Any]]]:
    """The checkpoints, two iterations of samples each, their start weights and the run at 1 rank."""
    require_megatron()
    directory = tmp_path_factory.mktemp("ppo")
    batches, start = {}, {}
    for v in VARIANTS:
        write_checkpoint(v, directory / v)
        model = TinyGPT.from_pretrained(directory / v)
        start[str(directory / v)] = {k: t.clone() for k, t in model.state_dict().items()}
        batches[str(directory / v)] = [copy.deepcopy(rollouts(model, prompts=3, group=4, seed=i)) for i in (0, 1)]
    torch.save(batches, directory / "samples.pt")
    (whole,) = run(directory, "whole", world=1, tp=1, pp=1)
    return directory, start, whole


@pytest.mark.timeout(400)
@pytest.mark.parametrize("tp,pp,dp", [(2, 1, 1), (1, 2, 1), (1, 1, 2)], ids=["tp2", "pp2", "dp2"])
def test_ppo_at_a_split_moves_the_policy_and_the_critic_as_at_one_rank(
    one_rank: tuple[Path, dict[str, Any], dict[str, dict[str, Any]]], tp: int, pp: int, dp: int
) -> None:
    directory, start, whole = one_rank
    ranks = run(directory, f"tp{tp}-pp{pp}-dp{dp}", world=tp * pp * dp, tp=tp, pp=pp)
    for c, want in whole.items():
        got = [r[c] for r in ranks]
        assert [g["dp"] for g in got] == ([[0, 1]] * 2 if dp == 1 else [[0, 2], [1, 2]])
        for g in got[1:]:  # every rank publishes the same policy and holds the same critic values and head
            assert all(torch.equal(g["weights"][k], got[0]["weights"][k]) for k in want["weights"]), c
            assert torch.equal(g["values"], got[0]["values"]) and all(map(torch.equal, g["head"], got[0]["head"]))
        for s, w in zip(got[0]["stats"], want["stats"], strict=True):
            for k in ("loss", "value_loss", "kl", "clip_frac"):
                assert s[k] == pytest.approx(w[k], abs=1e-5), (c, k)
            assert s["grad_norm"] == pytest.approx(w["grad_norm"], rel=1e-4)  # the norm over every shard
            assert s["tokens"] == w["tokens"]
        for k, w in want["weights"].items():  # the same update up to fp32 rounding (as test_megatron_tp_grpo)
            step = (w - start[c][k]).norm()
            assert step > 0, k
            tolerance = 5e-2 if k.endswith("k_proj.bias") else 2e-3
            assert (got[0]["weights"][k] - w).norm() <= tolerance * step, (c, k)
        # the critic started at 0 everywhere; its values after two steps (the trunk moved in the second)
        v, v1 = got[0]["values"], want["values"]
        assert v1.norm() > 0 and (v - v1).norm() <= 2e-3 * v1.norm(), c
        for h, h1 in zip(got[0]["head"], want["head"], strict=True):
            assert (h - h1).norm() <= 2e-3 * h1.norm(), c
