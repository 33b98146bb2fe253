"""The job dir's file locks: the flock each takes (`flock`; none where the filesystem has none: each goes on
unlocked), a lock file that cannot be opened said in one line (`open_lock`), and the launcher lock, one launcher per
job.

    launcher_lock (.launcher.lock, exclusive, not waited for)    a launch, a `launch --resume`, an `attach`: the
                                                                 job's one launcher; `launcher_holder` probes it;
                                                                 its lines name the holder and its job dir, which
                                                                 a copy of the dir keeps (`refuse_copy_of_running`)
    fetching (.record-fetch.lock, exclusive, waited for)         rlctl.launch.record: one fetch of the record here
    summary_lock (.summary.lock, exclusive, waited for)          rlctl.launch.record: one read-change-write of
                                                                 summary.json (taken inside `fetching`, never before)
    appending (the .jsonl file itself, exclusive, waited for)    rlctl.launch.jobdir: an event appended whole

A flock is the open file's: the launcher lock goes with the launcher however it ends, and a `launch --resume
--detach` hands it to the launcher it spawns (the descriptor inherited, its number in LOCK_FD_ENV)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shlex
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TextIO

from rlctl import procfs
from rlctl.errors import RlctlError, UsageError

if TYPE_CHECKING:
    from rlctl.launch.jobdir import JobDir

NO_FLOCK = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP)  # flock on a filesystem that has none
LAUNCHER_LOCK = ".launcher.lock"
# a launcher lock held by no live launcher here, tried again so many times, so far apart (`_flock_launcher`)
LOCK_TRIES, LOCK_RETRY_S = 10, 0.05
LOCK_FD_ENV = "RLCTL_LAUNCHER_LOCK_FD"  # a launcher spawned by `launch --resume --detach`: its parent's lock, inherited


def flock(f: IO[Any], how: int) -> str | None:
    """`fcntl.flock(f, how)` of the open file `f`: None once held; where its filesystem has no flock (NFS mounted
    `nolock`, a site's Lustre mounted without it: NO_FLOCK), why not (the error's text), the caller going on unlocked:
    refused there, nothing could run in such a job dir. Any other OSError passes (BlockingIOError: `how` has LOCK_NB
    and another process holds it)."""
    try:
        fcntl.flock(f.fileno(), how)
    except OSError as e:
        if e.errno not in NO_FLOCK:
            raise
        return e.strerror or str(e)
    return None


def open_lock(path: Path, *, what: str, why: str, error: type[RlctlError]) -> TextIO:
    """The lock file `path` open to read and write ("a+": made where missing); where it cannot be (another user's
    job dir, a read-only mount), `error`, one line naming it as `what` with a hint (`why` it is written there), versus
    the OSError's traceback."""
    try:
        return path.open("a+")
    except OSError as e:
        raise _not_opened(path, e, what=what, why=why, error=error) from e


def _not_opened(path: Path, e: OSError, *, what: str, why: str, error: type[RlctlError]) -> RlctlError:
    return error(
        f"{path}: cannot open {what} ({e.strerror or e})",
        hint=f"{why}: look at its owner and permissions (`ls -la {shlex.quote(str(path.parent))}`)",
    )


