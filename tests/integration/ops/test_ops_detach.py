"""A launcher that outlives its terminal: `rlctl launch --detach` returns once the job runs and a launcher in the
background ends it (record, index state, summary in its log); an attached launcher whose terminal goes away (a real
pseudo-terminal closed: the kernel's SIGHUP) keeps watching its job to the end."""

from __future__ import annotations

import json
import os
import pty
import signal
import sys
import time
from pathlib import Path

import pytest

from rlctl.launch.jobdir import JobDir
from rlctl.ops.detach import HEADER, LOG_NAME

from .conftest import REPO, job_yaml, metrics_rows, processes_mentioning, rlctl, rlctl_json, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]
LOCAL = str(REPO / "clusters" / "local.yaml")


def alive(pid: int) -> bool:
    """Whether process `pid` runs: a detached launcher's parent has exited, so when it ends it may stay a zombie
    until this machine's init reaps it (in a container whose init does not: for good)."""
    try:
        return (Path(f"/proc/{pid}") / "stat").read_text().rsplit(") ", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def index_row(job_id: str) -> dict[str, str]:
    code, rows = rlctl_json("status", "--all")
    assert code == 0, rows
    return dict(next(r for r in rows if r["id"] == job_id))


def index_state(job_id: str) -> str:
    return index_row(job_id)["state"]


def test_a_detached_launch_returns_while_its_job_runs_and_its_background_launcher_ends_it(tmp_path):
    job = job_yaml(tmp_path / "detached.yaml", inventory=[LOCAL], trainer="local", rollout="local", iterations=20)
    job_dir = tmp_path / "run"
    code, started = rlctl_json("launch", str(job), "--job-dir", str(job_dir), "--detach", timeout_s=180)
    assert code == 0, started
    job_id, pid = started["id"], started["launcher_pid"]
    assert started["job_dir"] == str(job_dir) and started["launcher_log"] == str(job_dir / "logs" / LOG_NAME)
    assert processes_mentioning(str(job_dir))  # the job runs: this command has returned

    # a second launcher of the same job is refused, and shows only its own lines (not the first one's log)
    again = rlctl("launch", "--resume", job_id, "--detach", timeout_s=120)
    assert again.returncode == 2, again.stderr
    assert again.stderr.strip().splitlines() == [  # the job's one launcher holds its lock
        f"rlctl: error: job {job_id} has a launcher already (pid {pid} on {os.uname().nodename}) (hint: watch it "
        f"with `rlctl status {job_id}`; `rlctl stop {job_id}` ends it)"
    ]

    code, st = rlctl_json("status", job_id)
    if st.get("source") == "controller":  # unless the job ended already on a fast machine
        assert st["launcher"].endswith(", watching"), st["launcher"]
        assert index_state(job_id) == "running"

    # `logs JOB launcher -f` follows the background launcher's log until that launcher exits
    follow = rlctl("logs", job_id, "launcher", "-f", "-n", "1000", timeout_s=300)
    assert follow.returncode == 0, follow.stderr
    assert "ledger" in follow.stdout and "lost 0 duplicated 0" in follow.stdout, follow.stdout[-2000:]
    assert not alive(pid)
    summary = json.loads((job_dir / "summary.json").read_text())
    assert summary["state"] == "done" and len(metrics_rows(job_dir)) == 20
    row = index_row(job_id)
    assert row["state"] == "finished"  # the background launcher recorded the end
    assert row["launcher"] == f"pid {pid} on {os.uname().nodename}, ended"
    code, st = rlctl_json("status", job_id)
    assert st["launcher"].endswith(f"pid {pid} on {os.uname().nodename}, ended"), st["launcher"]
    assert processes_mentioning(str(job_dir)) == []


def test_a_launcher_whose_terminal_goes_away_keeps_watching_its_job(tmp_path):
    job = job_yaml(tmp_path / "hangup.yaml", inventory=[LOCAL], trainer="local", rollout="local", iterations=20)
    job_dir = tmp_path / "run"
    pid, terminal = pty.fork()
    if pid == 0:  # the launcher, attached to a pseudo-terminal as in an operator's SSH session
        os.execv(sys.executable, [sys.executable, "-m", "rlctl", "launch", str(job), "--job-dir", str(job_dir)])
    shown = b""
    try:
        deadline = time.monotonic() + 240
        while len(metrics_rows(job_dir)) < 3:  # the live line on the terminal; two iterations trained
            try:
                shown += os.read(terminal, 65536)
            except OSError:
                break
            assert time.monotonic() < deadline, shown[-2000:]
    finally:
        os.close(terminal)  # the terminal goes away: the kernel sends SIGHUP to the launcher
    assert b"iter " in shown  # it was drawing its live line there
    ended: list[int] = []

    def launcher_ended() -> bool:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got == pid:
            ended.append(status)
        return bool(ended)

    wait_for("the launcher to end", launcher_ended, 300)
    assert os.WIFEXITED(ended[0]) and os.WEXITSTATUS(ended[0]) == 0, ended  # not killed by the SIGHUP
    log = (job_dir / "logs" / LOG_NAME).read_text()
    head, first = log.splitlines()[:2]  # its header (the log is every launcher's), then its first line there
    assert (m := HEADER.match(head)) is not None and m["how"] == "in a terminal", head
    assert "the terminal went away (SIGHUP); this launcher keeps watching the job" in first
    assert "\x1b[" not in log  # plain lines from then on, not the terminal's live frames
    assert "lost 0 duplicated 0" in log, log[-2000:]
    summary = json.loads((job_dir / "summary.json").read_text())
    assert summary["state"] == "done" and len(metrics_rows(job_dir)) == 20
    assert index_state(JobDir(job_dir).id) == "finished"
    assert processes_mentioning(str(job_dir)) == []


def test_a_job_whose_launcher_died_is_attached_and_watched_to_its_end(tmp_path):
    job = job_yaml(tmp_path / "orphan.yaml", inventory=[LOCAL], trainer="local", rollout="local", iterations=60)
    job_dir = tmp_path / "run"
    code, started = rlctl_json("launch", str(job), "--job-dir", str(job_dir), "--detach", timeout_s=180)
    assert code == 0, started
    job_id, first = started["id"], started["launcher_pid"]
    os.kill(first, signal.SIGKILL)  # its machine rebooted, say: the job runs on, nobody watches it
    wait_for("the launcher to be gone", lambda: not alive(first), 30)
    code, st = rlctl_json("status", job_id)
    if st.get("source") == "controller":  # unless the job ended already on a fast machine
        assert st["launcher"].endswith(
            ", gone: nothing watches the job (`rlctl attach` watches it again; `rlctl status` reads its end)"
        )

    code, attached = rlctl_json("attach", job_id, "--detach", timeout_s=120)
    assert code == 0, attached
    second = attached["launcher_pid"]
    assert second != first and attached["job_dir"] == str(job_dir)
    again = rlctl("attach", job_id)  # one launcher at a time: two would both resume a failed run
    assert again.returncode == 2, again.stderr
    if f"job {job_id} ended (finished)" not in again.stderr:  # unless the job ended already on a fast machine
        assert f"job {job_id} has a launcher (pid {second} on " in again.stderr, again.stderr

    follow = rlctl("logs", job_id, "launcher", "-f", "-n", "1000", timeout_s=300)
    assert follow.returncode == 0, follow.stderr
    assert "job orphan: attached to controller-0" in follow.stdout, follow.stdout[-2000:]  # both launchers' lines
    assert "lost 0 duplicated 0" in follow.stdout, follow.stdout[-2000:]
    summary = json.loads((job_dir / "summary.json").read_text())
    assert summary["state"] == "done" and len(metrics_rows(job_dir)) == 60
    row = index_row(job_id)
    assert row["state"] == "finished" and row["launcher"] == f"pid {second} on {os.uname().nodename}, ended"
    ended = rlctl("attach", job_id)
    assert ended.returncode == 2 and f"job {job_id} ended (finished): nothing to watch" in ended.stderr, ended.stderr
    assert processes_mentioning(str(job_dir)) == []


def test_a_copy_of_a_running_job_s_dir_is_not_resumed_and_a_stop_of_it_stops_the_original(tmp_path):
    """`cp -r` of a running job's dir (a backup, an rsync): `launch --resume COPY` started a second run of the job
    over the same site job dirs (the id the copy shares); now refused in one line naming the dir the job runs from.
    `status COPY` says it is a copy, and `stop COPY` stops the original, where its launcher reads the request."""
    import shutil

    job = job_yaml(tmp_path / "copied.yaml", inventory=[LOCAL], trainer="local", rollout="local", iterations=5000)
    job_dir, copy = tmp_path / "run", tmp_path / "backup" / "run"
    code, started = rlctl_json("launch", str(job), "--job-dir", str(job_dir), "--detach", timeout_s=180)
    assert code == 0, started
    pid = started["launcher_pid"]
    wait_for("an iteration", lambda: len(metrics_rows(job_dir)) > 0, 120)
    shutil.copytree(job_dir, copy, symlinks=True)

    again = rlctl("launch", "--resume", str(copy), "--detach", timeout_s=120)
    assert again.returncode == 2, again.stderr
    assert again.stderr.startswith(f"rlctl: error: job {started['id']} runs from {job_dir} (its launcher: pid {pid}"), (
        again.stderr
    )
    code, st = rlctl_json("status", str(copy))
    assert code == 0 and st["copy_of"]["job_dir"] == str(job_dir), st
    code, stopped = rlctl_json("stop", str(copy), timeout_s=180)
    assert code == 0 and stopped["job_dir"] == str(job_dir) and stopped["copy"] == str(copy), stopped
    wait_for("the original's launcher to end", lambda: not alive(pid), 120)
    assert json.loads((job_dir / "summary.json").read_text())["state"] == "stopped"
    assert processes_mentioning(str(job_dir)) == []
