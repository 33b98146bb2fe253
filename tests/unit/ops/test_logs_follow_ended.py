"""`rlctl logs -f JOB AGENT` of an agent with no record in agents.jsonl (no site to ask whether it exited): followed
while the job runs, ended with one line once the job has (`rlctl.ops.operate.job_end`), versus followed until
Ctrl-C, also long after the job ended."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rlctl.launch.jobdir import JobDir
from rlctl.ops.jobdb import JobDB
from rlctl.ops.jobref import resolve
from rlctl.ops.operate import job_end
from tests.conftest import ROOT

GONE = {"pid": 2**22 + 1, "host": socket.gethostname()}  # a launcher of this machine that is gone


def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, state: str | None, launcher: dict | None = None) -> JobDir:
    """A job dir with trainer-0's log and no agents.jsonl; in this machine's index as `state` (None: not in it)."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("demo", explicit=tmp_path / "demo-1")
    jd.job_json.write_text(json.dumps({"source": "demo.yaml", "job": {"name": "demo"}}))
    jd.log("trainer", 0).write_text("t1\nt2\n")
    if state is not None:
        db = JobDB()
        try:
            db.put("demo-1", job_dir=str(jd.path), spec={"name": "demo"})
            db.update("demo-1", state=state, info={"launcher": launcher or GONE})
        finally:
            db.close()
    return jd


def test_following_an_agent_with_no_record_of_a_job_that_ended_shows_its_log_and_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job(tmp_path, monkeypatch, state="finished")
    # a process of its own: one that follows for good fails the test at the timeout rather than hang it
    cmd = [sys.executable, "-m", "rlctl", "logs", "-f", "demo-1", "trainer/0"]
    r = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "t1\nt2\n"
    assert r.stderr == "rlctl: job demo-1 ended (finished); trainer-0 has no agent record: its log ends here\n"


def test_a_job_ends_for_logs_as_its_record_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jd = job(tmp_path, monkeypatch, state="running")
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "rlctl", "launch"])
    db = JobDB()
    try:
        db.update("demo-1", info={"launcher": {"pid": launcher.pid, "host": socket.gethostname()}})
        ref = resolve("demo-1")  # once, as `logs -f` does: the row it holds is the job as it was then
        assert job_end(ref) is None  # its launcher watches it
        jd.summary_json.write_text(json.dumps({"state": "failed"}))
        assert job_end(ref) is None  # which may resume it (checkpoint.auto_resume)
        db.update("demo-1", info={"launcher": GONE})  # no launcher left to: the run's summary says the end
        assert job_end(ref) == "failed"
        jd.summary_json.unlink()  # a controller killed past the grace writes none: the index says the end
        db.update("demo-1", state="stopped")
        assert job_end(ref) == "stopped"  # its launcher (or the stop) recorded the end
    finally:
        db.close()
        launcher.kill()
        launcher.wait()


def test_a_job_not_in_the_index_ends_with_its_summary_unless_a_launcher_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jd = job(tmp_path, monkeypatch, state=None)
    assert job_end(resolve(str(jd.path))) is None  # no summary: it may run
    jd.summary_json.write_text(json.dumps({"state": "finished"}))
    with jd.launcher_lock():  # a `launch --resume` from another machine's index, say
        assert job_end(resolve(str(jd.path))) is None
    assert job_end(resolve(str(jd.path))) == "finished"


def test_following_the_launcher_log_of_a_job_not_in_the_index_ends_once_no_launcher_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rlctl logs DIR launcher -f` of a job the index lacks (a moved job dir): no recorded launcher to ask about,
    it was followed until Ctrl-C, long after the launcher ended. It ends once no launcher holds the job dir."""
    from rlctl.commands.logs import launcher_ended

    jd = job(tmp_path, monkeypatch, state=None)
    ref = resolve(str(jd.path))
    assert ref.row is None
    with jd.launcher_lock(), launcher_ended(ref) as ended:
        assert not ended()  # its launcher holds it: followed
    with launcher_ended(ref) as ended:
        assert ended()
