"""The cuts the planner prices a trainer step by (`costs.step_cuts`) are those the learner makes (`rlctl.rl.cuts`):
rows in length order, each data-parallel rank's share of a cut (every dp-th row) `train_micro_batch_samples` rows
and no more padded tokens than `train_micro_batch_tokens`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rlctl.hardware import CATALOG
from rlctl.models.catalog import BUILTIN_MODELS
from rlctl.planner.costs import (
    TRAIN_STEP_OVERHEAD_S,
    TrainWorkload,
    dp_reduced_bytes,
    step_cuts,
    train_compute_s,
    train_time_s,
)
from rlctl.planner.inputs import length_model, profile_for, train_cost
from rlctl.planner.plan import train_workload
from rlctl.profiler.analytical import analytical_profile
from rlctl.profiler.traincost import TrainingPasses
from rlctl.rl.cuts import cut_lengths, share_slice
from tests.unit.ops.test_preflight import gpu_job

P7 = BUILTIN_MODELS["qwen2.5-7b"].params


def learner_cuts(rows: list[float], size: int, max_tokens: int | None, *, ranks: int = 1) -> tuple[int, int]:
    """(cuts, rows of the largest) as the learner cuts `rows` over `ranks` (`rlctl.rl.cuts.cut_lengths`)."""
    cuts = cut_lengths(rows, size, max_tokens=max_tokens, ranks=ranks)
    return len(cuts), max(len(c) for c in cuts)


def test_a_steps_cuts_are_the_learners_of_its_rows() -> None:
    """64 rows of 200 to 6,086 tokens in cuts of 32 rows and 8,192 padded tokens: the learner cuts them 1 to 10
    rows a cut, 36 cuts (2 by rows alone); the planner counts the same, from the rows or, without them, from their mean
    (3,000 tokens: 2 rows a cut, 32 cuts); at dp 4, each rank's share so: 9 cuts of up to 22 rows."""
    rows = [200.0 + (i * 2909) % 6300 for i in range(64)]
    w = TrainWorkload(sum(rows), 64, 32, 4 * P7, micro_batch_tokens=8192, row_tokens=tuple(rows))
    assert step_cuts(w) == learner_cuts(rows, 32, 8192) == (36, 10)
    assert step_cuts(dataclasses.replace(w, micro_batch_tokens=None)) == learner_cuts(rows, 32, None) == (2, 32)
    mean = TrainWorkload(64 * 3000.0, 64, 32, 4 * P7, micro_batch_tokens=8192)
    assert step_cuts(mean) == learner_cuts([3000.0] * 64, 32, 8192) == (32, 2)
    assert step_cuts(w, dp=4) == learner_cuts(rows, 32, 8192, ranks=4) == (9, 22)
    assert step_cuts(mean, dp=4) == learner_cuts([3000.0] * 64, 32, 8192, ranks=4) == (8, 8)
    # the token shares of each cut size add up to the step's
    assert sum(cut.share for cut in w.cuts_at(1).sizes) == pytest.approx(1.0)


def test_the_plan_prices_the_cuts_the_learner_makes_of_the_jobs_rows(tmp_path: Path) -> None:
    """A 7B job of 1,024 rows at 3,262 tokens at the median (512 prompt + 2,750 output), cuts of 32 rows and the
    default 8,192 padded tokens: at dp 1 the learner makes 604 cuts of 1 to 9 rows of the plan's length quantiles,
    which the planner priced as 32 cuts of 32 rows (the budget unpriced); the budgets being a rank's, at dp 16 it makes
    38 cuts of up to 105 rows (604 of 1 to 9 before 2026-12-07; 39 of up to 95 while a rank took every 16th row)."""
    job = gpu_job(tmp_path, trainer_gpus=16, backend="torch")
    batch = job.spec.batch
    assert (batch.samples_per_iteration, batch.train_micro_batch_samples, batch.train_micro_batch_tokens) == (
        1024,
        32,
        8192,
    )
    lm = length_model(job)
    rows = (lm.quantiles(1024) + lm.prompt_tokens).tolist()
    w = train_workload(job, job.spec.model.arch, train_cost(job, profile_for(job, None), TrainingPasses()), tokens=1e6)
    assert step_cuts(w) == learner_cuts(rows, 32, 8192) == (604, 9)
    assert step_cuts(w, dp=16) == learner_cuts(rows, 32, 8192, ranks=16) == (38, 105)


