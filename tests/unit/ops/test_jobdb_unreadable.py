"""A job index that cannot be opened (no database, a directory in its place): a command that needs no index goes on
with one warning line naming the file and what to do; one that needs it says the same as its error."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rlctl.ops import jobdb
from tests.conftest import ROOT, run_cli
from tests.unit.cli.test_cli_bad_input import prepared

DEMO = ROOT / "jobs" / "demo.yaml"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("RLCTL_HOME", str(h))
    return h


def damage(home: Path, how: str) -> str:
    """jobs.db damaged `how`; the line's text after the path."""
    db = home / "jobs.db"
    if how == "garbage":
        db.write_text("not a database\n")
        return "cannot open the job index: file is not a database"
    db.mkdir()
    return "a directory, where the job index (a file) belongs"


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def aside(home: Path) -> str:
    return f"move it aside (mv {home / 'jobs.db'} {home / 'jobs.db.damaged'})"


@pytest.mark.parametrize("how", ["garbage", "directory"])
def test_status_of_a_job_directory_goes_on_without_an_index_that_cannot_be_opened(
    tmp_path: Path, home: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    # `rlctl status DIR` ended rc 1 on the index it does not need; jobs.db a directory: "unable to open database file"
    jd = prepared(tmp_path / "run")
    said = damage(home, how)
    r = run_cli("status", str(jd.path), "-o", "json")
    assert r.exit_code == 0 and not r.stderr, r.stderr
    (line,) = warnings(caplog)  # (said `rlctl: warning: …` by the CLI's handler)
    assert line.startswith(f"{home / 'jobs.db'}: {said}; {jd.path} is read without it"), line
    assert f"(hint: {aside(home)}" in line
    r = run_cli("status")  # the job launched last: the index is needed, and said so
    assert r.exit_code == 1 and r.stderr.startswith(f"rlctl: error: {home / 'jobs.db'}: {said} (hint: {aside(home)}")


def test_a_directory_in_the_index_place_is_named_with_what_to_do(home: Path) -> None:
    damage(home, "directory")
    said = r"jobs\.db: a directory, where the job index \(a file\) belongs$"
    with pytest.raises(jobdb.IndexUnreadable, match=said) as e:
        jobdb.JobDB()
    assert e.value.hint is not None and e.value.hint.startswith(aside(home))


def test_launch_dry_run_goes_on_without_an_index_that_cannot_be_opened(
    tmp_path: Path, home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    said = damage(home, "garbage")
    r = run_cli("launch", str(DEMO), "--dry-run", "--job-dir", str(tmp_path / "run"))
    assert r.exit_code == 0, r.stderr
    assert r.stdout.startswith("# 4 agents;")
    (line,) = warnings(caplog)
    assert line.startswith(f"{home / 'jobs.db'}: {said}; the job's id is taken as its directory's name, run ("), line
    assert not (tmp_path / "run").exists()
