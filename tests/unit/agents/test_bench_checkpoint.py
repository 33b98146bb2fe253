"""`python -m bench checkpoint --quick` times a checkpoint written in the training thread against one snapshotted
and written beside training, on the hf-demo trainer's policy, and restores the background one; it times the
write on the writer's thread and counts as steps while writing only those inside the write. Nothing about speed
is asserted here: the benchmark reports it."""

from __future__ import annotations

import pytest

from bench.checkpoint import _inside, _timed
from tests.conftest import bench_json


def test_the_checkpoint_benchmark_restores_what_it_wrote_in_the_background() -> None:
    r = bench_json("checkpoint", timeout_s=300)
    (case,) = r["cases"].values()
    assert case["restored_exact"] is True
    assert len(case["sync_s_all"]) == len(case["blocked_s_all"]) == r["repeats"]
    assert min(case["sync_s_all"]) > 0 and min(case["blocked_s_all"]) > 0 and case["checkpoint_bytes"] > 0
    assert r["blocked_over_sync"] == case["blocked_over_sync"] > 0
    assert len(case["background_write_s_all"]) == r["repeats"] and min(case["background_write_s_all"]) > 0
    # steps alone are measured only as many as ran inside the writes: both figures or neither
    assert (case["step_s"] is None) == (case["step_s_while_writing"] is None) == (case["steps_while_writing"] == 0)


def test_only_the_steps_that_ran_inside_the_write_count_as_steps_while_writing():
    # the write ran from 10 to 20; the training thread saw it end only after the step in progress (19 → 25)
    steps = [(9.0, 11.0), (11.0, 14.0), (14.0, 19.0), (19.0, 25.0)]
    assert _inside(steps, 10.0, 20.0) == [3.0, 5.0]
    assert _inside(steps, 11.0, 14.0) == [3.0]  # both ends inclusive
    assert _inside(steps, 12.0, 13.0) == []  # a write shorter than a step: no step beside it all along


def test_the_write_is_timed_where_it_runs():
    ran: list[str] = []
    timed, span = _timed(lambda: ran.append("written"))
    assert span == [] and ran == []
    timed()
    assert ran == ["written"] and len(span) == 2 and span[0] <= span[1]

    def fails() -> None:
        raise OSError("disk full")

    timed, span = _timed(fails)
    with pytest.raises(OSError, match="disk full"):
        timed()
    assert len(span) == 2  # the writer keeps the error for the training thread; the time is still the write's
