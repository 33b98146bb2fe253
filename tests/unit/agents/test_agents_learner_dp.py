"""The streaming learner's cuts over data-parallel ranks: each rank's share of a cut keeps to the budgets
(`batch.train_micro_batch_samples` / `train_micro_batch_tokens` are a rank's), and the ranks' gradients sum to the
one-rank learner's (the loss is a weighted token sum: the cuts do not change it)."""

import random

import pytest
import torch

import rlctl.rl.learner as learner_mod
from rlctl.config.algorithm import GrpoAlgorithm, PpoAlgorithm
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.cuts import cut_lengths, share_slice
from rlctl.rl.ppo import PpoLearner
from rlctl.rl.samples import Sample, TokenBatch, make_batch, row_tokens
from rlctl.trainers.base import DataParallel
from tests.unit.agents.test_agents_learner import SMALL, batch, twin

ROWS, BUDGET = 4, 48  # a rank's rows and padded tokens a cut (rows of 4 to 43 tokens: 1 to 4 a share)


def _trained(
    monkeypatch: pytest.MonkeyPatch, base: TinyGPT, samples: list[Sample], dp: DataParallel
) -> tuple[list[list[int]], dict[str, torch.Tensor]]:
    """The rows (their tokens) of each share `dp`'s rank trained as the samples streamed in, and its summed
    gradients before the step (`make_batch` is what `backward_share` builds a rank's share with)."""
    shares: list[list[int]] = []

    def recorded(part: list[Sample], adv: list[float]) -> TokenBatch:
        shares.append([row_tokens(s) for s in part])
        return make_batch(part, adv)

    monkeypatch.setattr(learner_mod, "make_batch", recorded)
    model = twin(base)
    learner = learner_mod.StreamingLearner(
        model,
        GrpoAlgorithm(kind="grpo"),
        group_size=4,
        micro_batch_samples=ROWS,
        micro_batch_tokens=BUDGET,
        data_parallel=dp,
    )
    for s in samples:
        learner.add(s)
        learner.train_ready()
    learner.train_ready(flush=True)
    return shares, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_each_ranks_share_keeps_to_the_budget_and_the_ranks_sum_the_one_rank_gradient(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two data-parallel ranks, 4 rows and 48 padded tokens a rank: every cut gives each rank a share within them
    (two ranks each train a share of every cut but a short last one), and the two ranks' gradients sum to those of
    one rank training every row. Before the budgets were a rank's (2026-12-07) they bounded the whole cut: a cut of
    one 43-token row left rank 1 nothing to train."""
    torch.manual_seed(0)
    base = TinyGPT(SMALL)
    samples = batch(base, random.Random(1), prompts=5, group=4)
    one, whole = _trained(monkeypatch, base, samples, DataParallel())
    ranks = [_trained(monkeypatch, base, samples, DataParallel(r, 2)) for r in range(2)]
    rows = [row_tokens(s) for s in samples]
    for shares, _ in [(one, whole), *ranks]:
        for share in shares:
            assert len(share) <= ROWS and (len(share) * max(share) <= BUDGET or len(share) == 1)
    (shares0, grads0), (shares1, grads1) = ranks
    # a cut holds 2 rows at least but where it is the flush's last: rank 1 trains a share of every other one
    assert len(shares0) - len(shares1) <= 1 and len(shares0) < len(one)
    assert sorted(r for s in shares0 + shares1 for r in s) == sorted(rows)
    assert any(len(s) * max(s) > BUDGET for s in (shares0[i] + shares1[i] for i in range(len(shares1))))
    for name, g in whole.items():
        torch.testing.assert_close(grads0[name] + grads1[name], g, atol=1e-6, rtol=1e-5, msg=name)


def test_a_ppo_ranks_cuts_are_its_shares_of_cuts_over_the_ranks() -> None:
    """PPO cuts the whole batch at the step (`PpoLearner._cuts`): a rank's rows of each cut over its dp ranks, each
    share within the rank's budgets."""
    torch.manual_seed(0)
    base = TinyGPT(SMALL)
    samples = batch(base, random.Random(1), prompts=5, group=4)
    rows = [row_tokens(s) for s in samples]
    cfg = PpoAlgorithm(kind="ppo")
    mine = [
        PpoLearner(
            twin(base), cfg, micro_batch_samples=ROWS, micro_batch_tokens=BUDGET, data_parallel=DataParallel(r, 2)
        )._cuts(samples)
        for r in range(2)
    ]
    cuts = cut_lengths(rows, ROWS, max_tokens=BUDGET, ranks=2)
    shares = [
        [c[share_slice([rows[i] for i in c], ROWS, max_tokens=BUDGET, ranks=2, rank=r)] for c in cuts] for r in (0, 1)
    ]
    assert mine == [[(s, 1.0) for s in rank if s] for rank in shares]  # (whole replicas: no weight-0 rows)
    assert [i for c in zip(*shares, strict=True) for s in c for i in s] == [i for c in cuts for i in c]  # runs in order
    for share, _ in mine[0] + mine[1]:
        assert len(share) <= ROWS and (len(share) * max(rows[i] for i in share) <= BUDGET or len(share) == 1)
    assert len(mine[1]) >= len(cuts) - 1
