"""`bench paper`'s figures that are arithmetic on plans: the samples per cost unit of (b)."""

from __future__ import annotations

from typing import Any

import pytest

import bench.paper as paper


def _plan(*, samples: int, iteration_s: float, cost_units: float) -> dict[str, Any]:
    return {
        "samples_per_iteration": samples,
        "allocation": [{"role": "rollout", "gpus_used": 16}, {"role": "trainer", "gpus_used": 16}],
        "predicted": {"t_gen_s": 1.0, "t_train_s": 1.0, "iteration_s": {"async": iteration_s}},
        "cost": {"cost_units_per_iteration": cost_units},
    }


def test_samples_per_cost_unit_is_samples_per_iteration_over_cost_units_per_iteration(monkeypatch):
    plans = iter(
        [
            _plan(samples=1024, iteration_s=120.0, cost_units=2.0),  # the single-site deployment
            _plan(samples=1024, iteration_s=100.0, cost_units=1.6),  # the cross-datacenter one
        ]
    )
    monkeypatch.setattr(paper, "make_plan", lambda job, options: next(plans))
    (out,) = paper._cost_normalized(["5K"]).values()
    assert out["samples_per_cost_unit"] == {"single": pytest.approx(512.0), "cross": pytest.approx(640.0)}
    assert out["gain"] == pytest.approx(1.25)
