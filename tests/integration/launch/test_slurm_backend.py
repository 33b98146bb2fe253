"""The slurm backend against the real localhost SLURM cluster (tests/services/slurm.sh).

Both submitters: submitit (we are "on the login node") and sbatch over SSH (the local sshd stands
in for the login node). Agents are tests/integration/launch/agent_prog.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from rlctl.config.schedulers import SlurmScheduler
from rlctl.errors import LaunchError
from rlctl.launch.base import AgentHandle, AgentSpec
from rlctl.launch.remote import RemoteState
from rlctl.launch.slurm import SlurmBackend, SlurmResources
from tests.integration.slurmsite import slurm_scheduler

pytestmark = pytest.mark.integration
AGENT = str(Path(__file__).with_name("agent_prog.py"))


def wait_for(what: str, cond: Callable[[], object], timeout_s: float) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.1)


def marker_pids(marker: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


def in_squeue(services: dict[str, str], job_id: str) -> str:
    env = {**os.environ, "SLURM_CONF": services["RLCTL_TEST_SLURM_CONF"]}
    proc = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%T"], env=env, capture_output=True, text=True, timeout=30
    )
    return proc.stdout.strip()


def make_backend(
    services: dict[str, str], job_dir: Path, submitter: str, res: SlurmResources, *, grace_s: int = 10
) -> SlurmBackend:
    sched = slurm_scheduler(services, submitter=submitter)
    b = SlurmBackend(
        "sitea",
        SlurmScheduler.model_validate(sched),
        job=f"it-{job_dir.name}",
        job_dir=job_dir,
        resources={"trainer": res},
        grace_s=grace_s,
        known_hosts=services["RLCTL_TEST_SSH_KNOWN_HOSTS"],
        python=sys.executable,
    )
    assert b.submitter == submitter
    return b


def spec(out: Path, mode: str, marker: str, *extra: str) -> AgentSpec:
    return AgentSpec(
        "trainer",
        0,
        "sitea",
        [sys.executable, AGENT, str(out), mode, marker, *extra],
        env={"RLCTL_TEST_MARKER": marker},
        log_path=out.parent / "logs" / "trainer-0.log",
    )


def cleanup(b: SlurmBackend, handles: list[AgentHandle]) -> None:
    """Best effort after a failure: the failure itself is what the test reports."""
    try:
        b.stop(handles, grace_s=1)
    except LaunchError as e:
        print(f"cleanup: {e}")
    finally:
        b.close()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("submitter", ["submitit", "sbatch-ssh"])
def test_two_ranks_on_both_nodes_then_graceful_stop(services: dict[str, str], tmp_path: Path, submitter: str) -> None:
    marker = f"rlctl-it-{uuid.uuid4().hex}"
    out = tmp_path / "out"
    b = make_backend(services, tmp_path, submitter, SlurmResources(nodes=2, tasks_per_node=1))
    t0 = time.monotonic()
    h = b.start(spec(out, "run", marker))
    try:
        seen: list[RemoteState] = []

        def running() -> bool:
            st = b.status(h)
            seen.append(st.state)
            return st.state is RemoteState.RUNNING

        wait_for("the job to run", running, 90)
        t_running = time.monotonic() - t0
        assert set(seen) <= {RemoteState.PENDING, RemoteState.RUNNING}, seen
        assert b.status(h).nodes == ["sitea-1", "sitea-2"]
        wait_for("both ranks' heartbeats", lambda: (out / "hb.0").exists() and (out / "hb.1").exists(), 60)
        beats = [json.loads((out / f"hb.{r}").read_text()) for r in (0, 1)]
        assert sorted(b["rank"] for b in beats) == [0, 1]
        assert sorted(b["node"] for b in beats) == ["sitea-1", "sitea-2"]  # one rank per node
        assert len(marker_pids(marker)) >= 2
        t1 = time.monotonic()
        b.stop([h], grace_s=20)
        t_stop = time.monotonic() - t1
    except BaseException:
        cleanup(b, [h])
        raise
    b.close()
    print(f"\n[{submitter}] submit→running {t_running:.2f} s, graceful stop {t_stop:.2f} s, states {seen[0]}→running")
    assert (out / "graceful.0").read_text() == "graceful\n" and (out / "graceful.1").exists()
    st = b.status(h)
    # every rank exited 0 on our TERM (no kill), and we report the job as cancelled by us
    assert (st.state, st.slurm_state) == (RemoteState.CANCELLED, "COMPLETED"), st
    assert in_squeue(services, h.ident["job_id"]) == ""
    wait_for("no process with the marker", lambda: not marker_pids(marker), 15)


@pytest.mark.timeout(120)
def test_agent_ignoring_term_is_scancelled(services: dict[str, str], tmp_path: Path) -> None:
    marker = f"rlctl-it-{uuid.uuid4().hex}"
    out = tmp_path / "out"
    b = make_backend(services, tmp_path, "submitit", SlurmResources())
    h = b.start(spec(out, "ignore", marker))
    try:
        wait_for("a heartbeat", lambda: (out / "hb.0").exists(), 60)
        t1 = time.monotonic()
        b.stop([h], grace_s=2)
        t_stop = time.monotonic() - t1
    except BaseException:
        cleanup(b, [h])
        raise
    b.close()
    print(f"\n[forced] stop of a TERM-ignoring agent {t_stop:.2f} s")
    assert t_stop >= 2  # it really waited for the grace period before scancel
    assert not (out / "graceful.0").exists()
    st = b.status(h)
    assert (st.state, st.slurm_state) == (RemoteState.CANCELLED, "CANCELLED"), st
    assert in_squeue(services, h.ident["job_id"]) == ""
    wait_for("no process with the marker", lambda: not marker_pids(marker), 15)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("submitter", ["submitit", "sbatch-ssh"])
def test_exit_code_after_job_left_squeue(services: dict[str, str], tmp_path: Path, submitter: str) -> None:
    """A finished job is gone from squeue: status comes from scontrol (no sacct needed)."""
    out = tmp_path / "out"
    b = make_backend(services, tmp_path, submitter, SlurmResources())
    h = b.start(spec(out, "exit", f"rlctl-it-{uuid.uuid4().hex}", "3"))
    try:
        code = wait_for("the job to end", lambda: b.poll(h) is not None, 90) and b.poll(h)
        st = b.status(h)
        limit = b.at_time_limit(h)
    finally:
        b.close()
    assert st.source == "scontrol" and st.state is RemoteState.FAILED, st
    assert limit is None  # a failure in its first seconds of a 10 min limit: a crash, not a time limit
    # our script passes the agent's code through; submitit turns the failure into a Python error
    assert code == (3 if submitter == "sbatch-ssh" else st.exit_code) and code not in (0, None)


@pytest.mark.timeout(120)
def test_pending_job_is_cancelled(services: dict[str, str], tmp_path: Path) -> None:
    """Fill the partition with one job; the next pends (reason Resources) until we stop it."""
    marker = f"rlctl-it-{uuid.uuid4().hex}"
    full = make_backend(services, tmp_path / "a", "submitit", SlurmResources(nodes=2, tasks_per_node=2))
    waiting = make_backend(services, tmp_path / "b", "submitit", SlurmResources())
    ha = full.start(spec(tmp_path / "a" / "out", "run", marker))
    hb = waiting.start(spec(tmp_path / "b" / "out", "run", marker))
    try:
        wait_for("the filler to run", lambda: full.status(ha).state is RemoteState.RUNNING, 90)
        st = waiting.status(hb)
        assert st.state is RemoteState.PENDING and st.nodes == [], st
        waiting.stop([hb], grace_s=5)
        st = waiting.status(hb)
        assert (st.state, st.slurm_state) == (RemoteState.CANCELLED, "CANCELLED"), st
        assert not (tmp_path / "b" / "out" / "hb.0").exists()  # it never ran
        full.stop([ha], grace_s=10)
    finally:
        cleanup(waiting, [hb])
        cleanup(full, [ha])
    wait_for("no process with the marker", lambda: not marker_pids(marker), 15)


@pytest.mark.timeout(240)
def test_time_limit_signal_stops_agents_gracefully(services: dict[str, str], tmp_path: Path) -> None:
    """--time=2 with grace 55 s: SLURM's TERM comes 5–65 s into the run (it may come up to 60 s early, by SLURM's
    own resolution); every rank must get it and exit cleanly before the limit. (At --time=1 it could come as the
    job started, before the agent had its handler: exit 143, once in CI.) One job per submitter, both at once (each
    takes one core of each node): the wait is SLURM's clock, so the second costs nothing."""
    jobs: dict[str, tuple[SlurmBackend, AgentHandle, Path, str]] = {}
    try:
        for submitter in ("submitit", "sbatch-ssh"):
            marker = f"rlctl-it-{uuid.uuid4().hex}"
            out = tmp_path / submitter / "out"
            b = make_backend(services, tmp_path / submitter, submitter, SlurmResources(nodes=2), grace_s=55)
            b.sched = b.sched.model_copy(update={"time_limit_min": 2})
            jobs[submitter] = (b, b.start(spec(out, "run", marker)), out, marker)
        ended = lambda: all(b.poll(h) is not None for b, h, _, _ in jobs.values())  # noqa: E731
        wait_for("both jobs to end by themselves", ended, 150)
        ends = {s: (b.status(h), b.at_time_limit(h)) for s, (b, h, _, _) in jobs.items()}
    except BaseException:
        for b, h, _, _ in jobs.values():
            cleanup(b, [h])
        raise
    for b, _, _, _ in jobs.values():
        b.close()
    for submitter, (_, h, out, _) in jobs.items():
        st, limit = ends[submitter]
        assert (st.state, st.slurm_state) == (RemoteState.FINISHED, "COMPLETED"), (submitter, st)
        # a clean exit, yet a planned end: what `Runs` resumes without spending checkpoint.auto_resume
        said = rf"SLURM job {h.ident['job_id']} ran 0:0\d:\d\d of its 0:02:00 limit"
        assert limit is not None and re.fullmatch(said, limit), (submitter, limit)
        assert (out / "graceful.0").exists() and (out / "graceful.1").exists(), submitter
    wait_for("no process with either marker", lambda: not any(marker_pids(m) for _, _, _, m in jobs.values()), 15)
