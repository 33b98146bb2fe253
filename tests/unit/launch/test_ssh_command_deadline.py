"""An SSH command's deadline holds on the host too: the line SshRunner hands sshd ends itself there (coreutils
`timeout`), as closing the channel at our deadline signals nothing to a command run without a pty. The line is run
here with `sh` in a session of its own, as sshd runs it, and its channel closed as ours is."""

from __future__ import annotations

import math
import os
import re
import subprocess
import time
from typing import Any

import pytest

from rlctl.launch import remote, sshrunner
from rlctl.launch.remote import SshTarget
from rlctl.launch.sshrunner import SshRunner
from tests.unit.running import running


class _Said:
    """The fabric Connection of an SshRunner: keeps the command line sshd would hand the login shell."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.timeouts: list[float | None] = []  # the deadline invoke was given here

    def run(self, line: str, *, timeout: float | None = None, **_: Any) -> Any:
        self.lines.append(line)
        self.timeouts.append(timeout)
        return type("Result", (), {"exited": 0, "stdout": "", "stderr": ""})()

    def close(self) -> None:
        pass


def _line(command: str, *, timeout_s: float | None, setup: list[str] | None = None) -> str:
    """The command line SshRunner hands sshd for `command`."""
    runner = SshRunner(SshTarget("login1"), setup=setup)
    said = _Said()
    runner._conn = said  # type: ignore[assignment]
    runner.run(command, timeout_s=timeout_s)
    (line,) = said.lines
    return line


@pytest.mark.parametrize(
    "command",
    [
        "sleep 60 & echo $!; wait",  # a child the command waits on (srun after a site's setup lines)
        "(trap '' TERM; exec sleep 60) & echo $!; wait",  # one that ignores SIGTERM: SIGKILL after the grace
    ],
)
def test_a_timed_out_ssh_command_ends_on_the_host_too(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sshrunner, "REMOTE_LAG_S", 0.0, raising=False)  # (raising: the old code had none)
    monkeypatch.setattr(sshrunner, "END_GRACE_S", 0.3)
    line = _line(command, timeout_s=0.5)
    host = subprocess.Popen(
        ["sh", "-c", line],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert host.stdout is not None and host.stderr is not None
    pid = int(host.stdout.readline())
    host.stdout.close()  # our deadline: the channel closed, the command not signalled (sshd, no pty)
    host.stderr.close()  # (both streams: a waiter that says "Terminated" on a closed stderr died of SIGPIPE)
    deadline = time.monotonic() + 8.0  # its own deadline (1 s), then the grace (1 s) before SIGKILL
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    survived = running(pid)
    if survived:  # (the old code's survivor, not left running past the test)
        os.kill(pid, 9)
    host.wait(10)
    assert not survived


def test_the_hosts_deadline_comes_after_ours() -> None:
    # the host ending the command first would make it an exit 124 result, not the CommandTimeout a probe reads
    match = re.match(r"timeout -k (\d+) (\d+) bash -c '", _line("sha256sum big", timeout_s=30))
    assert match is not None
    assert int(match[2]) > 30 and int(match[1]) >= sshrunner.END_GRACE_S


def test_a_bounded_command_keeps_its_stdin_output_and_exit_code() -> None:
    line = _line("cat; echo err >&2; exit 3", timeout_s=10)
    done = subprocess.run(["sh", "-c", line], input="in\n", capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (3, "in\n", "err\n")


@pytest.mark.parametrize("setup", [None, ["true"]])
def test_a_command_with_no_deadline_is_not_bounded(setup: list[str] | None) -> None:
    # a server or a watcher that lives until told to stop (timeout_s None) has no deadline on the host either
    line = _line("cat", timeout_s=None, setup=setup)
    assert line == ("cat" if setup is None else remote.in_bash(remote.setup_first(setup, "cat")))


@pytest.mark.parametrize("setup", [None, ["true"]])
def test_an_infinite_deadline_is_none(setup: list[str] | None) -> None:
    # math.inf, as a computed deadline says "unbounded": as None, here and on the host, versus an OverflowError
    runner = SshRunner(SshTarget("login1"), setup=setup)
    said = _Said()
    runner._conn = said  # type: ignore[assignment]
    runner.run("cat", timeout_s=math.inf)
    assert said.lines == [_line("cat", timeout_s=None, setup=setup)] and said.timeouts == [None]


@pytest.mark.parametrize("timeout_s", [math.nan, -math.inf])
def test_a_deadline_that_is_no_number_of_seconds_is_refused(timeout_s: float) -> None:
    with pytest.raises(ValueError, match=r"login1:22: timeout_s (nan|-inf) is not a number of seconds"):
        _line("cat", timeout_s=timeout_s)


def test_what_a_bounded_command_starts_does_not_ignore_sigint_or_sigquit() -> None:
    # an agent the ssh backend starts (`bash -s`, its start script, `setsid nohup …`) inherits the dispositions of
    # the line's processes: one started with SIGINT ignored has no KeyboardInterrupt (Python leaves it ignored)
    line = _line("bash -s", timeout_s=10)
    done = subprocess.run(
        ["sh", "-c", line], input="grep ^SigIgn: /proc/self/status\n", capture_output=True, text=True, timeout=30
    )
    ignored = int(done.stdout.split()[1], 16)
    assert ignored & (1 << (2 - 1) | 1 << (3 - 1)) == 0  # bit SIG-1 of the mask: SIGINT (2), SIGQUIT (3)
