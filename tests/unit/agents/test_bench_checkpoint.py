"""`python -m bench checkpoint --quick` times a checkpoint written in the training thread against one snapshotted
and written beside training, on the hf-demo trainer's policy, and restores the background one. Nothing about
speed is asserted here: the benchmark reports it."""

from __future__ import annotations

from tests.conftest import bench_json


def test_the_checkpoint_benchmark_restores_what_it_wrote_in_the_background() -> None:
    r = bench_json("checkpoint", timeout_s=300)
    (case,) = r["cases"].values()
    assert case["restored_exact"] is True
    assert len(case["sync_s_all"]) == len(case["blocked_s_all"]) == r["repeats"]
    assert min(case["sync_s_all"]) > 0 and min(case["blocked_s_all"]) > 0 and case["checkpoint_bytes"] > 0
    assert r["blocked_over_sync"] == case["blocked_over_sync"] > 0
