"""LocalRunner's deadline ends what the command started, not bash alone (a probe's srun, a pipeline's commands)."""

from __future__ import annotations

import math
import os
import time

import pytest

from rlctl.errors import CommandTimeout
from rlctl.launch import localrunner
from rlctl.launch.localrunner import LocalRunner
from tests.unit.running import running


def _gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + 5.0  # a killed process leaves /proc once its reaper runs: not at once
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(running(p) for p in pids)


def _timed_out(runner: LocalRunner, command: str) -> CommandTimeout:
    """`runner`'s timeout of `command` (1 s) once it had printed something: run again while a timeout came before
    (bash started late on a loaded machine: nothing to check yet), up to 30 s; a runner that keeps none of what it
    printed before its deadline fails there."""
    deadline = time.monotonic() + 30.0
    while True:
        with pytest.raises(CommandTimeout) as got:
            runner.run(command, timeout_s=1.0)
        if got.value.stdout or time.monotonic() >= deadline:
            return got.value


def _left_running(runner: LocalRunner, command: str) -> list[int]:
    """The pids `command` printed before `runner` timed it out (1 s) that still run 5 s past that; killed, so that
    none is left running past the test."""
    pids = [int(p) for p in _timed_out(runner, command).stdout.split()]  # what it printed before its deadline is kept
    assert pids
    survivors = [p for p in pids if running(p)] if not _gone(pids) else []
    for p in survivors:
        os.kill(p, 9)
    return survivors


@pytest.mark.parametrize(
    "command",
    [
        "sleep 60 & echo $!; wait",  # a child bash waits on (srun after a site's setup lines)
        "{ echo $BASHPID; exec sleep 60; } | { read -r p; echo $p $BASHPID; exec cat; }",  # a pipeline
        "(trap '' TERM; exec sleep 60) & echo $!; wait",  # one that ignores SIGTERM: SIGKILL after the grace
    ],
)
def test_a_timeout_ends_what_the_command_started(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(localrunner, "END_GRACE_S", 0.3, raising=False)  # (raising: the old code had none)
    assert _left_running(LocalRunner(setup=["true"]), command) == []


def test_a_timeout_keeps_the_partial_output_of_both_streams() -> None:
    got = _timed_out(LocalRunner(), "echo queued >&2; echo first; sleep 60")
    assert (got.stdout, got.stderr) == ("first\n", "queued\n")
    assert "did not finish within 1 s" in str(got)


@pytest.mark.parametrize("timeout_s", [10.0, math.inf])  # inf: no deadline, versus an OverflowError
def test_a_command_within_its_deadline_is_its_result(timeout_s: float) -> None:
    res = LocalRunner().run("cat; echo err >&2; exit 3", timeout_s=timeout_s, stdin="in\n")
    assert (res.exit_code, res.stdout, res.stderr) == (3, "in\n", "err\n")


@pytest.mark.parametrize("timeout_s", [math.nan, -math.inf])
def test_a_deadline_that_is_no_number_of_seconds_is_refused(timeout_s: float) -> None:
    with pytest.raises(ValueError, match=r"localhost: timeout_s (nan|-inf) is not a number of seconds"):
        LocalRunner().run("true", timeout_s=timeout_s)


@pytest.mark.parametrize(
    "command",
    [
        "setsid sleep 60 & echo $!; wait",  # a child in a session of its own, holding the command's stdout
        "setsid sleep 60 & echo $!",  # the same, its parent gone: ancestry in /proc no longer leads to it
        "setsid bash -c 'trap \"\" TERM; exec sleep 60' >&2 & echo $!; wait",  # stderr, SIGKILL after the grace
    ],
)
def test_a_timeout_ends_what_left_the_group_holding_the_output(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(localrunner, "END_GRACE_S", 0.3)
    assert _left_running(LocalRunner(), command) == []


def test_a_timeout_leaves_what_was_started_detached_running() -> None:
    # its own session and its output elsewhere (an agent and its log): meant to outlive the command that started it
    got = _timed_out(LocalRunner(), "setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $!; sleep 60")
    (pid,) = [int(p) for p in got.stdout.split()]
    try:
        assert running(pid)
    finally:
        os.kill(pid, 9)
