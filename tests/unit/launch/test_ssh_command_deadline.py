"""An SSH command's deadline holds on the host too: the line SshRunner hands sshd ends itself there (coreutils
`timeout`), as closing the channel at our deadline signals nothing to a command run without a pty. The line is run
here with `sh` in a session of its own, as sshd runs it, and its channel closed as ours is."""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
import threading
import time
from typing import Any

import paramiko
import pytest

from rlctl.errors import CommandTimeout
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


class _Silent(paramiko.ServerInterface):
    """An in-process sshd whose commands never finish: each runs until the client's deadline closes its channel."""

    def get_allowed_auths(self, username: str) -> str:
        return "password"

    def check_auth_password(self, username: str, password: str) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        return True


def test_a_deadline_met_as_the_connection_closes_prints_no_traceback_from_invokes_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """invoke's deadline timer closes the channel in a thread of its own: the channel counts as closed at once, its
    close messages are sent after, so the run reads a result with no exit status and SshRunner closes the
    connection (a CommandTimeout) while the timer may still be writing them. The timer's write on the closed
    socket then raised EOFError in that thread: a traceback on the user's terminal ("Exception in thread …
    (kill)"). Here the race's losing order is made: the timer, past the transport's check that it is open, writes
    once the connection has closed."""
    from fabric import Config, Connection

    ours, theirs = socket.socketpair()
    server = paramiko.Transport(theirs)
    server.add_server_key(paramiko.ECDSAKey.generate())
    serving = threading.Thread(target=server.start_server, kwargs={"server": _Silent()}, daemon=True)
    serving.start()  # (start_server returns once the client's handshake is done)
    conn = Connection(
        "login1",
        user="u",
        config=Config(ssh_config=paramiko.SSHConfig()),
        connect_kwargs={"sock": ours, "password": "p", "look_for_keys": False, "allow_agent": False},
    )
    conn.client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    monkeypatch.setattr(sshrunner, "connect", lambda target: conn)

    send, close = paramiko.Transport._send_message, paramiko.Transport.close
    timer_writes: list[str] = []
    writing = threading.Event()  # the timer has passed the transport's "still open" check, and writes

    def held(self: paramiko.Transport, data: Any) -> None:
        if isinstance(threading.current_thread(), threading.Timer):  # invoke's timer, closing the channel
            writing.set()
            deadline = time.monotonic() + 30.0
            while not self.packetizer.closed and time.monotonic() < deadline:
                time.sleep(0.01)
            try:
                send(self, data)
            except BaseException as e:
                timer_writes.append(type(e).__name__)
                raise
            timer_writes.append("sent")
            return
        send(self, data)

    def closed_after_the_check(self: paramiko.Transport) -> None:
        writing.wait(30.0)
        close(self)

    monkeypatch.setattr(paramiko.Transport, "_send_message", held)
    monkeypatch.setattr(paramiko.Transport, "close", closed_after_the_check)
    thread_errors: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: thread_errors.append(repr(args.exc_value)))
    runner = SshRunner(SshTarget("login1"))
    try:
        with pytest.raises(CommandTimeout, match=r"did not finish within 0\.5 s"):
            runner.run("sleep 60", timeout_s=0.5)
        for t in threading.enumerate():
            if isinstance(t, threading.Timer):
                t.join(30.0)
    finally:
        runner.close()
        server.close()
        ours.close()
        serving.join(10.0)
    assert timer_writes and timer_writes[0] == "EOFError"  # the race was run: the timer wrote on a closed connection
    assert thread_errors == []
