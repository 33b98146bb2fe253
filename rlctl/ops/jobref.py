"""Which job a command means: `rlctl status|scale|stop|logs|report [JOB]` all resolve JOB here.

JOB omitted          ─▶ the job launched last (`launch` or `launch --resume`: `JobRow.launched_s`); for a command
                        that changes a running job (`stop`, `scale`: `resolve(..., changes=COMMAND)`) the job that
                        runs, where one does: with two running, which one is the operator's to say
JOB = a job directory ─▶ that job directory (a directory holding job.json, or an index row's while its launch
                        prepares it; any other is no job: a job's config folder named like it, jobs/demo/, does
                        not hide the job)
JOB = an index id    ─▶ that row (an id is its job directory's name, e.g. demo-20261122-131045, or that
                        name and a digest of the path when another job held it: `JobDB.id_for`)
JOB = a job name     ─▶ of the rows whose job has that name, the one launched last (the same rule)
A job directory and an index row that both match but are different jobs: UsageError naming both.

`rlctl.launch.jobdir.resume_command` names a job the way `rlctl launch --resume JOB` resolves it back here.
"""

from __future__ import annotations

import logging
import os
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from rlctl.errors import ConfigError, RlctlError, UsageError
from rlctl.launch.jobdir import JobDir
from rlctl.launch.locks import copy_of_running
from rlctl.ops.jobdb import LIVE, IndexUnreadable, JobDB, JobRow
from rlctl.textutil import did_you_mean

log = logging.getLogger(__name__)

KNOWN_SHOWN = 12  # the job names an unknown JOB's line lists (`rlctl status --all` lists every job)


@dataclass(frozen=True)
class JobRef:
    id: str
    jobdir: JobDir
    row: JobRow | None  # None when the job was named by its directory and is not in the index
    # the job dir the command named, where it is a copy of `jobdir`, whose launcher runs the job (`copy_of_running`):
    # a command that changes the running job (`resolve(..., changes=…)`) acts on that dir, as its launcher reads it
    copy: Path | None = None

    @property
    def arg(self) -> str:
        """How a command names this job, quoted as a shell reads it: its id where the index holds it, else its
        directory (the id of a job the index lacks — a moved job dir, another $RLCTL_HOME's — names no row)."""
        return shlex.quote(self.id if self.row is not None else str(self.jobdir.path))

    def copy_said(self) -> dict[str, str]:
        """What a command's output says of a job named by a copy of its dir (`copy`): the dir the job runs from, and
        the copy named; nothing for any other job."""
        return {} if self.copy is None else {"job_dir": str(self.jobdir.path), "copy": str(self.copy)}


def resolve(ref: str | None, *, db: JobDB | None = None, changes: str | None = None) -> JobRef:
    """The job `ref` names; UsageError (exit 2) naming what is known when nothing matches. `changes`: the command
    (`stop`, `scale`), which changes the running job it resolves to: an omitted JOB means the one job that runs
    (`_the_running_one`), and is refused in one line naming them while several run, versus the one launched last
    stopped or scaled (a week-long job resumed after a test job was launched: a bare `rlctl stop` meant for the test
    stopped it). Such a command given a copy of the job dir (`cp -r`, rsync) whose original's launcher runs the job
    resolves to that original (`JobRef.copy`: the copy): its stop request written where that launcher reads it, versus
    into the copy, where the launcher of a job its stop killed without a summary never saw it and resumed the job
    (`checkpoint.auto_resume`), and the stop neither waited for that launcher nor wrote the job's index row."""
    own = db is None
    if db is None:
        try:
            db = JobDB()
        except IndexUnreadable as e:  # a job named by its directory needs no index to be found
            found = _by_directory(ref) if changes is None else None
            if found is None:
                raise
            log.warning("%s; %s is read without it%s", e, found.jobdir.path, f" (hint: {e.hint})" if e.hint else "")
            return found
    try:
        if ref is None and changes is not None and (running := _the_running_one(db, changes)) is not None:
            return JobRef(running.name, JobDir(Path(running.job_dir)), running)
        found = _resolve(ref, db)
        if changes is not None and found.row is None and (original := copy_of_running(found.jobdir)) is not None:
            return replace(_resolve(str(original[0]), db), copy=found.jobdir.path)
        return found
    finally:
        if own:
            db.close()


def _by_directory(ref: str | None) -> JobRef | None:
    """The job of the job directory `ref` (one holding job.json) without the index: its row unknown (None); None
    where `ref` names no such directory. A command that only reads the job (status, logs, report) goes on so when
    the index cannot be opened; one that changes it (stop, scale: its row written) does not."""
    path = Path(os.path.expanduser(ref)) if ref is not None else None
    if path is None or not path.is_dir() or not (path / "job.json").is_file():
        return None
    here = path.resolve()
    return JobRef(JobDir(here).id, JobDir(here), None)


