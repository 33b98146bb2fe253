"""`rlctl stop` against a launcher that starts the job again, or prepares it: a stop while an auto-resume stages the
job ends it (the launcher starts nothing after it), as does one while a launch prepares it (its SFT warm-up); a
resumed run never reports the summary of the run before it, whether its launcher waits for it or `rlctl status`
reads it while its controller does not answer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlctl.launch.jobdir import JobDir
from rlctl.ops.jobdb import JobDB

from .conftest import REPO, RLCTL, events, job_yaml, metrics_rows, processes_mentioning, rlctl, rlctl_json, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LOCAL = str(REPO / "clusters" / "local.yaml")

# `rlctl ARGS` in this process, every staging after the first held while GATE exists (STAGING says it is held):
# the window in which an auto-resume stages the job to a remote site, minutes on a real cluster, made as long
# as the test needs
GATED_LAUNCHER = """
import sys, time
from pathlib import Path

import rlctl.ops.runstart as runstart

gate, staging = Path(sys.argv[1]), Path(sys.argv[2])
stage_all, calls = runstart.stage_all, []


def gated(*args, **kwargs):
    calls.append(1)
    if len(calls) > 1:
        staging.touch()
        while gate.exists():
            time.sleep(0.05)
    return stage_all(*args, **kwargs)


runstart.stage_all = gated
from rlctl.cli import main

