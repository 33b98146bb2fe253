"""A launcher that outlives its terminal: `rlctl launch --detach`, and an attached launcher's SIGHUP.

The launcher watches its job to the end: it fetches the controller's record, runs the held-out evaluation and
records the outcome in the job index. Jobs run for days, terminals do not. `--detach` starts the same launcher
as a child in its own session (no controlling terminal: no SIGHUP), its output in the job dir's
`logs/launcher.log`; this process shows the child's lines as they come until the child says the job started (one
JSON line on an inherited pipe), then returns.

    rlctl launch --detach ──spawn──▶ rlctl launch (own session) ──▶ stage, start agents ──{"started"}──▶ pipe
        │ copies the child's start log to stderr and launcher.log       │ the rest of it, then its output, to
        │                                                               │ launcher.log; watches
        ├─ the line ──▶ prints the job, the launcher's pid; exit 0       └─ the job: record, held-out, index state
        ├─ EOF (the child ended first) ──▶ the child's exit code (its error is in the lines shown)
        └─ Ctrl-C ──▶ SIGTERM to the child: its `finally` stops what it started

Until it says the job started, the child writes to a start log of its own (`logs/.launcher.start-PID-NS.log`:
its parent's pid and a clock reading), which this process copies on: launcher.log is shared by every launcher of
the job, and two `launch -d --resume` a moment apart each showed the other's lines as its own (the winner printed
the loser's `has a launcher already`).

An attached launcher whose terminal goes away (SIGHUP: the operator's SSH session dropped) goes on the same way:
its output moves to `logs/launcher.log` and it keeps watching. Without that, SIGHUP ended it and left the job
running unwatched (its index entry "running" after the job ended, no held-out figures).

The job index records each job's launcher (`this_launcher`: pid, host, pid space); `launcher_running` says whether
it still runs, for `rlctl status`, `rlctl logs JOB launcher -f` and `rlctl attach` (which takes over from one that is
gone).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from rlctl import procfs

LOG_NAME = "launcher.log"
READY_FD_ENV = "RLCTL_LAUNCH_READY_FD"  # the write end of the pipe the child says "started" on
LOG_ENV = "RLCTL_LAUNCH_LOG"  # the job's launcher.log, where the child's output goes once it said so
START_LOG_ENV = "RLCTL_LAUNCH_START_LOG"  # the child's own log until then (the process that waits copies it on)
POLL_S = 0.2

_hung_up = threading.Event()


def log_path(job_dir: Path) -> Path:
    return job_dir / "logs" / LOG_NAME


@dataclass
class Detached:
    """A launcher started in its own session, the read end of the pipe it says "started" on, the job's launcher.log
    and the child's own log until then (`start_log`: what of it was copied on, `offset`)."""

    proc: subprocess.Popen[bytes]
    ready_fd: int
    log: Path
    start_log: Path
    offset: int = 0

    def follow(self, write: Callable[[bytes], None]) -> dict[str, Any] | None:
        """Copy the launcher's lines to `write` (and launcher.log) as they come until it says the job started (its
        JSON object) or ends first (None: `proc.returncode` says how; its last lines were copied)."""
        got = b""
        try:
            while True:
                readable, _, _ = select.select([self.ready_fd], [], [], POLL_S)
                self._copy(write)
                if not readable:
                    continue
                chunk = os.read(self.ready_fd, 4096)
                if chunk:
                    got += chunk
                    if not got.endswith(b"\n"):
                        continue
                    self._finish(write)  # what it wrote just before (it writes to launcher.log from now on)
                    return dict(json.loads(got))
                self.proc.wait()  # EOF before the line: the launcher ended (or closed the pipe as it ended)
                self._finish(write)
                return None
        finally:
            os.close(self.ready_fd)

    def _copy(self, write: Callable[[bytes], None] | None) -> None:
        """The child's new lines to `write` (from `offset`) and to launcher.log (`copy_on`: what is not there yet)."""
        try:
            with _holding(self.start_log):
                copy_on(self.start_log, self.log)
            with self.start_log.open("rb") as f:
                f.seek(self.offset)
                new = f.read()
        except FileNotFoundError:
            return
        if new and write is not None:
            write(new)
        self.offset += len(new)

    def _finish(self, write: Callable[[bytes], None] | None) -> None:
        self._copy(write)
        self.start_log.unlink(missing_ok=True)
        _copied(self.start_log).unlink(missing_ok=True)

    def cancel(self, grace_s: float = 60.0) -> int:
        """Ctrl-C while it starts: SIGTERM (it stops what it started, as on Ctrl-C in an attached launch); its
        lines go on to launcher.log."""
        self.proc.terminate()
        try:
            code = self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._finish(None)
        return code


def _copied(start_log: Path) -> Path:
    """How many bytes of the start log are in launcher.log: whoever copies on records it here (the waiting process
    while it follows, the child as it says it started, which of them is last), so that none is copied twice."""
    return start_log.with_name(start_log.name + ".copied")