def _the_running_one(db: JobDB, command: str) -> JobRow | None:
    """The job `command` (`stop`, `scale`) means with JOB omitted: the one job of the index that runs, versus the one
    launched last, which may have ended since (a bare `rlctl stop` said 'already ended' of it while the other ran);
    None where none runs (the one launched last, as for the other commands). UsageError where several run."""
    live = sorted((r for r in db.list() if r.state in LIVE), key=lambda r: r.launched_s, reverse=True)
    if len(live) == 1:
        return live[0]
    if len(live) > 1:
        ids = ", ".join(r.name for r in live[:KNOWN_SHOWN]) + (", …" if len(live) > KNOWN_SHOWN else "")
        raise UsageError(
            f"{len(live)} jobs are running ({ids}): `rlctl {command}` needs the job named",
            hint=f"`rlctl {command} {shlex.quote(live[0].name)}` for the one launched last; "
            "`rlctl status --all` lists every job",
        )
    return None


def require_job_dir(ref: JobRef) -> None:
    """RlctlError (exit 1) when the job's directory is gone: its index row outlived it (removed, or on a filesystem
    not mounted here); said as such, not as a job whose agents never started or that was never prepared."""
    if ref.jobdir.path.is_dir():
        return
    said = f"; the job index says {ref.row.state}" if ref.row is not None else ""
    raise RlctlError(
        f"job {ref.id}: its job directory {ref.jobdir.path} is gone (removed, or not mounted on this machine){said}",
        # (a moved job dir is its job by its directory: a resume by it puts the index row there)
        hint=f"moved elsewhere? name the job by its directory where it is now, not {shlex.quote(ref.id)}; "
        "`rlctl status --all` lists the jobs in the index",
    )


def _resolve(ref: str | None, db: JobDB) -> JobRef:
    if ref is None:
        row = db.latest()
        if row is None:
            raise UsageError(f"no jobs in the index ({db.path})", hint="start one with `rlctl launch JOB.yaml`")
        return JobRef(row.name, JobDir(Path(row.job_dir)), row)
    path = Path(os.path.expanduser(ref))  # (`~nosuchuser/…` as written: Path's raised RuntimeError, a traceback)
    rows = db.list()
    by_id = {r.name: r for r in rows}
    named = [r for r in rows if r.spec.get("name") == ref]
    indexed = by_id[ref] if ref in by_id else max(named, key=lambda r: r.launched_s) if named else None
    if path.is_dir() and (path / "job.json").is_dir():
        JobDir(path).refuse_lost_job_json()  # says so (before: taken as the job dir, its job prepared)
    if path.is_dir() and (path / "job.json").exists():
        here = path.resolve()
        same = indexed is not None and Path(indexed.job_dir).resolve() == here
        if indexed is not None and not same:
            raise UsageError(
                f"{ref!r} names two jobs: the job directory {here} and the indexed job {indexed.name} "
                f"({indexed.job_dir})",
                hint=f"give the directory as a path (./{ref} or {here}) or the job by its id",
            )
        row = indexed if same else next((r for r in rows if _same_dir(r, here)), None)
        return JobRef(JobDir(here).id, JobDir(here), row)
    if indexed is not None:
        return JobRef(indexed.name, JobDir(Path(indexed.job_dir)), indexed)
    if path.is_dir():
        # a launch still preparing the job (its SFT warm-up): in the index, without job.json until it is prepared
        preparing = next((r for r in rows if _same_dir(r, path.resolve())), None)
        if preparing is not None:
            return JobRef(preparing.name, JobDir(Path(preparing.job_dir)), preparing)
        JobDir(path).refuse_lost_job_json()  # a job dir whose job.json was removed
        raise UsageError(f"{path}: not a job directory (no job.json), and no job {ref!r} in the index ({db.path})")
    if path.is_file():  # `rlctl status jobs/demo.yaml`: the file that launched a job, not the job
        name = _job_file_name(path)
        if name is not None:
            launched = any(r.spec.get("name") == name for r in rows)  # else its name is no job either
            raise UsageError(
                f"{ref}: a job file; this command takes a launched job (its name, an id, or its job directory)",
                hint=f"give the job's name, {shlex.quote(name)} (its latest run), or an id from `rlctl status --all`"
                if launched
                else f"no job {name!r} was launched; `rlctl launch {shlex.quote(ref)}` launches it",
            )
    known = sorted({*by_id, *(str(r.spec.get("name")) for r in rows)})
    names = sorted({str(r.spec.get("name")) for r in rows})  # the names, not every run's id: an index grows for good
    more = f" and {len(names) - KNOWN_SHOWN} more" if len(names) > KNOWN_SHOWN else ""
    listed = ", ".join(names[:KNOWN_SHOWN]) + more
    raise UsageError(
        f"no job {ref!r} in the index ({db.path}); job names: {listed or 'none'}{did_you_mean(ref, known)}",
        hint="give a job name, an id from `rlctl status --all`, or a job directory",
    )


def _job_file_name(path: Path) -> str | None:
    """The `name` of the job file at `path`, None when it is no job file (read, not validated)."""
    from rlctl.config.base import read_yaml

    try:
        data = read_yaml(path)
    except ConfigError:
        return None
    name = data.get("name")
    return name if data.get("kind") == "Job" and isinstance(name, str) else None


def _same_dir(row: JobRow, here: Path) -> bool:
    """Whether the row's job dir is `here` (resolved): the index keeps it as given, absolute but not resolved (a
    symlink, a `..`), and a resolved path compared as text did not match it."""
    return row.job_dir == str(here) or Path(row.job_dir).resolve() == here