@contextlib.contextmanager
def launcher_lock(job: JobDir) -> Iterator[int]:
    """This process as the job's one launcher while inside (an exclusive flock on `.launcher.lock`, released
    when the process ends however it ends): a second `launch --resume` or `attach` while a launcher still
    runs, or resumes the job itself (`checkpoint.auto_resume`), is refused instead of starting a second
    controller over the same checkpoints and logs. Yields the lock file's descriptor: a `launch --resume
    --detach` hands the lock on to the launcher it spawns (the descriptor inherited, its number in
    LOCK_FD_ENV, taken over here: the flock is the open file's, held while either process has it open). Where the
    filesystem has no flock (NFS mounted `nolock`) it goes on unlocked, said once, as `appending` and the record's
    fetch do: refused there, no launch, resume or attach of a job in that dir could run at all. A lock file that
    cannot be opened (another user's job dir, a read-only mount) is one line, versus a traceback (a resume takes the
    lock before its refusals: a finished job's `nothing to resume` said so before). A copy of the job dir whose
    original's launcher runs the job is refused too (`refuse_copy_of_running`: the lines the copy kept name it)."""
    path = job.path / LAUNCHER_LOCK
    f = _handed_lock(path) or open_lock(
        path, what="the job's launcher lock", why="a launcher writes in the job dir", error=UsageError
    )
    try:
        holder = _flock_launcher(f, path)
        if holder is not None:
            arg = shlex.quote(job.id)
            raise UsageError(
                f"job {job.id} has a launcher already ({holder})",
                hint=f"watch it with `rlctl status {arg}`; `rlctl stop {arg}` ends it",
            )
        f.seek(0)
        refuse_copy_of_running(job, recorded=f.read())
        f.seek(0)
        f.truncate()
        space = procfs.pid_space()
        here = str(job.path.absolute())
        f.write(
            f"pid {os.getpid()} on {socket.gethostname()}\n"
            + (f"pid space {space}\n" if space else "")
            + (f"dir {here}\n" if "\n" not in here else "")
        )
        f.flush()
        yield f.fileno()
    finally:
        f.close()


def launcher_holder(job: JobDir) -> str | None:
    """Who holds `launcher_lock` ("pid N on HOST": the file's first line), None when no launcher does (or none can: a
    filesystem with no flock): probed with a shared lock, let go at once (a launcher taking the lock in that instant
    tries again: `_flock_launcher`). A lock file that cannot be read (another user's job dir whose lock is theirs
    alone, 0600 under a umask of 077; a directory by that name) is one line, naming it: who holds the job is not
    known, and a `status`, `stop` or launch into the dir that took it as none would act as if no launcher ran it;
    versus the OSError's traceback."""
    path = job.path / LAUNCHER_LOCK
    try:
        f = path.open("r")
    except FileNotFoundError:
        return None
    except OSError as e:
        why = "whether a launcher runs the job is read from it"
        raise _not_opened(path, e, what="the job's launcher lock", why=why, error=UsageError) from e
    with f:
        try:
            if flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB) is not None:  # no flock there: no launcher holds one
                return None
        except BlockingIOError:
            return _shown(f.read())
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return None


def refuse_copy_of_running(job: JobDir, *, recorded: str) -> None:
    """UsageError (exit 2) naming where the job runs when the job dir is a copy of one whose launcher runs it
    (`copy_of_running`; `recorded`: the lines of the copy's lock file, as copied). The copy's own lock is another
    file, never held: a `launch --resume` of the copy passed it and started a second run of the job over the same
    sites' job dirs (`W/jobs/<id>`, the id the copy shares), its controller's record and checkpoints."""
    found = copy_of_running(job, recorded=recorded)
    if found is None:
        return
    there, holder = found
    watch = shlex.quote(str(there))
    raise UsageError(
        f"job {job.id} runs from {there} (its launcher: {holder}), of which {job.path} is a copy; a launcher here "
        "would run the job a second time over the same sites' job dirs and checkpoints",
        hint=f"watch it with `rlctl status {watch}`; `rlctl stop {watch}` ends it; the copy resumes once it ended",
    )


def copy_of_running(job: JobDir, *, recorded: str | None = None) -> tuple[Path, str] | None:
    """(the job dir, its launcher: "pid N on HOST") where the job dir `job` is a copy (`cp -r`, rsync) of one of this
    machine whose launcher runs the job: the lock file's lines, as copied (`recorded`; read here where not given:
    its "dir" line, the job dir the launcher that wrote them held it in), name another directory, that holds this job
    (the same secret) and whose launcher lock is held. None otherwise: a dir moved after its job ended (the one named
    is gone), one named by an older rlctl's lock file (no "dir" line), another job there by now, no launcher there."""
    if recorded is None:
        try:
            recorded = (job.path / LAUNCHER_LOCK).read_text()
        except (OSError, ValueError):  # none, or none readable: no launcher's lines
            return None
    there = _recorded_dir(recorded)
    if there is None:
        return None
    try:
        if os.path.samefile(there, job.path) or (there / "secret").read_bytes() != (job.path / "secret").read_bytes():
            return None
    except OSError:  # gone (moved, or a directory of another machine), or no job's: another job by now, or none
        return None
    from rlctl.launch.jobdir import JobDir  # (jobdir imports this module: its appends take `flock`)

    try:
        holder = launcher_holder(JobDir(there))
    except UsageError:  # its lock cannot be read there: not known to run
        return None
    return None if holder is None else (there, holder)


