"""`python -m bench pipeline-parallel --quick` runs its three schedules on real gloo ranks: the same cut's loss
in each (the chunked pipeline trains what one process does), the chunk count the planner prices, and a time
per schedule. Nothing about speed is asserted here: the benchmark reports it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.rl.cuts import pipeline_chunks
from tests.conftest import bench_json
from tests.unit.rank_end import probe_rank_ends
from tests.unit.trainers.megatron_required import require_megatron


def test_the_pipeline_benchmark_times_every_schedule_on_the_same_loss(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    require_megatron()
    ends = probe_rank_ends(monkeypatch, tmp_path, "bench.pipeline_parallel")
    r = bench_json("pipeline-parallel", timeout_s=300)
    # its ranks (pp 1: one, pp 2: two) ended without the interpreter's finalization, where a gloo thread freeing
    # the last all-reduce could abort a rank (-6) whose timings were written
    ran = sorted(p.name.partition("-")[0] for p in ends.iterdir())
    assert ran == ["rank"] * 3, ran
    assert r["chunks"] == pipeline_chunks(r["rows"], 2) == 4
    assert set(r["step_s"]) == {"pp1", "pp2_stage_by_stage", "pp2_chunked"}
    assert all(len(v) == r["repeats"] and min(v) > 0 for v in r["step_s_all"].values())
    assert r["loss_max_abs_diff"] == 0.0  # every schedule computed the cut's loss bit for bit alike
    # the planner's compute × (1 + (pp − 1)/m) over pp stages, against one stage's pp 1
    assert r["planned"] == {"pp2_chunked_over_pp1": (1 + 1 / 4) / 2, "pp2_stage_by_stage_over_pp1": 1.0}
