"""`Spawner.exited`: which of a running job's agents that never joined its controller have exited, as their site
says (the controller's `Scaler.not_joining` frees their slots). Real processes on a local site."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlctl.config.inventory import Site
from rlctl.errors import LaunchError
from rlctl.launch import local
from rlctl.launch.backends import record_agent, write_sites
from rlctl.launch.base import AgentHandle, AgentSpec
from rlctl.launch.jobdir import JobDir
from rlctl.launch.spawn import Spawner

SITE = {"datacenter": "d", "scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": [{"host": "localhost", "gpus": 4}]}


def _process(*, killed: bool) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    """A process as a local agent's record names it (pid, pgid, start time), SIGKILLed and reaped when `killed`."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    ticks = local.start_ticks(proc.pid)
    assert ticks is not None
    if killed:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    return proc, {"pid": proc.pid, "pgid": proc.pid, "start_ticks": ticks}


def _record(jd: JobDir, role: str, replica: int, ident: dict[str, int]) -> None:
    record_agent(jd.path, AgentHandle(AgentSpec(role, replica, "s", []), ident, "local"))


def test_only_this_runs_agents_that_exited_are_said_exited(tmp_path: Path) -> None:
    jd = JobDir.create("j", explicit=tmp_path / "j")
    write_sites(jd.path, {"s": Site.model_validate(SITE)})
    running, alive = _process(killed=False)
    try:
        _, dead = _process(killed=True)
        _record(jd, "controller", 0, alive)  # the run before: its rollout-1 exited
        _record(jd, "rollout", 1, dead)
        _record(jd, "controller", 0, alive)  # this run: rollout-0 runs, rollout-1 not started yet
        _record(jd, "rollout", 0, alive)
        sp = Spawner(jd, {"s": Site.model_validate(SITE)}, job="j")
        try:
            assert sp.exited(["rollout-0", "rollout-1", "rollout-7"]) == []
            _record(jd, "rollout", 1, dead)  # started, and dead before it joined
            assert sp.exited(["rollout-0", "rollout-1"]) == ["rollout-1"]
        finally:
            sp.close()
    finally:
        running.kill()
        running.wait(timeout=10)


def test_a_controller_site_record_without_the_controller_is_this_runs(tmp_path: Path) -> None:
    """A controller on another site: its agents.jsonl, emptied by the launcher for the run, holds the agents it mirrors
    there and those the controller started, never the controller's own record; a unit of it that exited is said."""
    jd = JobDir.create("j", explicit=tmp_path / "j")
    write_sites(jd.path, {"s": Site.model_validate(SITE)})
    running, alive = _process(killed=False)
    try:
        _, dead = _process(killed=True)
        _record(jd, "rollout", 0, alive)
        _record(jd, "rollout", 1, dead)
        sp = Spawner(jd, {"s": Site.model_validate(SITE)}, job="j")
        try:
            assert sp.exited(["rollout-0", "rollout-1", "rollout-7"]) == ["rollout-1"]
        finally:
            sp.close()
    finally:
        running.kill()
        running.wait(timeout=10)


def test_stop_ends_this_runs_agent_of_that_name_only(tmp_path: Path) -> None:
    """`Spawner.stop`: a replacement that never joined within its bound is stopped on its site (the controller's
    `Scaler` then counts its failed attempt); an earlier run's agent of the same name is left alone."""
    jd = JobDir.create("j", explicit=tmp_path / "j")
    write_sites(jd.path, {"s": Site.model_validate(SITE)})
    earlier, earlier_ident = _process(killed=False)
    stuck, stuck_ident = _process(killed=False)
    try:
        _record(jd, "controller", 0, earlier_ident)  # the run before, its rollout-2
        _record(jd, "rollout", 2, earlier_ident)
        _record(jd, "controller", 0, stuck_ident)  # this run: its rollout-2 never joins
        _record(jd, "rollout", 2, stuck_ident)
        sp = Spawner(jd, {"s": Site.model_validate(SITE)}, job="j")
        try:
            sp.stop("rollout-7", grace_s=1.0)  # never recorded: nothing to stop
            sp.stop("rollout-2", grace_s=1.0)
            assert stuck.wait(timeout=10) is not None and earlier.poll() is None
        finally:
            sp.close()
    finally:
        for p in (earlier, stuck):
            p.kill()
            p.wait(timeout=10)


class _Scheduler:
    """A site's backend whose queue answers `answers` in turn (an exception: squeue timed out, or failed oddly)."""

    def __init__(self, answers: list[bool | Exception]) -> None:
        self.answers = answers

    def queued(self, handle: AgentHandle) -> bool:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_a_unit_whose_site_cannot_say_whether_it_queues_it_is_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Spawner.queued` never raises: a site that cannot say (squeue timed out, or failed in a way its backend does not
    translate) answers None, for the controller's `Scaler` to bound how long that counts as queued; one not recorded
    by this run is not queued. Before, it kept its own bound beside the scaler's, and an exception other than a
    LaunchError went up and lost the answer of the units its site said exited."""
    jd = JobDir.create("j", explicit=tmp_path / "j")
    write_sites(jd.path, {"s": Site.model_validate(SITE)})
    _record(jd, "controller", 0, {"pid": 1, "pgid": 1})
    _record(jd, "rollout", 0, {"pid": 2, "pgid": 2})
    sp = Spawner(jd, {"s": Site.model_validate(SITE)}, job="j")
    site = _Scheduler([LaunchError("squeue: timed out after 30 s"), True, OSError("squeue: broken pipe"), False])
    monkeypatch.setattr(sp.backends, "for_site", lambda name: site)
    try:
        said = [sp.queued(["rollout-0", "rollout-9"]) for _ in range(4)]
        assert [s["rollout-0"] for s in said] == [None, True, None, False]
        assert {s["rollout-9"] for s in said} == {False}
        (jd.path / "agents.jsonl").unlink()
        (jd.path / "agents.jsonl").mkdir()  # unreadable: every answer unknown
        assert sp.queued(["rollout-0"]) == {"rollout-0": None}
    finally:
        sp.close()
