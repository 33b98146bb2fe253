"""`rlctl launch -o json` end to end on a tiny job, Ctrl-C, and the local backend's stop guarantee."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rlctl.launch.base import AgentSpec
from rlctl.launch.jobdir import JobDir
from rlctl.launch.local import LocalBackend
from tests.conftest import RLCTL_AT_A_TERMINAL

from .conftest import alive_agent_pids

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

RLCTL = [sys.executable, "-m", "rlctl"]


def test_launch_json_summary(tiny_job, tmp_path):
    job_dir = tmp_path / "run"
    proc = subprocess.run(
        [*RLCTL, "launch", str(tiny_job("async")), "-o", "json", "--iterations", "2", "--job-dir", str(job_dir)],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)  # stdout is exactly one JSON object; progress went to stderr
    for key in ("iterations", "reward_first", "reward_last", "samples_per_s", "wall_s", "ledger", "job_dir"):
        assert key in s
    assert s["iterations"] == 2 and s["job_dir"] == str(job_dir)
    assert {k: s["ledger"][k] for k in ("prompts", "trained", "requeued", "lost", "duplicated")} == {
        "prompts": 8,
        "trained": 8,
        "requeued": 0,
        "lost": 0,
        "duplicated": 0,
    }
    jd = JobDir(job_dir)
    for p in (
        jd.job_json,
        jd.plan_json,
        jd.events,
        jd.metrics,
        jd.log("controller", 0),
        jd.log("rollout", 1),
        jd.init_model / "config.json",
        jd.checkpoint(2) / "model" / "config.json",
    ):
        assert p.exists(), p
    assert "iter " in proc.stderr
    assert alive_agent_pids(jd.read_lines(jd.events)) == []


def test_bad_job_file_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: rlctl/v1\nkind: Job\nname: x\n")
    proc = subprocess.run([*RLCTL, "launch", str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "bad.yaml" in proc.stderr


def test_ctrl_c_stops_every_agent(tiny_job, tmp_path):
    job_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [*RLCTL_AT_A_TERMINAL, "launch", str(tiny_job("async", iterations=500)), "--job-dir", str(job_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    jd = JobDir(job_dir)
    deadline = time.monotonic() + 150
    while not any(r.get("iteration", -1) >= 0 for r in jd.read_lines(jd.metrics)):
        assert time.monotonic() < deadline and proc.poll() is None, "the job never trained an iteration"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert alive_agent_pids(jd.read_lines(jd.events)) == []


def test_local_backend_stop_kills_the_whole_group_even_if_sigterm_is_ignored(tmp_path):
    backend = LocalBackend()
    script = "trap '' TERM; sleep 300 & sleep 300 & wait"
    h = backend.start(AgentSpec("rollout", 0, "local", ["sh", "-c", script], log_path=tmp_path / "x.log"))
    time.sleep(0.3)  # let the shell start its children (not a timing assertion)
    assert backend.poll(h) is None
    t0 = time.monotonic()
    backend.stop([h], grace_s=0.5)
    assert time.monotonic() - t0 < 10
    with pytest.raises(ProcessLookupError):
        os.killpg(h.ident["pgid"], 0)
    assert backend.poll(h) is not None
