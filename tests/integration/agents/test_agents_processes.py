"""Agents as real processes over real TCP sockets: each mode runs to the end with every prompt trained
exactly once; a rollout agent killed mid-run has its prompts re-queued; stop leaves no process."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import pytest

from rlctl.config import load_job
from rlctl.errors import LaunchError
from rlctl.launch.jobdir import JobDir
from rlctl.ops import runstart, runwait
from rlctl.ops.counts import plan_counts, resolve_job
from rlctl.ops.jobprep import prepare
from rlctl.ops.launchdir import launch_dir
from rlctl.ops.run import JobRun

from .conftest import alive_agent_pids

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _run(path, job_dir, **over):
    job = load_job(path)
    spec = resolve_job(job, **over)
    plan = plan_counts(job, spec)
    jd = launch_dir(job, spec, job_dir)
    prepare(jd, spec, plan, source=str(path), job=job)
    return JobRun(jd, spec, plan)


@pytest.mark.parametrize(
    ("mode", "encrypt"), [("sync", False), ("stream", False), ("async", False), ("async", True)]
)  # encrypt: `transport.encrypt`, every connection of the job (controller, trainer, units, weight plane) sealed
def test_mode_trains_every_prompt_exactly_once(tiny_job, tmp_path, mode, encrypt):
    job = tiny_job(mode, name="sealed" if encrypt else "tiny", transport={"encrypt": True} if encrypt else None)
    run = _run(job, tmp_path / "run")
    try:
        run.start()
        s = run.wait(poll_s=0.3)
    finally:
        run.stop()
    assert s["state"] == "done" and s["controller_exit"] == 0
    led = s["ledger"]
    assert led["prompts"] == led["trained"] == 3 * 4 and led["trained_samples"] == 3 * 4 * 4
    assert (led["duplicated"], led["lost"], s["staleness_violations"]) == (0, 0, 0)
    eta = 1 if mode == "async" else 0
    assert max(int(k) for k in s["staleness"]) <= eta
    assert {a for a in s["agents"]} == {"trainer-0", "rollout-0", "rollout-1"}
    assert s["weights"]["versions"], s["weights"]  # versions crossed the weight plane
    jd = JobDir(tmp_path / "run")
    assert len(jd.read_lines(jd.metrics)) == 3
    assert alive_agent_pids(jd.read_lines(jd.events)) == []


def test_two_trainer_ranks_form_one_gloo_group(tiny_job, tmp_path):
    run = _run(tiny_job("stream", iterations=2, trainer_ranks=2), tmp_path / "run")
    try:
        run.start()
        s = run.wait(poll_s=0.3)
        deadline = time.monotonic() + 60
        while run.agent_codes()["trainer-1"] is None and time.monotonic() < deadline:
            time.sleep(0.1)
        # read by the backend that started it (its exit status), before the stop: after it, a gone process reads
        # LOST (no status to tell), where it once read 0 whatever its status
        codes = run.agent_codes()
    finally:
        run.stop()
    assert s["state"] == "done" and s["ledger"]["trained"] == s["ledger"]["prompts"] == 8
    assert codes["trainer-1"] == 0  # the follower rank left the group cleanly


def test_a_trainer_that_ends_before_joining_ends_the_wait_naming_it(tiny_job, tmp_path, monkeypatch):
    """The trainer group's port is taken by the time rank 0 binds it (as an outgoing connection took it in CI):
    the rank exits at start, and `wait` says so in one line with the rank's error instead of waiting on a
    controller that waits for a trainer."""
    monkeypatch.setattr(runwait, "TRAINER_POLL_S", 0.5)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(runstart, "_free_port", lambda: taken.getsockname()[1])
        run = _run(tiny_job("stream", iterations=2), tmp_path / "run")
        try:
            run.start()
            with pytest.raises(LaunchError) as e:
                run.wait(poll_s=0.3)
        finally:
            run.stop()
    msg = str(e.value)
    assert msg.startswith("trainer-0 exited with 1 before the job's trainer joined (its log: "), msg
    assert "trainer group: cannot listen on 127.0.0.1:" in msg and "Address already in use" in msg, msg
    assert "\n" not in msg
    jd = JobDir(tmp_path / "run")
    assert alive_agent_pids(jd.read_lines(jd.events)) == []
    # the controller's summary says the job failed, as the launcher (and the job index) do: the launcher's stop
    # ended it `stopped`, and `status` said "the job ended (stopped)" beside "job index failed"
    state = json.loads(jd.summary_json.read_text())["state"]
    assert state == "failed: trainer-0 exited with 1 before the job's trainer joined", state


def test_killed_rollout_agent_prompts_are_requeued(tiny_job, tmp_path):
    run = _run(tiny_job("stream", iterations=6, prompts=8, group=4, max_tokens=64), tmp_path / "run")
    victim = None
    try:
        run.start()
        victim = next(h for h in run.handles if h.spec.name == "rollout-1")
        # frozen once it joined: what it is sent then stays in flight (a tiny model's unit, killed when a status
        # said it held 4, had finished and sent them by then, once in CI: nothing was requeued)
        frozen = False
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            st = run.status()
            agent = next((a for a in (st or {}).get("agents", []) if a["name"] == "rollout-1"), None)
            if agent is not None and not frozen:
                os.killpg(victim.ident["pgid"], signal.SIGSTOP)
                frozen = True
            elif agent is not None and agent["inflight"] >= 1:
                os.killpg(victim.ident["pgid"], signal.SIGKILL)
                break
            time.sleep(0.05)
        else:
            pytest.fail("rollout-1 never had work in flight")
        s = run.wait(poll_s=0.3)
    finally:
        run.stop()
    assert s["state"] == "done"
    led = s["ledger"]
    assert led["requeued"] >= 1
    assert led["prompts"] == led["trained"] == 6 * 8
    assert (led["duplicated"], led["lost"]) == (0, 0)
    events = JobDir(tmp_path / "run").read_lines(JobDir(tmp_path / "run").events)
    lost = [e for e in events if e["event"] == "agent_lost"]
    assert [e["agent"] for e in lost] == ["rollout-1"] and lost[0]["requeued"] >= 1


def test_stop_mid_run_leaves_no_process(tiny_job, tmp_path):
    run = _run(tiny_job("async", iterations=200), tmp_path / "run")
    try:
        run.start()
        deadline = time.monotonic() + 120
        while (st := run.status()) is None or st["iteration"] < 1:
            assert time.monotonic() < deadline, "the job never trained an iteration"
            time.sleep(0.1)
    finally:
        run.stop(grace_s=10)
    assert all(code is not None for code in run.agent_codes().values())
    jd = JobDir(tmp_path / "run")
    assert alive_agent_pids(jd.read_lines(jd.events)) == []
    # SIGTERM let the controller write what it had
    assert jd.read_json(jd.summary_json)["state"] == "stopped"
