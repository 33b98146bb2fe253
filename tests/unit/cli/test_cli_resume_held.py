"""A `launch --resume` of a job whose launcher runs is refused before it does anything to the job dir: its
`--iterations` and `--checkpoint` fetched the controller site's record into it first (the launcher at work there),
and only then met the launcher lock."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.ops import operate
from tests.conftest import run_cli
from tests.unit.cli.test_cli_bad_input import home, one_error, prepared

__all__ = ["home"]  # (the fixture: RLCTL_HOME under tmp_path)


def test_a_resume_of_a_job_its_launcher_holds_is_refused_before_it_fetches_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jd = prepared(tmp_path / "run")
    fetched: list[Path] = []  # a controller on another site: each fetch of its record, recorded
    monkeypatch.setattr(operate, "record_view", lambda path: ("site", "host", "/w/jobs/run"))
    monkeypatch.setattr(operate, "fetch_record", lambda path, *view: fetched.append(path) or [])
    with jd.launcher_lock():  # (this process holds it, as the job's running launcher would)
        for given in (["--iterations", "400"], ["--checkpoint", "v1"], []):
            line = one_error(run_cli("launch", "--resume", str(jd.path), *given))
            assert f"job {jd.id} has a launcher already (pid " in line, given  # was: --checkpoint: no such checkpoint
    assert fetched == []  # was: fetched by --iterations, then refused by the lock
