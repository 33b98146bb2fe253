"""Running commands on a launch target, what its two runners share: `Runner`, `CommandResult`, the shell lines.

`LocalRunner` (`rlctl.launch.localrunner`: a subprocess here) and `SshRunner` (`rlctl.launch.sshrunner`: fabric, on
an SSH host) both take an argv or a shell string, optional stdin text and a deadline, and return `CommandResult`;
anything that goes wrong *around* the command (host unreachable, auth refused, unknown host key, deadline passed,
program missing) becomes `LaunchError` naming the host. A command that ran and exited non-zero is a result, not an
error: callers decide.

Host-key policy for SSH (`connect`): `rlctl.launch.hostkeys`, the one place that decides (never fabric's default,
which accepts any key): the target's `known_hosts` file, else `~/.ssh/known_hosts`; unknown hosts and
changed keys refused unless RLCTL_SSH_HOST_KEY_CHECKING=off.
"""

from __future__ import annotations

import base64
import logging
import math
import shlex
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from rlctl.config.hosts import jump_host_parts
from rlctl.errors import LaunchError
from rlctl.launch import hostkeys
from rlctl.textutil import home_path

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
        """`[user@]host:port` as errors name the target; an IPv6 address in brackets, as ssh writes it
        (`rl@[fd00::9]:2022`), versus `rl@fd00::9:2022`, whose port reads as the address's last group."""
        user = f"{self.user}@" if self.user else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{user}{host}:{self.port}"

    def known_hosts_path(self) -> Path:
        return hostkeys.known_hosts_path(self.known_hosts)


def jump_target(
    spec: str, *, known_hosts: str | None, key_file: str | None = None, connect_timeout_s: float = 10.0
) -> SshTarget:
    """The bastion of a `proxy_jump: [user@]host[:port]` (as `ssh -J` takes it, `[fd00::1]:2222` too): fabric refuses
    a port written both in the host and as its own argument. It is logged in to with the site's `key_file` (None: the
    user's keys and agent), as the site's hosts are, then the user's own keys and agent (the dry-run's ProxyCommand:
    the site's key, then the user's default key files, agent keys of other files not offered): a bastion that knows
    only the site's key refused the user's default ones, and one that knows only the user's still takes those."""
    user, host, port = jump_host_parts(spec)  # (checked as the inventory was read)
    return SshTarget(
        host,
        user=user or None,
        port=int(port) if port else 22,
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
        kwargs["key_filename"] = str(home_path(target.key_file, named="key_file"))
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
    """Runs one command where the backend's tools live (login node, SSH host); `timeout_s` math.inf: no deadline."""

    where: str

    def run(self, command: str, *, timeout_s: float, stdin: str | None = None) -> CommandResult: ...

    def close(self) -> None: ...


# after SIGTERM, how long a timed-out command's group has to end (srun cancels its step): here (`LocalRunner`) and on an
# SSH host (`SshRunner`: the host's own `timeout` line)
END_GRACE_S = 3.0


def deadline_or_none(timeout_s: float | None, *, where: str) -> float | None:
    """A runner's deadline as its waits take it: None for none (`timeout_s` None or math.inf, a computed deadline's
    "unbounded"), else `timeout_s`: `subprocess` and the host's `timeout` line round it to a whole count, which
    inf overflowed (OverflowError). NaN and -inf are refused: no number of seconds."""
    if timeout_s is None or timeout_s == math.inf:
        return None
    if not math.isfinite(timeout_s):
        raise ValueError(f"{where}: timeout_s {timeout_s} is not a number of seconds; valid: finite, or inf for none")
    return timeout_s


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


def short_line(command: str) -> str:
    first = command.strip().splitlines()[0] if command.strip() else command
    return first if len(first) <= 80 else first[:77] + "..."


def sh_path(path: str) -> str:
    """Quote a path for a remote shell, keeping a leading `~/` expandable there."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)
