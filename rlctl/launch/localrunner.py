"""Running a command here (`LocalRunner`), and ending it past its deadline with what it started: its process
group, and what left the group holding its stdout or stderr (`_end_group`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

from rlctl.errors import CommandTimeout
from rlctl.launch.remote import END_GRACE_S, CommandResult, deadline_or_none, setup_first, short_line


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
        bound_s = deadline_or_none(timeout_s, where=self.where)
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
            out, err = proc.communicate(stdin if stdin is not None else "", timeout=bound_s)
        except subprocess.TimeoutExpired:
            out, err = _end_group(proc)
            raise CommandTimeout(
                f"{self.where}: '{short_line(command)}' did not finish within {timeout_s:g} s", stdout=out, stderr=err
            ) from None
        return CommandResult(proc.returncode, out, err)

    def close(self) -> None:
        pass


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