def _recorded_dir(recorded: str) -> Path | None:
    """The job dir a launcher lock file's lines name (its "dir" line: `launcher_lock` writes it), None for none."""
    for line in recorded.splitlines():
        if line.startswith("dir /"):
            return Path(line[len("dir ") :])
    return None


def _handed_lock(path: Path) -> TextIO | None:
    """The launcher lock file `path` as the process that spawned this one held it (`launcher_lock`): its
    inherited descriptor, whose number LOCK_FD_ENV holds (taken out of the environment: no agent this launcher
    starts sees it), where that is this very file; None otherwise (the lock then taken anew)."""
    fd = os.environ.pop(LOCK_FD_ENV, None)
    if fd is None or not fd.isdigit():
        return None
    try:
        held, here = os.fstat(int(fd)), path.stat()
    except OSError:
        return None
    if (held.st_dev, held.st_ino) != (here.st_dev, here.st_ino):
        return None
    os.set_inheritable(int(fd), False)  # (the launcher's own children are not handed it)
    return os.fdopen(int(fd), "a+")


def _flock_launcher(f: TextIO, path: Path) -> str | None:
    """An exclusive flock on the launcher lock file `f` (at `path`), not waited for: None once taken, else who holds
    it (the file's "pid N on HOST"). Held while the holder it names is no live process here (a launcher gone, or
    another machine's: another host, or another pid space under this host name), it is tried again, LOCK_TRIES times
    LOCK_RETRY_S apart: a `launcher_holder` probe (`status -w`, `logs -f`, `stop`) holds it for an instant, and a
    resume then was refused at once, naming the gone launcher as the one that has the job. (A launcher on another
    machine is refused after those tries.)"""
    holder = _flock_now(f, path)
    for _ in range(LOCK_TRIES - 1):
        if holder is None or _runs_here(holder):
            break
        time.sleep(LOCK_RETRY_S)
        holder = _flock_now(f, path)
    return None if holder is None else _shown(holder)


def _flock_now(f: TextIO, path: Path) -> str | None:
    """One try of `_flock_launcher`: None once taken, or where the filesystem has no flock (said once: this launcher
    goes on unlocked, versus the OSError's traceback before every refusal of a resume); else who holds it (the
    file's lines)."""
    try:
        unlocked = flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        return f.read()
    if unlocked is not None:
        from rlctl.launch.jobdir import say_once  # (jobdir imports this module: its appends take `flock`)

        say_once(
            [
                f"{path}: no file locks on this filesystem ({unlocked}): this launcher goes on unlocked; a second "
                "`launch --resume` or `attach` of the job is not refused"
            ]
        )
    return None


def _shown(holder: str) -> str:
    """The holder the lock file's lines name, as said to the user: its first line ("pid N on HOST"; its pid space,
    the second, is for `_runs_here`), or "another process" where it is empty (a launcher that has just taken it)."""
    return next(iter(holder.strip().splitlines()), "another process")


def _runs_here(holder: str) -> bool:
    """Whether the launcher `holder` (the lock file's lines: "pid N on HOST", then "pid space S" where it had one,
    as `launcher_lock` writes them) is a live process here: of this host and pid space (`procfs.pids_here`; a file
    without a pid space, an older rlctl's, by host alone), versus a launcher of a container of another machine under
    this host name taken for this machine's process of its pid (a resume refused at once while a probe held the lock
    of that gone launcher). A pid no process can have (a hand-edited file: 0, which `kill` takes for its own process
    group; one past a C int, its OverflowError) is none, versus the OverflowError's traceback or pid 0 taken for a
    live launcher."""
    m = re.fullmatch(r"pid (\d+) on (\S+)(?:\npid space (\S+))?(?:\ndir /.*)?", holder.strip())
    return m is not None and procfs.pids_here(m[2], m[3]) and procfs.alive(int(m[1]))