def test_the_budgets_are_each_ranks_so_every_rank_computes_and_fsdp2_reduces_once_a_cut() -> None:
    """64 rows of 3,000 tokens at 8,192 padded tokens and 32 rows a rank: at dp 8 a cut holds 16 rows, 2 a rank
    (`rlctl.rl.cuts.cut_lengths`), so every rank computes every cut: the compute of cuts by rows alone, 1/8 of the
    step's. Until the budgets were a rank's (2026-12-07) a cut held 2 rows whatever the dp, so 2 of 8 ranks computed:
    4 × that. FSDP2 reducing in every backward reduce-scatters 4 times a step (32 before), 1 by rows alone."""
    site = analytical_profile(BUILTIN_MODELS["qwen2.5-7b"], {"h": (CATALOG["H800"], 8, 2.85)}).sites["h"]
    (e,) = [x for x in site.training if (x.tp, x.pp) == (1, 1)]
    rows = (3000.0,) * 64
    budget = TrainWorkload(sum(rows), 64, 32, 0.0, micro_batch_tokens=8192, row_tokens=rows)
    by_rows = dataclasses.replace(budget, micro_batch_tokens=None)

    def compute_s(w: TrainWorkload) -> float:
        return train_time_s(e, 8, w, site=site, node_bytes_per_s=50e9) - TRAIN_STEP_OVERHEAD_S

    assert compute_s(by_rows) == pytest.approx(sum(rows) * e.gpu_s_per_token / 8)
    assert compute_s(budget) == pytest.approx(compute_s(by_rows))
    assert step_cuts(budget, dp=8) == learner_cuts(list(rows), 32, 8192, ranks=8) == (4, 16)
    assert step_cuts(budget) == (32, 2)  # at dp 1 the cut is the rank's share
    grads = dataclasses.replace(budget, grad_bytes=4 * P7)
    assert dp_reduced_bytes(grads, tp=1, pp=1, dp=8, fsdp=True) == 4 * 4 * P7
    assert dp_reduced_bytes(dataclasses.replace(grads, micro_batch_tokens=None), tp=1, pp=1, dp=8, fsdp=True) == (
        4 * P7
    )


def test_a_cut_is_priced_at_its_busiest_ranks_padded_tokens() -> None:
    """7 rows of 10 tokens and 1 of 100, 4 rows a rank: the learner pads each rank's share to its longest row, so at dp
    2 rank 0 computes 4 × 10 tokens and rank 1 4 × 100, the step waiting for rank 1: 400 tokens' time, where the
    planner priced the cut's 170 real tokens over 2 ranks (85); at dp 1 the two cuts pad to 40 + 400 (170 priced)."""
    site = analytical_profile(BUILTIN_MODELS["qwen2.5-7b"], {"h": (CATALOG["H800"], 8, 2.85)}).sites["h"]
    (e,) = [x for x in site.training if (x.tp, x.pp) == (1, 1)]
    rows = (10.0,) * 7 + (100.0,)
    w = TrainWorkload(sum(rows), 8, 4, 0.0, row_tokens=rows)
    learner = [
        sum(rows[i] for i in cut[share_slice([rows[i] for i in cut], 4, ranks=2, rank=r)])
        for r in range(2)
        for cut in cut_lengths(list(rows), 4, ranks=2)
    ]  # (each share's real tokens: 40 and 130)
    assert learner == [40.0, 130.0]

    assert train_compute_s(e, 2, w) == pytest.approx(400 * e.gpu_s_per_token)
    assert train_compute_s(e, 1, w) == pytest.approx(440 * e.gpu_s_per_token)
    # every row one length: nothing pads, the ranks split a cut evenly
    even = dataclasses.replace(w, row_tokens=(17.0,) * 8, tokens=136.0)
    assert train_compute_s(e, 2, even) == pytest.approx(68 * e.gpu_s_per_token)


def test_the_plan_prices_padding_without_a_token_budget(tmp_path: Path) -> None:
    """The rows' lengths are the plan's length quantiles with or without `train_micro_batch_tokens` (until 2026-12-08
    only with it: rows only, every row the mean and nothing padded)."""
    job = gpu_job(tmp_path, trainer_gpus=16, backend="torch")
    spec = job.spec.model_copy(update={"batch": job.spec.batch.model_copy(update={"train_micro_batch_tokens": None})})
    job.spec = spec
    lm = length_model(job)
    w = train_workload(job, job.spec.model.arch, train_cost(job, profile_for(job, None), TrainingPasses()), tokens=1e6)
    assert w.row_tokens == tuple((lm.quantiles(1024) + lm.prompt_tokens).tolist())
    # sorted cuts of 32 rows pad each to its longest row: more than the real tokens, less than all at the longest
    (cut,) = w.cuts_at(1).sizes
    assert 1.0 < cut.busiest < max(w.row_tokens) * len(w.row_tokens) / sum(w.row_tokens)
