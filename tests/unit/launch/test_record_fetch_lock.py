"""A job dir whose record-fetch lock cannot be opened (another user's job dir, a read-only mount; here a directory by
that name, as root may write anywhere): the fetch of the controller site's record is a LaunchError, one line naming
the lock, before the site is asked (`rlctl.launch.record._fetch_lock`), and `rlctl status` shows the job as its
dir has it, saying so in one warning; versus the OSError's traceback from the launcher's stop, end and summary writes
(which take a LaunchError of the fetch as a problem) and, from `status` and `stop`, a warning naming no lock
('[Errno 21] Is a directory: …', as if the controller's site had not answered)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.errors import LaunchError
from rlctl.launch import record, sitefs
from rlctl.launch.jobdir import JobDir
from rlctl.launch.record import FETCH_LOCK, SUMMARY_LOCK, fetch_record
from rlctl.ops import operate
from rlctl.ops.jobref import JobRef
from rlctl.ops.runstate import update_summary
from tests.conftest import run_cli
from tests.unit.cli.test_cli_bad_input import home, prepared
from tests.unit.launch.test_stage import _controller_site, local_site

__all__ = ["home"]  # (the fixture: RLCTL_HOME under tmp_path)

SAYS = "cannot open the lock of the job's record fetch ("
HINT = "the job's record is fetched into the job dir: look at its owner and permissions (`ls -la "


def test_a_fetch_lock_that_cannot_be_opened_is_one_line_before_the_site_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, site, root = _controller_site(tmp_path)
    (root / "summary.json").write_text(json.dumps({"run": "r1", "state": "done"}))
    (src / FETCH_LOCK).mkdir()
    asked: list[str] = []
    monkeypatch.setattr(sitefs.LocalFiles, "read_text", lambda _fs, path: asked.append(path))
    with pytest.raises(LaunchError) as fetch:  # was: IsADirectoryError
        fetch_record(src, site, "localhost", str(root))
    assert str(fetch.value).startswith(f"{src / FETCH_LOCK}: {SAYS}") and asked == []
    assert fetch.value.hint == f"{HINT}{src}`)"
    jd = JobDir(src)
    jd.write_json(jd.summary_json, {"run": "r1", "state": "done"})
    (src / SUMMARY_LOCK).mkdir()
    with pytest.raises(LaunchError, match="cannot open the lock of the job's summary") as write:  # the launcher's
        update_summary(jd, "r1", {"agent_exits": {"trainer-0": 0}})
    # its hint says why that lock is there, versus the fetch lock's ('the job's record is fetched into the job dir',
    # of a held-out figure's write)
    assert (
        write.value.hint
        == f"the job's summary is written in the job dir: look at its owner and permissions (`ls -la {src}`)"
    )


def test_status_of_a_job_dir_whose_fetch_lock_cannot_be_opened_shows_the_job_and_says_why_not_fetched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    jd = prepared(tmp_path / "run")
    site = local_site(tmp_path / "w")  # the controller's site, its job dir another than this one
    (tmp_path / "w").mkdir()
    monkeypatch.setattr(operate, "record_view", lambda _path: (site, "localhost", str(tmp_path / "w")))
    (jd.path / FETCH_LOCK).mkdir()
    r = run_cli("status", str(jd.path))
    assert r.exit_code == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout.startswith(f"Job {jd.id}\n"), r.stdout  # the job as its dir has it
    said = [m for m in caplog.messages if m.startswith(f"job {jd.id}: cannot fetch the record")]
    assert len(said) == 1 and f"{jd.path / FETCH_LOCK}: {SAYS}" in said[0], caplog.messages
    # where it failed (here, not the controller's site), and the lock's hint (was: 'from the controller's site', no
    # hint)
    assert said[0].startswith(f"job {jd.id}: cannot fetch the record into its job dir here: {jd.path / FETCH_LOCK}: ")
    assert said[0].endswith(f"(hint: {HINT}{jd.path}`))"), said[0]


def _fetched_from_a_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[JobDir, Path]:
    """A prepared job whose controller keeps its record in a site job dir of its own (holding a controller.json)."""
    jd = prepared(tmp_path / "run")
    site = local_site(tmp_path / "w")
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "controller.json").write_text(json.dumps({"address": "tcp://127.0.0.1:1"}))
    monkeypatch.setattr(operate, "record_view", lambda _path: (site, "localhost", str(tmp_path / "w")))
    return jd, tmp_path / "w"


def test_a_fetch_that_cannot_write_the_job_dir_here_says_so_not_the_controllers_site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Another user's job dir (here as root: its writes refused as they would be): the warning said 'cannot fetch
    the record from the controller's site', whose record had been read."""
    jd, _ = _fetched_from_a_site(tmp_path, monkeypatch)

    def refused(path: Path, text: str) -> None:
        raise PermissionError(13, "Permission denied", str(path.with_name(f".{path.name}.1-2.tmp")))

    monkeypatch.setattr(record, "replace_text", refused)
    assert operate.fetch_job_record(JobRef(jd.id, jd, None)) == []
    tmp = jd.path / ".controller.json.1-2.tmp"
    assert caplog.messages == [
        f"job {jd.id}: cannot fetch the record into its job dir here: [Errno 13] Permission denied: '{tmp}' "
        f"(hint: look at its owner and permissions (`ls -la {jd.path}`))"
    ]


def test_a_fetch_that_the_controllers_site_fails_names_the_site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    jd, w = _fetched_from_a_site(tmp_path, monkeypatch)

    def unreachable(_fs: sitefs.LocalFiles, path: str) -> str:
        raise LaunchError("ssh rl@h20-01:22: cannot connect: timed out", hint="is the host up?")

    monkeypatch.setattr(sitefs.LocalFiles, "read_text", unreachable)
    assert operate.fetch_job_record(JobRef(jd.id, jd, None)) == []
    assert caplog.messages == [
        f"job {jd.id}: cannot fetch the record from the controller's site (localhost:{w}): "
        "ssh rl@h20-01:22: cannot connect: timed out (hint: is the host up?)"
    ]
