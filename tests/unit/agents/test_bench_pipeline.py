"""`bench pipeline`'s ideal: what perfect overlap of generation and training gives, in steady state and over N."""

import pytest

from bench.pipeline import ideal_overlap


def test_steady_state_ideal_is_the_stage_sum_over_the_longer_stage() -> None:
    assert ideal_overlap(0.4, 0.2) == pytest.approx(1.5)
    assert ideal_overlap(0.3, 0.3) == pytest.approx(2.0)


def test_a_finite_run_pays_the_fill_and_drain_once() -> None:
    # 12 iterations of G 0.4 s, T 0.2 s: sync 12 × 0.6 = 7.2 s; async 12 × 0.4 + 0.2 = 5.0 s
    assert ideal_overlap(0.4, 0.2, 12) == pytest.approx(7.2 / 5.0)
    assert ideal_overlap(0.2, 0.4, 12) == pytest.approx(7.2 / 5.0)  # whichever stage is longer
    assert ideal_overlap(0.4, 0.2, 1) == pytest.approx(1.0)  # one iteration: nothing overlaps
    assert ideal_overlap(0.4, 0.2, 10**6) == pytest.approx(ideal_overlap(0.4, 0.2), rel=1e-5)