sys.argv = ["rlctl", *sys.argv[3:]]
main()
"""


def started(job_dir: Path, agent: str) -> list[float]:
    return [float(e["t"]) for e in events(job_dir) if e["event"] == "agent_started" and e["agent"] == agent]


def pid_of(job_dir: Path, agent: str) -> int:
    return [e["pid"] for e in events(job_dir) if e["event"] == "agent_joined" and e["agent"] == agent][-1]


def test_a_stop_while_an_auto_resume_stages_the_job_ends_it(tmp_path):
    job_dir, gate, staging = tmp_path / "run", tmp_path / "gate", tmp_path / "staging"
    job = job_yaml(
        tmp_path / "ar.yaml",
        inventory=[LOCAL],
        trainer="local",
        rollout="local",
        checkpoint={"every_iterations": 2, "auto_resume": 1},
    )
    (tmp_path / "gated.py").write_text(GATED_LAUNCHER)
    gate.touch()
    cmd = [sys.executable, str(tmp_path / "gated.py"), str(gate), str(staging), "launch", str(job)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [*cmd, "--job-dir", str(job_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    stopper: subprocess.Popen[bytes] | None = None
    try:
        wait_for("a checkpoint", lambda: any(e["event"] == "checkpoint" for e in events(job_dir)), 120, alive=proc)
        os.kill(pid_of(job_dir, "trainer-0"), signal.SIGKILL)  # the run fails; its launcher resumes it
        wait_for("the auto-resume's staging", staging.exists, 120, alive=proc)
        # the stop asks, stops what runs and writes its end, then waits (at most LAUNCHER_END_S) for the launcher,
        # still held in its staging: the gate opens only then, so the launcher goes on past a stop that is done
        stop_err = tmp_path / "stop.err"
        with stop_err.open("w") as err_file:
            stopper = subprocess.Popen([*RLCTL, "stop", str(job_dir)], stdout=subprocess.DEVNULL, stderr=err_file)
        said = lambda: stopper.poll() is not None or "waiting for the job's launcher" in stop_err.read_text()  # noqa: E731
        wait_for("the stop to wait for the launcher", said, 120)
        stop_t = max(float(e["t"]) for e in events(job_dir) if e["event"] == "stop_requested")
        gate.unlink()
        assert stopper.wait(timeout=60) == 0, stop_err.read_text()

        def after_stop() -> list[float]:
            return [t for t in started(job_dir, "controller-0") if t > stop_t]

        ended = lambda: proc.poll() is not None or after_stop()  # noqa: E731
        wait_for("the launcher's end (or a controller started anew)", ended, 90)
        assert after_stop() == [], "the launcher started the job again after `rlctl stop`"
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 1 and "was stopped (`rlctl stop`) while its launcher started a run" in err, err
        _, rows = rlctl_json("status", "--all")
        assert [r["state"] for r in rows if r["id"] == JobDir(job_dir).id] == ["stopped"]
        assert processes_mentioning(str(job_dir)) == []
    finally:
        gate.unlink(missing_ok=True)
        if stopper is not None and stopper.poll() is None:
            stopper.kill()
            stopper.wait()
        if proc.poll() is None:
            proc.terminate()  # its `finally` stops the agents
            proc.communicate(timeout=60)


def test_a_resumed_run_never_reports_the_summary_of_the_run_before(tmp_path, launcher):
    job_dir = tmp_path / "run"
    job = job_yaml(tmp_path / "tiny.yaml", inventory=[LOCAL], trainer="local", rollout="local")
    first = launcher(str(job), "--job-dir", str(job_dir), "-o", "json")
    wait_for("an iteration", lambda: metrics_rows(job_dir), 120, alive=first)
    assert rlctl("stop", str(job_dir)).returncode == 0
    first.communicate(timeout=60)
    assert json.loads((job_dir / "summary.json").read_text())["state"] == "stopped"

    resumed = launcher("--resume", str(job_dir), "-o", "json")
    wait_for("the resumed run's controller", lambda: len(started(job_dir, "controller-0")) == 2, 120, alive=resumed)
    wait_for("its status", lambda: rlctl_json("status", str(job_dir))[1].get("source") == "controller", 60)
    controller = [e for e in events(job_dir) if e["event"] == "agent_started" and e["agent"] == "controller-0"]
    pid = int(controller[-1]["ident"]["pid"])
    os.kill(pid, signal.SIGSTOP)  # a controller that does not answer for a while (swap, a long GC)
    try:
        code, s = rlctl_json("status", "--timeout", "1", str(job_dir))
    finally:
        os.kill(pid, signal.SIGKILL)  # … then dies without a summary (the OOM killer, its node lost)
    assert code == 3 and "summary" not in s, s.get("summary")  # not ended: its agents run, it has no summary yet
    _, err = resumed.communicate(timeout=90)
    assert resumed.returncode == 1 and "without a summary" in err, err[-2000:]  # not the run before's `stopped`
    _, rows = rlctl_json("status", "--all")
    assert [r["state"] for r in rows if r["id"] == JobDir(job_dir).id] == ["failed"]
    assert json.loads((job_dir / "summary.1.json").read_text())["state"] == "stopped"  # the run before's, kept


def test_a_stop_while_the_launch_prepares_the_job_ends_that_launch(tmp_path, monkeypatch):
    """`rlctl stop` (no JOB) during a launch's SFT warm-up: the job is in the index from the moment its directory
    exists, so the stop means it (before, it entered the index once prepared: the stop meant the job launched before
    it, or found no job) and the launcher ends the warm-up at once, the index `stopped`. Nothing it leaves makes the
    directory a job: `launch --resume` says there is nothing to resume, a new launch there is not refused."""
    monkeypatch.setenv("RLCTL_CACHE_DIR", str(tmp_path / "cache"))  # a warm-up that is not cached: minutes long
    job_dir = tmp_path / "run"
    job = job_yaml(
        tmp_path / "preparing.yaml", inventory=[LOCAL], trainer="local", rollout="local", warmup={"sft_steps": 5000}
    )
    cmd = [*RLCTL, "launch", str(job), "--job-dir", str(job_dir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        db = JobDB()
        try:
            # its own row (an earlier test's job dir of the same name left one in this session's index)
            mine = lambda: [r for r in db.list() if r.job_dir == str(job_dir) and r.state == "launching"]  # noqa: E731
            wait_for("the job in the index", mine, 60, alive=proc)
        finally:
            db.close()
        stop = rlctl("stop")
        assert stop.returncode == 0 and f"Stop {JobDir(job_dir).id}" in stop.stdout, stop.stdout + stop.stderr
        _, err = proc.communicate(timeout=30)  # its warm-up ended at the stop: not after its 5000 steps
        assert proc.returncode == 1 and "while its launch prepared it" in err, err[-2000:]
        assert f"launch it again with `rlctl launch {job}`" in err, err[-2000:]  # not `launch --resume`: unprepared
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    _, rows = rlctl_json("status", "--all")
    assert [r["state"] for r in rows if r["id"] == JobDir(job_dir).id] == ["stopped"]
    assert not (job_dir / "job.json").exists() and not list((tmp_path / "cache").glob("sft/*/config.json"))
    resume = rlctl("launch", "--resume", JobDir(job_dir).id)
    assert resume.returncode == 2 and "never prepared" in resume.stderr and str(job) in resume.stderr, resume.stderr


def test_a_controller_sigterm_no_stop_asked_for_fails_the_run_and_auto_resume_resumes_it(tmp_path, launcher):
    """A SIGTERM to the controller that no `rlctl stop` asked for (a SLURM time limit, a pre-emption): the run ends
    `failed: controller got SIGTERM` and `checkpoint.auto_resume` resumes it; before, it ended `stopped`, not
    resumed. The resumed run is then stopped as usual: `stopped`."""
    job_dir = tmp_path / "run"
    job = job_yaml(
        tmp_path / "term.yaml",
        inventory=[LOCAL],
        trainer="local",
        rollout="local",
        checkpoint={"every_iterations": 2, "auto_resume": 1},
    )
    proc = launcher(str(job), "--job-dir", str(job_dir))
    wait_for("a checkpoint", lambda: any(e["event"] == "checkpoint" for e in events(job_dir)), 120, alive=proc)
    controller = [e for e in events(job_dir) if e["event"] == "agent_started" and e["agent"] == "controller-0"]
    os.kill(int(controller[-1]["ident"]["pid"]), signal.SIGTERM)
    wait_for("the auto-resume", lambda: any(e["event"] == "auto_resume" for e in events(job_dir)), 60, alive=proc)
    ends = [e["state"] for e in events(job_dir) if e["event"] == "job_end"]
    assert ends == ["failed: controller got SIGTERM"], ends
    listening = lambda: [e for e in events(job_dir) if e["event"] == "controller_listening"]  # noqa: E731
    wait_for("the resumed run's controller", lambda: len(listening()) == 2, 60, alive=proc)
    stop = rlctl("stop", str(job_dir))
    assert stop.returncode == 0, stop.stderr
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "did not finish: stopped" in err, err[-2000:]
    assert json.loads((job_dir / "summary.1.json").read_text())["state"] == "failed: controller got SIGTERM"
