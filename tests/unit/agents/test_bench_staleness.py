"""`bench staleness`'s figures from a ledger: the share of a run when every unit was idle, the long tail's share of
each iteration's generation, and the job each configuration runs."""

from __future__ import annotations

import pytest

from bench.staleness import CONFIGS, _job, all_idle, tail_share


def _e(it: int, t0: float, t1: float) -> dict:
    return {"iteration": it, "dispatched_at": t0, "finished_at": t1}


def test_all_idle_is_the_share_of_the_run_no_sample_was_in_flight():
    # in flight over [0, 4] and [6, 10] (overlapping spans merge): idle 2 s of 10
    ledger = [_e(0, 0, 3), _e(0, 1, 4), _e(1, 6, 10), _e(1, 7, 8)]
    assert all_idle(ledger) == pytest.approx(0.2)
    assert all_idle([]) == 0.0


def test_tail_share_is_the_time_after_the_90_percent_finish_over_the_generation_span():
    # iteration 1: dispatched at 10, 10 samples finish at 11 … 19 and one straggler at 30: the tail is 30 − 19
    ledger = [_e(0, 0, 1)] + [_e(1, 10, 11 + k) for k in range(9)] + [_e(1, 10, 30)]
    assert tail_share(ledger, skip=1) == pytest.approx((30 - 19) / 20)


def test_each_configuration_runs_its_mode_staleness_and_migration():
    for name, (mode, eta, migrate) in CONFIGS.items():
        job = _job(mode, eta, migrate, seed=2, iterations=5, quick=True)
        assert job["pipeline"]["mode"] == mode and job["rollout"]["migrate"] is migrate, name
        assert job["pipeline"].get("staleness", 0) == eta and (job["seed"], job["iterations"]) == (2, 5)
