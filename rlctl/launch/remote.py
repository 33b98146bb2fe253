"""Running commands on a launch target: here (subprocess) or on an SSH host (fabric), one error type.

Both runners take an argv or a shell string, optional stdin text and a deadline, and return
`CommandResult`; anything that goes wrong *around* the command (host unreachable, auth refused,
unknown host key, deadline passed, program missing) becomes `LaunchError` naming the host.
A command that ran and exited non-zero is a result, not an error: callers decide.

Host-key policy for SSH: `rlctl.launch.hostkeys`, the one place that decides (never fabric's default,
which accepts any key): the target's `known_hosts` file, else `~/.ssh/known_hosts`; unknown hosts and
changed keys refused unless RLCTL_SSH_HOST_KEY_CHECKING=off.
"""

from __future__ import annotations

import base64
import contextlib
import io
import logging
import math
import os
import shlex
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rlctl.errors import CommandTimeout, LaunchError
from rlctl.launch import hostkeys

if TYPE_CHECKING:
    from fabric import Connection

log = logging.getLogger(__name__)


class RemoteState(StrEnum):
    """Where a launched agent (SLURM job or SSH process group) stands, as far as its backend can tell."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETING = "completing"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"

    @property
    def active(self) -> bool:
        return self in (RemoteState.PENDING, RemoteState.RUNNING, RemoteState.COMPLETING)


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str

    def tail(self) -> str:
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return text[-1][:300] if text else f"exit {self.exit_code}"


@dataclass(frozen=True)
class SshTarget:
    host: str
    user: str | None = None
    port: int = 22
    key_file: str | None = None
    known_hosts: str | None = None
    proxy_jump: str | None = None
    connect_timeout_s: float = 10.0
    # with a key_file, the user's own keys and agent after it (a bastion, as the dry-run's ProxyCommand offers
    # its key files after the site's), not that key alone
    own_keys_too: bool = False

    @property
    def label(self) -> str:
        user = f"{self.user}@" if self.user else ""
        return f"{user}{self.host}:{self.port}"

    def known_hosts_path(self) -> Path:
        return hostkeys.known_hosts_path(self.known_hosts)


def jump_target(
    spec: str, *, known_hosts: str | None, key_file: str | None = None, connect_timeout_s: float = 10.0
) -> SshTarget:
    """The bastion of a `proxy_jump: [user@]host[:port]` (as `ssh -J` takes it): fabric refuses a port written both
    in the host and as its own argument. It is logged in to with the site's `key_file` (None: the user's keys and
    agent), as the site's hosts are, then the user's own keys and agent (the dry-run's ProxyCommand: the site's key,
    then the user's default key files, agent keys of other files not offered): a bastion that knows only the
    site's key refused the user's default ones, and one that knows only the user's still takes those."""
    user, _, rest = spec.rpartition("@")
    host, port = rest, 22
    if rest.count(":") == 1 and (p := rest.partition(":")[2]).isdigit():  # host:port (not a bare IPv6 address)
        host, port = rest.partition(":")[0], int(p)
    return SshTarget(
        host,
        user=user or None,
        port=port,
        key_file=key_file,
        known_hosts=known_hosts,
        connect_timeout_s=connect_timeout_s,
        own_keys_too=True,
    )


def connect(target: SshTarget) -> Connection:
    """An open fabric Connection with the strict host-key policy of this module."""
    try:
        import paramiko
        from fabric import Connection
    except ImportError as e:  # pragma: no cover - fabric is a core dependency
        raise LaunchError(f"fabric is not installed ({e})", hint="pip install 'fabric>=3.2'") from e

    own_keys = target.key_file is None or target.own_keys_too
    kwargs: dict[str, object] = {
        "look_for_keys": own_keys,
        "allow_agent": own_keys,
        "banner_timeout": target.connect_timeout_s,
        "auth_timeout": target.connect_timeout_s,
    }
    if target.key_file:
        kwargs["key_filename"] = str(Path(target.key_file).expanduser())
    gateway = None
    if target.proxy_jump:
        jump = jump_target(
            target.proxy_jump,
            known_hosts=target.known_hosts,
            key_file=target.key_file,
            connect_timeout_s=target.connect_timeout_s,
        )
        gateway = connect(jump)
    conn = Connection(
        target.host,
        user=target.user,
        port=target.port,
        connect_timeout=max(1, round(target.connect_timeout_s)),
        connect_kwargs=kwargs,
        gateway=gateway,
    )
    known = hostkeys.apply(conn.client, known_hosts=target.known_hosts)
    try:
        conn.open()
    except paramiko.SSHException as e:  # BadHostKeyException included
        refused = hostkeys.refusal(e, label=target.label, host=target.host, port=target.port, known=known)
        raise refused or LaunchError(f"ssh {target.label}: {e}") from e
    except (OSError, EOFError) as e:  # socket.timeout, refused, no route, DNS
        raise LaunchError(f"ssh {target.label}: cannot connect: {e or type(e).__name__}") from e
    return conn


class Runner(Protocol):
    """Runs one command where the backend's tools live (login node, SSH host)."""

    where: str

    def run(self, command: str, *, timeout_s: float, stdin: str | None = None) -> CommandResult: ...

    def close(self) -> None: ...


def setup_first(setup: list[str], command: str) -> str:
    """`command` after a site's `setup` lines (`module load slurm`, a virtualenv's activation), in the same shell:
    a cluster's SLURM tools are often on PATH only after them. The lines read no stdin (sbatch's script is the
    command's) and print to stderr (the command's stdout is parsed: a job id); one that fails does not stop the
    command, as in the SLURM batch script."""
    if not setup:
        return command
    return "\n".join(["{", *setup, "} </dev/null >&2", command])


def in_bash(script: str) -> str:
    """`script` (bash, of any lines) as one command line that bash runs whatever the SSH user's login shell (sshd
    hands it to that shell: a tcsh or fish one read a Bourne `{ …setup… } </dev/null >&2` or `export` as an error):
    the script base64-encoded inside single quotes, which sh, tcsh and fish all pass on unchanged (a quoted newline
    is not: tcsh refuses it). Bash runs it as it runs the agents' `bash -s` scripts: not a login shell."""
    encoded = base64.b64encode(script.encode()).decode()
    return f"bash -c 'eval \"$(echo {encoded} | base64 -d)\"'"


class LocalRunner:
    """Runs shell commands here with an optional environment overlay (e.g. SLURM_CONF), after `setup` lines."""

    where = "localhost"

    def __init__(self, env: dict[str, str] | None = None, setup: list[str] | None = None) -> None:
        self.env = {**os.environ, **(env or {})}
        self.setup = list(setup or [])

    def run(self, command: str, *, timeout_s: float, stdin: str | None = None) -> CommandResult:
        """Run `command` in bash, in a process group of its own: past `timeout_s` the whole group is ended
        (`_end_group`), not bash alone — what it started (a probe's `srun` after setup lines, a pipeline's commands)
        outlived it, a SLURM step left queued."""
        proc = subprocess.Popen(
            ["bash", "-c", setup_first(self.setup, command)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(stdin if stdin is not None else "", timeout=timeout_s)
        except subprocess.TimeoutExpired:
            out, err = _end_group(proc)
            raise CommandTimeout(
                f"{self.where}: '{_short(command)}' did not finish within {timeout_s:g} s", stdout=out, stderr=err
            ) from None
        return CommandResult(proc.returncode, out, err)

    def close(self) -> None:
        pass


END_GRACE_S = 3.0  # after SIGTERM, how long a timed-out command's group has to end (srun cancels its step)


def _end_group(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """End the process group `proc` leads, and what holds its stdout or stderr open from outside the group (a
    `setsid` child: its own session): SIGTERM (srun then cancels its step: a SIGKILLed srun leaves it queued),
    SIGKILL after `END_GRACE_S`. What it printed, before its deadline and as it ended. What left the group and
    holds neither (an agent started detached, its output to its log) was meant to outlive the command and runs on;
    one holding it that this user cannot signal is not waited for past a second grace."""
    out, err = "", ""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        holders = _output_holders(proc)
        with contextlib.suppress(ProcessLookupError):  # every member gone already
            os.killpg(proc.pid, sig)
        for pid in holders:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        try:
            more_out, more_err = proc.communicate(timeout=END_GRACE_S)
        except subprocess.TimeoutExpired as e:  # (`communicate` keeps what it read: the next call returns it too)
            out, err = _text(e.stdout), _text(e.stderr)
            continue
        return more_out or "", more_err or ""
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    proc.wait()
    return out, err


def _output_holders(proc: subprocess.Popen[str]) -> list[int]:
    """The processes holding the write end of `proc`'s stdout or stderr pipe (one `communicate` has not read to
    its end), found by the pipe in /proc/PID/fd: by what it holds, not by ancestry, which ends where a parent
    exited (a `setsid cmd &` whose shell was gone). Not this process (the read ends)."""
    pipes = {f"pipe:[{os.fstat(s.fileno()).st_ino}]" for s in (proc.stdout, proc.stderr) if s and not s.closed}
    holders = []
    for pid in os.listdir("/proc") if pipes else []:
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone meanwhile, or another user's
            continue
        if any(_writes_to(pipes, f"/proc/{pid}", fd) for fd in fds):
            holders.append(int(pid))
    return holders


def _writes_to(pipes: set[str], proc_dir: str, fd: str) -> bool:
    """Descriptor `fd` of the process at `proc_dir` is one of `pipes`, open for writing (`flags:` is octal)."""
    try:
        if os.readlink(f"{proc_dir}/fd/{fd}") not in pipes:
            return False
        with open(f"{proc_dir}/fdinfo/{fd}") as f:
            flags = next(int(line.split()[1], 8) for line in f if line.startswith("flags:"))
    except OSError:  # closed meanwhile
        return False
    return flags & os.O_ACCMODE != os.O_RDONLY


def _text(out: bytes | str | None) -> str:
    """What a command printed before its deadline (`TimeoutExpired` keeps it as bytes, text mode or not)."""
    return out.decode(errors="replace") if isinstance(out, bytes) else out or ""


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
    on. The host's comes later, so that ours is the one met (`CommandTimeout`, not an exit 124 result); what the
    command started in a session of its own (an agent) is not in the group and runs on.

        timeout -k G S bash ─ (trap TERM: outlive G) ─ bash -c SCRIPT ─ its children (one group)

    `timeout` sends its SIGKILL only while its own child lives, so that child (a bash waiting on the script's)
    traps the SIGTERM and sleeps past the grace: else a member that ignores SIGTERM (`trap '' TERM`) ran on, as
    `timeout` left once the script's bash died of the SIGTERM."""
    grace_s, deadline_s = math.ceil(END_GRACE_S), max(1, math.ceil(timeout_s + REMOTE_LAG_S))  # (0: none)
    waiter = f"trap 'sleep {grace_s + 1}; exit 143' TERM\nbash -c {shlex.quote(script)} <&0 &\nwait $!"
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
        fetch killed by its watcher). `timeout_s` None: no deadline, here or on the host (`host_deadline`)."""
        from invoke.exceptions import CommandTimedOut, ThreadException

        if self._conn is None:
            self._conn = connect(self.target)
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
        try:
            res = self._conn.run(
                line,
                hide=True,
                warn=True,
                timeout=timeout_s,
                in_stream=in_stream,
                out_stream=_Lines(on_line) if on_line is not None else None,
            )
        except CommandTimedOut as e:
            self.close()
            raise CommandTimeout(
                f"ssh {self.where}: '{_short(command)}' did not finish within {timeout_s:g} s",
                stdout=str(e.result.stdout or ""),
                stderr=str(e.result.stderr or ""),
            ) from e
        except (OSError, EOFError) as e:  # socket timeouts are OSError
            self.close()
            raise LaunchError(f"ssh {self.where}: connection lost running '{_short(command)}': {e}") from e
        except ThreadException as e:  # a stream thread failed (e.g. `on_line` raised)
            self.close()
            raise LaunchError(f"ssh {self.where}: '{_short(command)}': {e}") from e
        return CommandResult(int(res.exited), str(res.stdout), str(res.stderr))

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
        if self._conn is None:
            self._conn = connect(self.target)
        part = remote + PART_SUFFIX
        try:
            sftp = self._conn.sftp()
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
        if self._conn is None:
            self._conn = connect(self.target)
        try:
            self._conn.sftp().get_channel().settimeout(timeout_s)
            self._conn.get(remote, str(local))
        except (OSError, EOFError) as e:
            self.close()
            raise LaunchError(f"ssh {self.where}: cannot copy {remote} to {local}: {e or type(e).__name__}") from e

    def get_range(self, remote: str, local: Path, start: int, end: int, *, timeout_s: float = 300.0) -> None:
        """Copy bytes [start, end) of a file on the host over SFTP, reads pipelined (`timeout_s`: the longest the
        transfer may stall); fewer when the file is shorter."""
        if self._conn is None:
            self._conn = connect(self.target)
        try:
            sftp = self._conn.sftp()
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

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


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


def _short(command: str) -> str:
    first = command.strip().splitlines()[0] if command.strip() else command
    return first if len(first) <= 80 else first[:77] + "..."


def sh_path(path: str) -> str:
    """Quote a path for a remote shell, keeping a leading `~/` expandable there."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)
