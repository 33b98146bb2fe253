"""The hang watchdog (rlctl.agents.watchdog): limits from each phase's history, the watcher's decision on its own
clock, and real processes that hang — one waiting forever (the Python watcher ends it, exit 70, stacks in its
stderr) and one holding the GIL in a C call (only faulthandler's timer can end it)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from rlctl.agents import watchdog as wd
from rlctl.agents.watchdog import FACTOR, FIRST_S, FLOOR_S, HUNG_EXIT, Limits, Watchdog


def test_auto_limits_follow_each_phases_longest_run() -> None:
    limits = Limits("auto")
    assert limits.limit("engine step") == FIRST_S  # never ran: compiles, graph capture, first loads
    limits.ended("engine step", 0.05)
    assert limits.limit("engine step") == FLOOR_S
    limits.ended("engine step", 0.01)  # a shorter run does not lower it
    limits.ended("weight load", 100.0)
    assert limits.limit("weight load") == FACTOR * 100.0
    assert limits.limit("engine step") == FLOOR_S
    assert limits.limit("publish") == FIRST_S
    assert limits.most() == FIRST_S  # a phase not seen yet may still come


def test_a_number_is_every_phases_limit_and_never_watches_nothing() -> None:
    fixed = Limits(5.0)
    assert fixed.limit("train") == 5.0
    fixed.ended("train", 100.0)
    assert fixed.limit("train") == 5.0 and fixed.most() == 5.0
    never = Limits("never")
    assert never.limit("train") is None and never.most() is None


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _watchdog(tmp_path: Path, timeout: wd.HangTimeout) -> tuple[Watchdog, Clock, list[object]]:
    clock, said = Clock(), []
    stream = (tmp_path / "stderr").open("w")
    dog = Watchdog(
        "rollout-3",
        timeout,
        on_hang=lambda text: said.append(text),
        clock=clock,
        exit=lambda code: said.append(code),
        stream=stream,
        backstop=False,
        tick_s=None,
    )
    return dog, clock, said


def test_a_phase_past_its_limit_ends_the_agent_with_its_stacks(tmp_path: Path) -> None:
    dog, clock, said = _watchdog(tmp_path, 30.0)
    with dog.busy("engine step"):
        clock.t += 30.0
        assert not dog.check() and said == []  # at its limit, not past it
        clock.t += 1.0
        assert dog.check()
    assert said == ["hung: engine step ran 31 s, past its limit of 30 s", HUNG_EXIT]
    stacks = (tmp_path / "stderr").read_text()
    assert "most recent call first" in stacks
    assert "test_a_phase_past_its_limit_ends_the_agent_with_its_stacks" in stacks  # where the loop was


def test_the_hung_loops_stack_is_written_whatever_the_number_of_threads(tmp_path: Path) -> None:
    """faulthandler writes the newest threads first and stops after 100: an agent with more (a controller's
    readers and pools) lost the stack of the loop that hung, its oldest thread. That one is written first."""
    stop = threading.Event()
    idle = [threading.Thread(target=stop.wait, daemon=True) for _ in range(120)]
    for t in idle:
        t.start()
    try:
        dog, clock, _ = _watchdog(tmp_path, 30.0)
        with dog.busy("engine step"):
            clock.t += 31.0
            assert dog.check()
    finally:
        stop.set()
        for t in idle:
            t.join()
    stacks = (tmp_path / "stderr").read_text()
    mine = stacks.split("most recent call first")[0]  # what comes before faulthandler's dump
    assert "The hung phase's thread (engine step)" in mine
    assert "test_the_hung_loops_stack_is_written_whatever_the_number_of_threads" in mine


def test_heartbeats_say_which_phase_runs_and_for_how_long(tmp_path: Path) -> None:
    dog, clock, _ = _watchdog(tmp_path, "auto")
    assert dog.current() == ("", 0.0)
    with dog.busy("weight load"):
        clock.t += 12.5
        assert dog.current() == ("weight load", 12.5)
    assert dog.current() == ("", 0.0)


def test_waiting_between_phases_is_never_a_hang(tmp_path: Path) -> None:
    dog, clock, said = _watchdog(tmp_path, "auto")
    with dog.busy("train"):
        clock.t += 2.0
    clock.t += 10 * FIRST_S  # waiting for samples: as long as it takes
    assert not dog.check() and said == []
    with dog.busy("train"):  # the next run may take 10 × its longest, at least the floor
        clock.t += FLOOR_S - 1
        assert not dog.check()
        clock.t += 2
        assert dog.check()
    assert said[0] == f"hung: train ran {FLOOR_S + 1:.0f} s, past its limit of {FLOOR_S:.0f} s"


def test_never_watches_nothing(tmp_path: Path) -> None:
    dog, clock, said = _watchdog(tmp_path, "never")
    with dog.busy("train"):
        clock.t += 1e9
        assert not dog.check()
    assert said == []


HANGS = """
import logging, re, sys, threading
from rlctl.agents import watchdog
logging.basicConfig(level="INFO", stream=sys.stderr)
watchdog.GRACE_S = {grace}
dog = watchdog.Watchdog("trainer-0", {timeout}, on_hang=lambda text: print("last word:", text, flush=True), tick_s=0.2)
def stuck_in_train_step():
    {hang}
with dog.busy("train"):
    stuck_in_train_step()
"""


def _run_hanging(hang: str, *, timeout: float, grace: float) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(HANGS).format(hang=hang, timeout=timeout, grace=grace)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_process_waiting_forever_in_a_phase_ends_itself() -> None:
    proc = _run_hanging("threading.Event().wait()", timeout=1.0, grace=30.0)
    assert proc.returncode == HUNG_EXIT, proc.stderr
    # how long it ran is measured: a watcher thread late on a loaded machine says 2 s
    assert re.search(r"last word: hung: train ran \d+ s, past its limit of 1 s", proc.stdout), proc.stdout
    said = r"trainer-0: train has run \d+ s, past its limit of 1 s \(hang_timeout_s 1\): it is hung"
    assert re.search(said, proc.stderr), proc.stderr
    assert "in stuck_in_train_step" in proc.stderr  # the hung thread's stack


def test_a_hang_that_holds_the_gil_is_ended_by_the_backstop() -> None:
    """A C call that never releases the GIL (a regular expression backtracking for ever): the watcher thread
    cannot run, faulthandler's timer dumps the stacks and exits."""
    proc = _run_hanging('re.match(r"(a+)+$", "a" * 64 + "b")', timeout=1.0, grace=1.5)
    assert proc.returncode == 1, proc.stderr  # faulthandler's exit status
    assert "Timeout (0:00:0" in proc.stderr
    assert "in stuck_in_train_step" in proc.stderr
    assert "last word" not in proc.stdout  # Python never ran again


def test_the_hung_loops_stack_is_written_without_reading_a_source_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop hung on a filesystem that stopped answering (the code's own mount, say): writing its stack must not
    read source lines from there too, or the watchdog would hang before its last word and its exit."""
    import linecache

    def hung(*_: object, **__: object) -> list[str]:
        raise AssertionError("read a source file")

    monkeypatch.setattr(linecache, "updatecache", hung)
    monkeypatch.setattr(linecache, "getline", hung)
    linecache.clearcache()
    text = wd.stack_text(sys._getframe())
    assert f"in {sys._getframe().f_code.co_name}" in text and text.endswith("\n")
