"""The ssh backend against the real sshd on 127.0.0.1:2222 (tests/services/sshd.sh): the "remote"
host is this machine, so the tests can look at /proc directly to check what the backend claims."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from rlctl.config.inventory import Site
from rlctl.errors import LaunchError
from rlctl.launch.base import AgentHandle, AgentSpec
from rlctl.launch.remote import RemoteState
from rlctl.launch.ssh import LOST, SshBackend

pytestmark = pytest.mark.integration
AGENT = str(Path(__file__).with_name("agent_prog.py"))


def wait_for(what: str, cond: Callable[[], object], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
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


def live_in_group(pgid: int) -> list[int]:
    """Processes of a group that are not zombies (a zombie is dead, only not yet reaped by its parent)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(") ", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                pids.append(int(d.name))
    return pids


def start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19])


def make_backend(services: dict[str, str], workdir: Path, *, port: str | None = None, known_hosts: str | None = None):
    site = Site.model_validate(
        {
            "datacenter": "b",
            "gpu": "CPU",
            "nodes": [{"host": services["RLCTL_TEST_SSH_HOST"], "gpus": 2}],
            "scheduler": {
                "kind": "ssh",
                "user": "root",
                "port": int(port or services["RLCTL_TEST_SSH_PORT"]),
                "key_file": services["RLCTL_TEST_SSH_KEY"],
                "workdir": str(workdir),
            },
        }
    )
    kh = known_hosts or services["RLCTL_TEST_SSH_KNOWN_HOSTS"]
    return SshBackend("siteb", site, job="it", known_hosts=kh, connect_timeout_s=5, command_timeout_s=20)


def agent(replica: int, out: Path, mode: str, marker: str) -> AgentSpec:
    return AgentSpec("rollout", replica, "siteb", [sys.executable, AGENT, str(out), mode, marker], env={"M": marker})


@pytest.mark.timeout(120)
def test_two_detached_agents_poll_and_graceful_stop(services: dict[str, str], tmp_path: Path) -> None:
    marker = f"rlctl-it-{uuid.uuid4().hex}"
    b = make_backend(services, tmp_path / "remote")
    outs = [tmp_path / "a0", tmp_path / "a1"]
    # agent 1 also starts a child of its own: stopping the group must take it too
    child = f'bash -c "sleep 300; true {marker}" & exec {sys.executable} {AGENT} {outs[1]} run {marker}'
    specs = [agent(0, outs[0], "run", marker), AgentSpec("rollout", 1, "siteb", ["bash", "-c", child])]
    t0 = time.monotonic()
    handles: list[AgentHandle] = []
    try:
        handles = [b.start(s) for s in specs]
        t_start = time.monotonic() - t0
        for h in handles:
            pid = h.ident["pid"]
            assert h.ident["pgid"] == pid and os.getpgid(pid) == pid and os.getsid(pid) == pid  # own session
            assert h.ident["start_ticks"] == start_ticks(pid)
        wait_for("heartbeats", lambda: all((o / "hb.0").exists() for o in outs), 30)
        sts = [b.status(h) for h in handles]
        assert [s.state for s in sts] == [RemoteState.RUNNING, RemoteState.RUNNING]
        assert len(sts[1].live_pids) >= 3  # wrapper, agent, child bash (+ sleep)
        assert b.poll(handles[0]) is None
        t1 = time.monotonic()
        b.stop(handles, grace_s=10)
        t_stop = time.monotonic() - t1
    finally:
        if handles and marker_pids(marker):
            b.stop(handles, grace_s=1)
        b.close()
    print(f"\n[ssh] start of 2 agents {t_start:.2f} s, graceful stop {t_stop:.2f} s")
    assert all((o / "graceful.0").read_text() == "graceful\n" for o in outs)
    for h in handles:
        st = b.status(h)
        assert (st.state, st.exit_code, st.live_pids) == (RemoteState.CANCELLED, 0, []), st
        assert live_in_group(h.ident["pgid"]) == []
    b.close()
    assert marker_pids(marker) == []
    assert (tmp_path / "remote" / "jobs" / "it" / "run" / "rollout-0.pid").exists()


@pytest.mark.timeout(120)
def test_agent_ignoring_term_is_killed(services: dict[str, str], tmp_path: Path) -> None:
    marker = f"rlctl-it-{uuid.uuid4().hex}"
    b = make_backend(services, tmp_path / "remote")
    h = b.start(agent(0, tmp_path / "out", "ignore", marker))
    try:
        wait_for("a heartbeat", lambda: (tmp_path / "out" / "hb.0").exists(), 30)
        t1 = time.monotonic()
        b.stop([h], grace_s=1.5)
        t_stop = time.monotonic() - t1
        st = b.status(h)
    finally:
        b.close()
    assert t_stop >= 1.5
    assert not (tmp_path / "out" / "graceful.0").exists()
    assert (st.state, st.exit_code, st.live_pids) == (RemoteState.CANCELLED, LOST, []), st
    assert marker_pids(marker) == []


@pytest.mark.timeout(60)
def test_reused_pid_is_reported_dead_and_not_killed(services: dict[str, str], tmp_path: Path) -> None:
    """A pidfile whose start time does not match names someone else's process now: hands off."""
    marker = f"rlctl-it-{uuid.uuid4().hex}"
    stranger = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", marker], start_new_session=True
    )  # stands for an unrelated process that got our old pid (and leads a group with it)
    try:
        b = make_backend(services, tmp_path / "remote")
        ident = {
            "host": services["RLCTL_TEST_SSH_HOST"],
            "pid": stranger.pid,
            "pgid": stranger.pid,
            "start_ticks": start_ticks(stranger.pid) - 1,
            "pidfile": str(tmp_path / "x.pid"),
            "exitfile": str(tmp_path / "x.exit"),
            "log": str(tmp_path / "x.log"),
        }
        h = AgentHandle(agent(0, tmp_path, "run", marker), ident, "ssh")
        st = b.status(h)
        assert st.state is RemoteState.FAILED and "reused" in st.detail and st.live_pids == [], st
        b.stop([h], grace_s=1)
        b.close()
        time.sleep(0.2)  # give a (wrong) signal time to land before we look; the check below is exact
        assert stranger.poll() is None, "the stranger was signalled"
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.timeout(60)
def test_unknown_host_key_and_dead_port_name_the_host(services: dict[str, str], tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = services["RLCTL_TEST_SSH_HOST"]
    b = make_backend(services, tmp_path / "remote", known_hosts=str(empty))
    with pytest.raises(LaunchError, match=f"{host}.*unknown host key") as e:
        b.start(agent(0, tmp_path / "out", "run", "never"))
    assert e.value.hint and "ssh-keyscan" in e.value.hint
    b = make_backend(services, tmp_path / "remote", port="1")
    with pytest.raises(LaunchError, match=f"{host}:1: cannot connect"):
        b.start(agent(0, tmp_path / "out", "run", "never"))
    assert not (tmp_path / "out").exists()
