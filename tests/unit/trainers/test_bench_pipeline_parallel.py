"""`python -m bench pipeline-parallel --quick` runs its three schedules on real gloo ranks: the same cut's loss
in each (the chunked pipeline trains what one process does), the chunk count the planner prices, and a time
per schedule. Nothing about speed is asserted here: the benchmark reports it."""

from __future__ import annotations

from rlctl.rl.cuts import pipeline_chunks
from tests.conftest import bench_json
from tests.unit.trainers.megatron_required import require_megatron


def test_the_pipeline_benchmark_times_every_schedule_on_the_same_loss() -> None:
    require_megatron()
    r = bench_json("pipeline-parallel", timeout_s=300)
    assert r["chunks"] == pipeline_chunks(r["rows"], 2) == 4
    assert set(r["step_s"]) == {"pp1", "pp2_stage_by_stage", "pp2_chunked"}
    assert all(len(v) == r["repeats"] and min(v) > 0 for v in r["step_s_all"].values())
    assert r["loss_max_abs_diff"] == 0.0  # every schedule computed the cut's loss bit for bit alike
    # the planner's compute × (1 + (pp − 1)/m) over pp stages, against one stage's pp 1
    assert r["planned"] == {"pp2_chunked_over_pp1": (1 + 1 / 4) / 2, "pp2_stage_by_stage_over_pp1": 1.0}
