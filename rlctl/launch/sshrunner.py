"""Running a command on an SSH host (`SshRunner`, over one fabric connection): its deadline held on the host too
(`host_deadline`), stdin handed to invoke, stdout told line by line, and files copied over SFTP."""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import math
import shlex
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.errors import CommandTimeout, LaunchError
from rlctl.launch.remote import (
    END_GRACE_S,
    CommandResult,
    SshTarget,
    connect,
    deadline_or_none,
    in_bash,
    setup_first,
    short_line,
)

if TYPE_CHECKING:
    from fabric import Connection

log = logging.getLogger(__name__)

PART_SUFFIX = ".part"  # a file being copied to a host, renamed to its name once whole
PUT_CHUNK = 1 << 20


def _remote_size(sftp: Any, path: str) -> int:
    """The size of `path` on the SFTP host, 0 when it does not exist."""
    try:
        return int(sftp.stat(path).st_size or 0)
    except FileNotFoundError:
        return 0


def _rename(sftp: Any, src: str, dst: str) -> None:
    """Rename over an existing file: OpenSSH's posix-rename, else remove then rename (other SFTP servers)."""
    try:
        sftp.posix_rename(src, dst)
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        with contextlib.suppress(FileNotFoundError):
            sftp.remove(dst)
        sftp.rename(src, dst)


REMOTE_LAG_S = 2.0  # how long after ours the host's own deadline for a command comes


def host_deadline(script: str, timeout_s: float) -> str:
    """`script` (bash) as one command line the host ends by itself `REMOTE_LAG_S` past `timeout_s`: coreutils
    `timeout` sends SIGTERM to its process group (srun cancels its step), SIGKILL after `END_GRACE_S`. Our
    deadline only closes the channel, and sshd signals nothing on that (no pty): a hung `sha256sum` or `srun` ran
    on. The host's comes later, so that ours is the one met (`CommandTimeout`, not an exit 124 result). What the
    command started in a session of its own is not in the group, and `timeout` signals nothing else: it runs on,
    an agent started detached (as meant) and a `setsid` child that still holds the command's stdout or stderr
    alike, the latter unlike `LocalRunner`'s, which `_end_group` ends (found by the pipe in /proc). `timeout_s` is
    finite: `SshRunner.run` runs a command with none (None, math.inf) without this line.

        timeout -k G S bash ─ (trap TERM: outlive G) ─ bash -c SCRIPT ─ its children (one group)

    `timeout` sends its SIGKILL only while its own child lives, so that child (a bash waiting on the script's)
    traps the SIGTERM and sleeps past the grace: else a member that ignores SIGTERM (`trap '' TERM`) ran on, as
    `timeout` left once the script's bash died of the SIGTERM. The script runs in the waiter's foreground (its
    trap runs once the script's bash is gone): an asynchronous list (`&`) of a bash without job control starts
    with SIGINT and SIGQUIT ignored, which no later trap undoes and what it starts inherits (an agent). The
    waiter's own stderr is /dev/null (the script's is the channel's): it says "Terminated" of the script's bash,
    and on the channel our deadline closed that write killed it (SIGPIPE) before its trap, `timeout` with it."""
    grace_s, deadline_s = math.ceil(END_GRACE_S), max(1, math.ceil(timeout_s + REMOTE_LAG_S))  # (0: none)
    quiet = "exec 3>&2 2>/dev/null"  # (the waiter's own stderr)
    waiter = f"trap 'sleep {grace_s + 1}; exit 143' TERM\n{quiet}\nbash -c {shlex.quote(script)} 2>&3 3>&-"
    return f"timeout -k {grace_s} {deadline_s} {in_bash(waiter)}"


