"""A directory where a job dir's job.json goes: `rlctl status|report DIR` say it is a directory, versus 'missing'
(or 'not a job directory (no job.json)' where the job dir had no plan.json)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.errors import UsageError
from rlctl.launch.jobdir import JobDir
from rlctl.ops.jobdb import JobDB
from rlctl.ops.jobref import resolve
from rlctl.report import build_report
from tests.conftest import run_cli


@pytest.mark.parametrize("planned", [True, False])
def test_a_directory_where_job_json_goes_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planned: bool
) -> None:
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    d = tmp_path / "job1"
    (d / "job.json").mkdir(parents=True)
    if planned:
        (d / "plan.json").write_text("{}")
    said = f"{d / 'job.json'}: a directory, where the job's resolved job (a file, written with its plan.json) goes"
    for read in (lambda: build_report(d), lambda: resolve(str(d), db=JobDB(tmp_path / "home" / "jobs.db"))):
        with pytest.raises(UsageError) as e:
            read()
        assert str(e.value) == said and e.value.hint == "move it aside and put the job dir's job.json back from a copy"
    r = run_cli("status", str(d))  # (before: 'never started: the job is prepared (its job.json and plan.json)')
    assert r.exit_code == 2 and r.stderr.startswith(f"rlctl: error: {said} (hint: "), r.stderr
    with pytest.raises(UsageError, match=r"; nothing to pull$"):
        JobDir(d).refuse_lost_job_json(nothing="nothing to pull")


@pytest.mark.parametrize("by", ["name", "id"])
def test_a_job_looked_up_in_the_index_whose_job_json_is_a_directory_is_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, by: str
) -> None:
    # by its name or id the index gives its job dir, and status said 'never started: the job is prepared (its
    # job.json and plan.json)'
    from tests.unit.job_rows import indexed_row

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    d = tmp_path / "job1"
    (d / "job.json").mkdir(parents=True)
    (d / "plan.json").write_text("{}")
    indexed_row("job1-id", d, job="job1", state="failed")
    r = run_cli("status", "job1" if by == "name" else "job1-id")
    said = f"{d / 'job.json'}: a directory, where the job's resolved job (a file, written with its plan.json) goes"
    assert r.exit_code == 2 and r.stderr.startswith(f"rlctl: error: {said}"), r.stderr
