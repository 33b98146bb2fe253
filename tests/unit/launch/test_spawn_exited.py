"""`Spawner.exited`: which of a running job's agents that never joined its controller have exited, as their site
says (the controller's `Scaler.not_joining` frees their slots). Real processes on a local site."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlctl.config.inventory import Site
from rlctl.errors import LaunchError
from rlctl.launch import local, spawn
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
    """A site's backend whose queue answers `answers` in turn (a LaunchError: squeue timed out)."""

    def __init__(self, answers: list[bool | LaunchError]) -> None:
        self.answers = answers

    def queued(self, handle: AgentHandle) -> bool:
        answer = self.answers.pop(0)
        if isinstance(answer, LaunchError):
            raise answer
        return answer


def test_a_unit_whose_site_cannot_say_is_as_it_last_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`Spawner.queued`: squeue timing out counted a unit not queued, so its join bound ran on and the controller
    stopped a unit still waiting in SLURM's queue; it is as its site last said (queued when it never said)."""
    jd = JobDir.create("j", explicit=tmp_path / "j")
    write_sites(jd.path, {"s": Site.model_validate(SITE)})
    _record(jd, "controller", 0, {"pid": 1})
    _record(jd, "rollout", 0, {"pid": 2})
    sp = Spawner(jd, {"s": Site.model_validate(SITE)}, job="j")
    timeout = LaunchError("squeue: timed out after 30 s")
    site = _Scheduler([timeout, True, timeout, False, timeout])
    monkeypatch.setattr(sp.backends, "for_site", lambda name: site)
    try:
        assert [sp.queued(["rollout-0"]) for _ in range(5)] == [["rollout-0"]] * 3 + [[]] * 2
    finally:
        sp.close()


def test_a_unit_whose_site_never_answers_is_queued_for_a_while_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A site whose squeue always failed kept each unit queued for good: its join bound started again at every ask,
    and a unit that hung loading was never stopped. Past SILENT_QUEUE_S of silence it is taken as started, said
    once (a warning, a `queue_unanswered` event); an answer counts again."""
    jd = JobDir.create("j", explicit=tmp_path / "j")
    write_sites(jd.path, {"s": Site.model_validate(SITE)})
    _record(jd, "controller", 0, {"pid": 1})
    _record(jd, "rollout", 0, {"pid": 2})
    sp = Spawner(jd, {"s": Site.model_validate(SITE)}, job="j")
    timeout = LaunchError("squeue: failed")
    site = _Scheduler([timeout] * 4 + [True])
    monkeypatch.setattr(sp.backends, "for_site", lambda name: site)
    clock = [1000.0]
    monkeypatch.setattr(spawn, "time", SimpleNamespace(monotonic=lambda: clock[0]), raising=False)
    silence = 1800.0  # spawn.SILENT_QUEUE_S
    try:
        said = []
        for after in (0.0, silence, silence + 60, silence + 120, 9000.0):
            clock[0] = 1000.0 + after  # seconds after the site's first failed answer
            said.append(sp.queued(["rollout-0"]))
        assert said == [["rollout-0"], ["rollout-0"], [], [], ["rollout-0"]]
        events = jd.read_events("queue_unanswered")
        assert [(e["agent"], e["site"]) for e in events] == [("rollout-0", "s")]
    finally:
        sp.close()
