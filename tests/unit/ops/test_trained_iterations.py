"""How many iterations a job trained (`rlctl.ops.extend.trained_iterations`), which `launch --resume` reads to
bound `--iterations` and to tell a finished job from one with iterations left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.checkpoint.controller import cut_metrics
from rlctl.launch.jobdir import JobDir
from rlctl.ops.extend import trained_iterations


def _job(tmp_path: Path, rows: int) -> JobDir:
    jd = JobDir.create("ti", explicit=tmp_path / "ti")
    jd.metrics.write_text("".join(json.dumps({"iteration": i, "reward_mean": 0.5}) + "\n" for i in range(rows)))
    return jd


def test_the_count_is_read_from_the_metrics_end_not_every_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every row was parsed to find the largest iteration (10⁴ and more after weeks, at each `launch --resume`)
    jd = _job(tmp_path, 5000)
    parsed: list[str] = []
    loads = json.loads
    monkeypatch.setattr(json, "loads", lambda s, *a, **k: parsed.append(s) or loads(s, *a, **k))
    assert trained_iterations(jd) == 5000
    assert len([s for s in parsed if "reward_mean" in str(s)]) <= 2


def test_after_a_resume_cut_the_last_row_is_the_count(tmp_path: Path) -> None:
    # 30 trained, resumed from v10 (rows 10… set aside), 5 more trained: 15, not the 30 the rows set aside said
    # (the rows appended after the cut end at 14 whether or not it was made: the count after the cut, and the rows,
    # say it was; without them this test passed with the cut left out)
    jd = _job(tmp_path, 30)
    list(cut_metrics(jd, 10))  # (read to its end: the cut is made)
    assert trained_iterations(jd) == 10
    for i in range(10, 15):
        jd.append(jd.metrics, {"iteration": i, "reward_mean": 0.5})
    assert trained_iterations(jd) == 15
    assert [r["iteration"] for r in jd.read_lines(jd.metrics)] == list(range(15))
    with jd.metrics.open("a") as f:
        f.write('{"iteration": 15, "rew')  # its writer in the middle of the row: passed over
    assert trained_iterations(jd) == 15


def test_a_last_row_without_a_number_for_its_iteration_falls_back_to_every_row(tmp_path: Path) -> None:
    jd = _job(tmp_path, 12)
    jd.append(jd.metrics, {"iteration": None, "reward_mean": 0.5})  # edited by hand
    assert trained_iterations(jd) == 12
    jd.summary_json.write_text(json.dumps({"iterations": 20}))  # the controller's summary says more
    assert trained_iterations(jd) == 20
    assert trained_iterations(JobDir.create("none", explicit=tmp_path / "none")) == 0
