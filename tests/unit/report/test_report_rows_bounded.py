"""A job of weeks has 10⁵ metrics rows and more, each a few kB of its agents' figures: the report held every one
parsed (some 31 kB a row of 64 agents: GBs) and drew a bar per agent and iteration. It holds at most REPORT_ROWS
rows: runs of consecutive iterations merged into one (`rlctl.reportrows.merged`), figures that read the same."""

from __future__ import annotations

import json
import struct
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from rlctl import reportrows
from rlctl.report import build_report, busy_fractions, busy_rows
from rlctl.reporthtml import job_rate
from rlctl.reportrecord import load
from tests.unit.report.fake_jobdir import make_job_dir

ROWS, AGENTS = 3000, 16


def _row(i: int) -> dict[str, Any]:
    """Iteration i: 2 s; every agent busy 1 s of it (busy seconds count on); the samples' rate 10 and 30 in turn."""
    busy = {"role": "rollout", "site": "h20", "busy_s": float(i + 1), "state": "running"}
    figures = {"reward_mean": i % 2, "t_gen_s": 1.0 + i % 3, "t_train_s": 1.0, "delta_s": i % 3, "period_s": 2.0}
    rate = 10.0 if i % 2 else 30.0
    agents = {f"rollout-{k}": dict(busy) for k in range(AGENTS)}
    return {"iteration": i, **figures, "samples_per_s": rate, "wall_s": 2.0 * (i + 1), "agents": agents}


def test_the_report_holds_at_most_report_rows_of_a_long_run_with_its_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reportrows, "REPORT_ROWS", 50)
    d = make_job_dir(tmp_path)
    with (d / "metrics.jsonl").open("w") as f:
        f.write("".join(json.dumps(_row(i)) + "\n" for i in range(ROWS)))
    size = (d / "metrics.jsonl").stat().st_size
    load(d)  # (the modules it imports the first time are no part of what it holds)
    tracemalloc.start()
    try:
        rec = load(d)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(rec.rows) == 50 and rec.iterations == ROWS and rec.merged == 60
    assert size > 4_000_000 and peak < size // 8, (size, peak)  # was every row parsed: ~6 × the file
    assert [r["iteration"] for r in rec.rows[:2]] == [59, 119] and rec.rows[-1]["iteration"] == ROWS - 1
    first = rec.rows[0]
    assert (first["period_s"], first["reward_mean"], first["t_gen_s"], first["delta_s"]) == (120.0, 0.5, 2.0, 1.0)
    assert job_rate(rec.rows, "samples_per_s") == 20.0  # the job's, as over every row
    fractions = busy_fractions(rec.rows)
    assert len(fractions) == AGENTS and {f for fs in fractions.values() for f in fs} == {0.5}
    page = build_report(d).html.read_text()
    assert "0.500 → 0.500 (iteration 59 → 2999, the mean of 60 up to each: no summary)" in page
    assert "each row: 60 iterations up to the one it names" in page and page.count("<tr><td>") <= 50 + 20


def test_the_busy_panel_of_a_run_of_hundreds_of_units_has_a_row_per_site_not_per_unit(tmp_path: Path) -> None:
    # units replaced and scaled for weeks: 122 rollout units came and went, 4 at a time, on two sites; a row per agent
    # the run ever had made the figure 0.25 inch taller for each (hundreds after weeks)
    d = make_job_dir(tmp_path)
    rows = []
    for i in range(240):
        live = range(2 * (i // 4), 2 * (i // 4) + 4)  # each unit for 8 iterations, busy 1.5 s of each 2 s
        since = {k: max(0, 4 * (k // 2 - 1)) for k in live}  # the iteration it joined at
        agents = {f"rollout-{k}": {"role": "rollout", "site": f"h{k % 2}", "busy_s": 1.5 * (i - since[k] + 1),
                                   "state": "running"} for k in live}  # fmt: skip
        agents["trainer-0"] = {"role": "trainer", "site": "h800", "busy_s": 1.0 * (i + 1), "state": "running"}
        rows.append({**_row(i), "agents": agents})
    with (d / "metrics.jsonl").open("w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    panel = busy_rows(load(d).rows)
    assert list(panel) == ["trainer on h800: 1 agents", "rollout on h0: 61 agents", "rollout on h1: 61 agents"]
    assert {f for fs in panel.values() for f in fs[1:]} == {0.5, 0.75}
    png = build_report(d).png.read_bytes()
    width, height = struct.unpack(">II", png[16:24])  # the PNG's IHDR
    assert height < 1200, (width, height)  # was 8.5 + 0.25 × 119 inches at 110 dpi: 4,207 px