@contextlib.contextmanager
def _holding(start_log: Path) -> Iterator[None]:
    """The start log's lock (flock), held by whoever copies it on; FileNotFoundError when it is gone."""
    fd = os.open(start_log, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def copy_on(start_log: Path, log: Path) -> None:
    """Under `_holding`: the start log's bytes not in `log` yet appended to it, and the count recorded."""
    record = _copied(start_log)
    done = int(record.read_text() or 0) if record.exists() else 0
    with start_log.open("rb") as f:
        f.seek(done)
        new = f.read()
    if new:
        with log.open("ab") as out:
            out.write(new)
        record.write_text(str(done + len(new)))


def spawn(args: list[str], log: Path, *, env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = ()) -> Detached:
    """`rlctl ARGS` in a new session (`start`), its header line in `log` (`log_header`) before any of its lines."""
    child = start([sys.executable, "-m", "rlctl", *args], log, env=env, pass_fds=pass_fds)
    log_header(log, pid=child.proc.pid, args=args, detached=True)
    return child


HEADER = re.compile(r"^(?P<t>\S+ \S+) launcher pid (?P<pid>\d+) on (?P<host>\S+) \((?P<how>detached|in a terminal)\): ")
DETACHED = "its output follows here"
IN_A_TERMINAL = "its output goes to that terminal, not here (here once the terminal goes away)"


def log_header(log: Path, *, pid: int, args: list[str], detached: bool) -> None:
    """One line in the job's launcher.log as a launcher begins (time, pid, host, what it runs, where its output
    goes): the log is every launcher's, appended, and a foreground launcher writes nothing else to it; before, the
    log said nothing of which launcher wrote what, and after a foreground resume `rlctl logs JOB launcher` showed an
    earlier launcher's ending as the job's last word."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    how = "detached" if detached else "in a terminal"
    line = f"{stamp} launcher pid {pid} on {socket.gethostname()} ({how}): rlctl {shlex.join(args)}; "
    line += f"{DETACHED if detached else IN_A_TERMINAL}\n"
    with contextlib.suppress(OSError):  # (a full disk: the launch goes on; its log is a convenience)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as f:
            f.write(line)


def latest_in_terminal(log: Path) -> str | None:
    """When the latest launcher of `log` (its last header) ran in a terminal and its output never moved here (no
    SIGHUP since): a line that says so, for `rlctl logs JOB launcher` (the lines before it are earlier launchers');
    None otherwise."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    last = next((i for i in range(len(lines) - 1, -1, -1) if HEADER.match(lines[i])), None)
    if last is None:
        return None
    m = HEADER.match(lines[last])
    assert m is not None
    if m["how"] != "in a terminal" or any("the terminal went away (SIGHUP)" in line for line in lines[last + 1 :]):
        return None
    return (
        f"the job's latest launcher (pid {m['pid']} on {m['host']}, began {m['t']}) runs in a terminal and writes "
        "its output there: the lines before its header are an earlier launcher's"
    )


def start(argv: list[str], log: Path, *, env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = ()) -> Detached:
    """`argv` in a new session: stdin /dev/null, stdout and stderr to a start log of its own beside `log` until it
    says it started (`say_started` moves them to `log`), the write end of a pipe inherited (its number in
    READY_FD_ENV), `env` added to this process's environment; `pass_fds` inherited too (a resume's launcher lock)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start_log = log.with_name(f".{log.stem}.start-{os.getpid()}-{time.monotonic_ns()}.log")
    r, w = os.pipe()
    try:
        with start_log.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(w, *pass_fds),
                env={
                    **os.environ,
                    **(env or {}),
                    READY_FD_ENV: str(w),
                    LOG_ENV: str(log),
                    START_LOG_ENV: str(start_log),
                },
            )
    except BaseException:
        os.close(r)
        start_log.unlink(missing_ok=True)
        raise
    finally:
        os.close(w)
    return Detached(proc, r, log, start_log)


def spawned() -> bool:
    """Whether this process is a launcher `spawn` started (detached) that has not said it started yet."""
    return READY_FD_ENV in os.environ


def say_started(info: dict[str, Any]) -> None:
    """In a launcher started by `spawn`: its output moves to the job's launcher.log, then the job started: the
    process waiting in `Detached.follow` returns. Nothing when this launcher was not spawned so."""
    fd = os.environ.pop(READY_FD_ENV, None)
    if fd is None:
        return
    log, start_log = os.environ.pop(LOG_ENV, None), os.environ.pop(START_LOG_ENV, None)
    if log is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        # what the waiting process has not copied on yet, then this process's output after it: in order, once
        with contextlib.ExitStack() as held:
            if start_log is not None:
                with contextlib.suppress(OSError):
                    held.enter_context(_holding(Path(start_log)))
                    copy_on(Path(start_log), Path(log))
            _output_to(Path(log))
    try:
        os.write(int(fd), (json.dumps(info) + "\n").encode())
        os.close(int(fd))
    except (OSError, ValueError):  # the waiting process is gone (killed): the start log is this process's to remove
        if start_log is not None:
            Path(start_log).unlink(missing_ok=True)
            _copied(Path(start_log)).unlink(missing_ok=True)


def _output_to(log: Path) -> None:
    """This process's stdout and stderr appended to `log` from now on, stdin /dev/null."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    for target, source in ((0, null), (1, fd), (2, fd)):
        os.dup2(source, target)
    os.close(fd)
    os.close(null)


def survive_hangup(log: Path) -> None:
    """From now on, a SIGHUP (the terminal went away) moves this process's stdout and stderr to `log` and is
    otherwise ignored, so that the launcher goes on watching its job. One that comes while a live frame is drawn
    (`terminal_frame`) moves them once the frame is whole: the rest of it went to the log (a terminal's escape codes
    in it, CI once)."""

    def moved(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if _drawing[0]:
            _drawing[1] = log
        else:
            _move(log)

    signal.signal(signal.SIGHUP, moved)


_drawing: list[Any] = [0, None]  # live frames being drawn (the main thread's), the log a SIGHUP meanwhile named


@contextlib.contextmanager
def terminal_frame() -> Iterator[None]:
    """A frame of the live display, drawn whole to the terminal: a SIGHUP meanwhile moves the output after it."""
    _drawing[0] += 1
    try:
        yield
    finally:
        _drawing[0] -= 1
        if not _drawing[0] and _drawing[1] is not None:
            log, _drawing[1] = _drawing[1], None
            with contextlib.suppress(OSError):  # a terminal gone: what was left of the frame is for no one
                sys.stderr.flush()
            _move(log)


def _move(log: Path) -> None:
    """The output moved to `log`, its first line the reason (written before the move: another thread's line after)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with contextlib.suppress(OSError), log.open("a") as f:
        f.write(f"{stamp} the terminal went away (SIGHUP); this launcher keeps watching the job\n")
    _output_to(log)
    _hung_up.set()


def hung_up() -> bool:
    """Whether a SIGHUP moved this process's output to its job's log (`survive_hangup`)."""
    return _hung_up.is_set()


def this_launcher() -> dict[str, Any]:
    """What the job index records of the launcher watching a job (`launcher_state` reads it back): its pid, host and
    pid space (`procfs.pid_space`)."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "pid_space": procfs.pid_space()}


def launcher_running(info: Any) -> bool | None:
    """Whether the launcher `this_launcher` recorded still runs; None when this machine cannot tell (another
    host, or another pid space under this host name: a container of another machine, whose pid was read here as a
    launcher gone and `rlctl attach` took over from one that watched; or no record). A record without a pid space,
    an older rlctl's, goes by its host alone (`procfs.pids_here`)."""
    if (
        not isinstance(info, dict)
        or not procfs.pids_here(info.get("host"), info.get("pid_space"))
        or not isinstance(info.get("pid"), int)
    ):
        return None
    try:
        cmdline = Path(f"/proc/{info['pid']}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:
        return None
    return b"rlctl" in cmdline  # the pid may be another process's by now


def dir_gone(path: Path) -> bool:
    """Whether the job dir `path` is gone here: missing, or its filesystem does not answer (a stale NFS handle, a
    mount this user may not enter: `Path.is_dir` raises on those, and `status --all` failed on one row)."""
    try:
        return not path.is_dir()
    except OSError:
        return True


def launcher_state(
    info: Any, *, ended: bool, job_dir: str | Path | None = None, source: str | None = None
) -> str | None:
    """One line for `status`: which launcher watches the job (`ended`: the index says the job ended), and whether
    it still runs. One gone before it prepared the job (`job_dir` holds no job.json; a `job_dir` gone altogether
    is said as such) left nothing to watch: it names the launch anew (`source`: the job file its row recorded),
    which `rlctl attach` refuses to do."""
    if not isinstance(info, dict):
        return None
    where = f"pid {info.get('pid')} on {info.get('host')}"
    running = launcher_running(info)
    if running is None:
        return f"{where} (another machine or container: not checked)"
    if running:
        return f"{where}, watching" if not ended else f"{where}, finishing"
    if ended:
        return f"{where}, ended"
    if job_dir is not None and dir_gone(Path(job_dir)):  # its row outlived it: not a job never prepared
        return f"{where}, gone; so is its job directory (removed, or not mounted on this machine)"
    if job_dir is not None and not (Path(job_dir) / "job.json").exists():
        from rlctl.ops.jobprep import launch_again

        return f"{where}, gone before it prepared the job: nothing runs (launch it anew: `{launch_again(source)}`)"
    return f"{where}, gone: nothing watches the job (`rlctl attach` watches it again; `rlctl status` reads its end)"