class SshRunner:
    """Runs shell commands on one SSH host over one connection, opened on first use (each after `setup` lines)."""

    def __init__(self, target: SshTarget, env: dict[str, str] | None = None, setup: list[str] | None = None) -> None:
        self.target = target
        self.where = target.label
        self.env = env or {}
        self.setup = list(setup or [])
        self._conn: Connection | None = None

    def run(
        self,
        command: str,
        *,
        timeout_s: float | None,
        stdin: str | None = None,
        on_line: Callable[[str], None] | None = None,
        hold_stdin: threading.Event | None = None,
    ) -> CommandResult:
        """Run `command` there. `on_line`: told each line of its stdout as it comes; `hold_stdin`: its stdin (`stdin`,
        else nothing) stays open until the event is set, or the command ends, then ends (a server told to stop, a
        fetch killed by its watcher). `timeout_s` None or math.inf: no deadline, here or on the host
        (`host_deadline`)."""
        from invoke.exceptions import CommandTimedOut, ThreadException

        timeout_s = deadline_or_none(timeout_s, where=self.where)
        conn = self._open()
        prefix = "".join(f"export {k}={shlex.quote(v)}; " for k, v in self.env.items())
        in_stream: Any = False
        if hold_stdin is not None:
            in_stream = _HeldInput(hold_stdin, stdin or "")
        elif stdin is not None:
            in_stream = _ChunkedInput(stdin)
        script = prefix + setup_first(self.setup, command)
        line = command  # (a command of its own reaches the login shell as it is: any shell runs a plain command line)
        if timeout_s is not None:
            line = host_deadline(script, timeout_s)
        elif prefix or self.setup:
            line = in_bash(script)
        started = time.monotonic()
        try:
            res = conn.run(
                line,
                hide=True,
                warn=True,
                timeout=timeout_s,
                in_stream=in_stream,
                out_stream=_Lines(on_line) if on_line is not None else None,
            )
        except CommandTimedOut as e:
            self.close()
            raise self._timeout(command, timeout_s, e.result) from e
        except (OSError, EOFError) as e:  # socket timeouts are OSError
            self.close()
            raise LaunchError(f"ssh {self.where}: connection lost running '{short_line(command)}': {e}") from e
        except ThreadException as e:  # a stream thread failed (e.g. `on_line` raised)
            self.close()
            raise LaunchError(f"ssh {self.where}: '{short_line(command)}': {e}") from e
        # invoke's deadline timer closes the channel and counts as expired only once that close returned: read
        # before, it is a result with no exit status (-1), versus the CommandTimeout it is (seen in CI: the
        # SIGTERM-ignoring command of test_ssh_command_deadline "did not raise")
        if timeout_s is not None and res.exited == -1 and time.monotonic() - started >= timeout_s:
            self.close()
            raise self._timeout(command, timeout_s, res)
        return CommandResult(int(res.exited), str(res.stdout), str(res.stderr))

    def _timeout(self, command: str, timeout_s: float | None, result: Any) -> CommandTimeout:
        return CommandTimeout(
            f"ssh {self.where}: '{short_line(command)}' did not finish within {timeout_s:g} s",
            stdout=str(result.stdout or ""),
            stderr=str(result.stderr or ""),
        )

    def put(
        self,
        local: Path,
        remote: str,
        *,
        timeout_s: float = 300.0,
        progress: Callable[[int], None] | None = None,
        resume: bool = False,
    ) -> int:
        """Copy one file to an absolute path on the host over SFTP, keeping its mode (a 0600 secret stays 0600):
        into `<remote>.part`, renamed once whole, so a copy cut short (a lost link, a stopped launch) goes on from
        the bytes that arrived (`resume`; the caller checks the result's SHA-256). `progress` is told each chunk's
        bytes (the resumed ones at once); `timeout_s`: the longest the transfer may stall. Returns the bytes taken
        as already there."""
        conn = self._open()
        part = remote + PART_SUFFIX
        try:
            sftp = conn.sftp()
            sftp.get_channel().settimeout(timeout_s)
            st = local.stat()
            have = _remote_size(sftp, part) if resume else 0
            have = have if have <= st.st_size else 0
            with local.open("rb") as src, sftp.open(part, "r+b" if have else "wb") as dst:
                dst.set_pipelined(True)
                src.seek(have)
                dst.seek(have)
                if progress is not None and have:
                    progress(have)
                while chunk := src.read(PUT_CHUNK):
                    dst.write(chunk)
                    if progress is not None:
                        progress(len(chunk))
            try:
                sftp.chmod(part, st.st_mode & 0o777)
                _rename(sftp, part, remote)
            except FileNotFoundError:  # another launch copying the same file (a shared model) renamed it first
                if _remote_size(sftp, remote) != st.st_size:
                    raise
        except (OSError, EOFError) as e:
            self.close()
            raise LaunchError(f"ssh {self.where}: cannot copy {local} to {remote}: {e or type(e).__name__}") from e
        return have

    def get(self, remote: str, local: Path, *, timeout_s: float = 300.0) -> None:
        """Copy one file from the host over SFTP (`timeout_s`: the longest the transfer may stall)."""
        conn = self._open()
        try:
            conn.sftp().get_channel().settimeout(timeout_s)
            conn.get(remote, str(local))
        except (OSError, EOFError) as e:
            self.close()
            raise LaunchError(f"ssh {self.where}: cannot copy {remote} to {local}: {e or type(e).__name__}") from e

    def get_range(self, remote: str, local: Path, start: int, end: int, *, timeout_s: float = 300.0) -> None:
        """Copy bytes [start, end) of a file on the host over SFTP, reads pipelined (`timeout_s`: the longest the
        transfer may stall); fewer when the file is shorter."""
        conn = self._open()
        try:
            sftp = conn.sftp()
            sftp.get_channel().settimeout(timeout_s)
            with sftp.open(remote, "rb") as src, local.open("wb") as dst:
                src.seek(start)
                src.prefetch(end)  # every read of [start, end) requested at once, as `get` does for a whole file
                left = end - start
                while left > 0 and (chunk := src.read(min(left, PUT_CHUNK))):
                    dst.write(chunk)
                    left -= len(chunk)
        except (OSError, EOFError) as e:
            self.close()
            raise LaunchError(f"ssh {self.where}: cannot copy {remote} to {local}: {e or type(e).__name__}") from e

    def _open(self) -> Connection:
        """The connection, opened on first use, its commands run by `_deadline_safe_remote`'s runner."""
        if self._conn is None:
            conn = connect(self.target)
            conn.config.runners.remote = _deadline_safe_remote()
            self._conn = conn
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@functools.cache
def _deadline_safe_remote() -> type:
    """fabric's runner of a command (`Remote`) whose deadline cannot print a traceback.

    invoke meets a command's deadline in a timer thread of its own, which closes the channel (`Remote.kill`): the
    channel counts as closed at once, and its EOF and close messages are written after. The run, woken by the
    close, may return first (a result with no exit status, -1: `SshRunner.run` makes it the CommandTimeout it is)
    and the connection be closed (ours, or lost) while the timer is still writing: that write's EOFError (a closed
    socket) ended the thread, a traceback on the user's terminal ("Exception in thread … (kill)"). The close is
    moot then (the channel is closed here, the host ends the command by its own deadline, `host_deadline`): said
    at debug level."""
    from fabric.runners import Remote
    from paramiko import SSHException

    class DeadlineSafeRemote(Remote):
        def kill(self) -> None:
            try:
                super().kill()
            except (EOFError, OSError, SSHException) as e:  # (paramiko writes a closed socket as EOFError)
                log.debug("ssh %s: closing the channel at the deadline: %s", self.context.host, repr(e))

    return DeadlineSafeRemote


class _ChunkedInput(io.StringIO):
    """stdin for invoke, which reads a non-terminal stream one byte per 10 ms: hand it 64 KiB at a time."""

    def read(self, size: int | None = -1) -> str:
        return super().read(65536 if size is not None and size >= 0 else size)


class _HeldInput(io.StringIO):
    """stdin for invoke: `text` (64 KiB at a time), then open until `until` is set: invoke polls it (None: nothing
    yet), then '' ends it."""

    def __init__(self, until: threading.Event, text: str = "") -> None:
        super().__init__(text)
        self.until = until

    def read(self, size: int | None = -1) -> str | None:  # type: ignore[override]
        if chunk := super().read(65536):
            return chunk
        return "" if self.until.is_set() else None


class _Lines(io.StringIO):
    """stdout for invoke: each whole line to `on_line` as it arrives (invoke also keeps the whole output)."""

    def __init__(self, on_line: Callable[[str], None]) -> None:
        super().__init__()
        self.on_line, self._rest = on_line, ""

    def write(self, s: str) -> int:
        *lines, self._rest = (self._rest + s).split("\n")
        for line in lines:
            self.on_line(line)
        return len(s)
