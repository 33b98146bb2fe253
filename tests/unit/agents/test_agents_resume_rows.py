"""A resumed controller's metrics rows (`cut_metrics` → `RowBook.add_kept`): counted one at a time as metrics.jsonl
is read and rewritten, so that a job of weeks, one row an iteration, holds its running totals only at a resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from rlctl.agents.ledger import Ledger
from rlctl.agents.rowbook import RowBook, job_start_offset
from rlctl.checkpoint.controller import save_controller
from rlctl.launch.agentenv import ENV_RESUME
from rlctl.launch.jobdir import JobDir
from tests.unit.controller_harness import HandledController, resumed_measured, small_job

JOB = small_job("rows", iterations=100_000)


def _jobs_with_rows(root: Path, *, iterations: tuple[int, ...]) -> list[JobDir]:
    """Jobs (one a count of `iterations`) whose metrics.jsonl holds a row for each of that many iterations, then 5
    rows past it (trained after the checkpoint: set aside), with their controller's checkpoint at that count."""
    h = HandledController(root / "made", JOB, listen="inproc://rows-made")
    h.close()
    jobs = []
    for n in iterations:
        jd = JobDir(Path(shutil.copytree(h.jd.path, root / f"job-{n}")))
        state = {"iteration": n, "ranker": {"tokens": [], "lengths": []}, "rebalance_window": []}
        save_controller(jd, n, state=state | {"samples_log_bytes": 0}, ledger=Ledger(), trainer_digest="d" * 64)
        with jd.metrics.open("w") as f:
            for i in range(n + 5):
                row = {"t": 2e6 + i, "iteration": i, "wall_s": 10.0 + i, "resumes": 0, "reward_mean": i % 7 / 7}
                row |= {"t_gen_s": 1.0 + i % 3, "t_train_s": 0.5, "delta_s": 0.5 + i % 3, "period_s": 1.0}
                f.write(json.dumps(row | {"staleness": {"0": 3, "1": i % 2}, "agents": {"rollout-0": {}}}) + "\n")
        jobs.append(jd)
    return jobs


def _state(book: RowBook) -> tuple[Any, ...]:
    return (book.kept, book.count, book.reward_curve, book.sums, book.counts, book.staleness, list(book.tail),
            list(book.pace), book.rate("period_s"), book.mean("delta_s"))  # fmt: skip


def test_a_resume_counts_the_metrics_rows_as_it_reads_them_and_keeps_the_same_totals(
    tmp_path: Path, monkeypatch
) -> None:
    """A job of 20,000 iterations resumed: the controller's resume takes no more memory than one of 200 past its
    running totals (the reward curve's floats), versus some 44 MB more: every metrics row before the checkpoint
    parsed into a list. What it keeps is what it kept before: the same totals, curve, last rows, job start offset
    and rows counted; metrics.jsonl keeps those rows, and the 5 past the checkpoint move to metrics.discarded.jsonl."""
    small, large = _jobs_with_rows(tmp_path, iterations=(200, 20_000))
    before = {jd: jd.read_lines(jd.metrics)[:-5] for jd in (small, large)}
    monkeypatch.setenv(ENV_RESUME, "200")
    small_ctl, small_peak = resumed_measured(small, JOB, listen="inproc://rows-small", monkeypatch=monkeypatch)
    monkeypatch.setenv(ENV_RESUME, "20000")
    large_ctl, large_peak = resumed_measured(large, JOB, listen="inproc://rows-large", monkeypatch=monkeypatch)
    for jd, ctl in ((small, small_ctl), (large, large_ctl)):
        rows = before[jd]
        assert _state(ctl.rows) == _state(RowBook(rows, kept=len(rows)))
        assert ctl.wall_offset_s == job_start_offset(rows, [], now=ctl.t_start_wall)
        assert jd.read_lines(jd.metrics) == rows
        assert [r["iteration"] for r in jd.read_lines(jd.path / "metrics.discarded.jsonl")] == [
            len(rows) + i for i in range(5)
        ]
        assert jd.read_events("resumed_from")[-1]["rows_kept"] == len(rows)
    curve_bytes = 19_800 * 32  # the large job's more floats in its reward curve, and their list's slots
    assert large_peak - small_peak < curve_bytes + 1_000_000, (small_peak, large_peak)


def test_a_damaged_metrics_row_leaves_the_files_as_they_were(tmp_path: Path) -> None:
    """A line that does not parse before the last: the cut says which (as before), and the rows read before it were
    written nowhere: metrics.jsonl as it was, no row set aside, no temporary file left."""
    from rlctl.checkpoint.controller import cut_metrics
    from rlctl.errors import LaunchError

    jd = JobDir(tmp_path)
    text = '{"iteration": 0}\n{"iteration": 5}\n{"iteration": 1, "re\n{"iteration": 2}\n'
    jd.metrics.write_text(text)
    with pytest.raises(LaunchError, match=r"metrics\.jsonl: line 3 is not valid JSON"):
        list(cut_metrics(jd, 2))
    assert jd.metrics.read_text() == text and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_the_file_of_the_rows_set_aside_is_named_on_disk_before_metrics_jsonl_loses_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cut makes metrics.discarded.jsonl: its directory is synced (its name durable) while metrics.jsonl still
    holds the rows it moved, versus only after the rename, where a power loss in between could keep the rename and
    not the new file's name — the rows past the checkpoint gone from both."""
    from rlctl.checkpoint import cut
    from rlctl.checkpoint.controller import cut_metrics

    jd = JobDir(tmp_path)
    jd.metrics.write_text("".join(json.dumps({"iteration": i}) + "\n" for i in range(4)))
    aside = tmp_path / "metrics.discarded.jsonl"
    seen: list[tuple[bool, int]] = []  # at each directory sync: the set-aside file there, metrics.jsonl's rows
    synced = cut.fsync_dir

    def fsync_dir(path: Path) -> None:
        seen.append((aside.is_file(), len(jd.metrics.read_text().splitlines())))
        synced(path)

    monkeypatch.setattr(cut, "fsync_dir", fsync_dir)
    assert [r["iteration"] for r in cut_metrics(jd, 2)] == [0, 1]
    assert seen[0] == (True, 4) and seen[-1] == (True, 2)
