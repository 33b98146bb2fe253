"""Which job a command means: `rlctl status|scale|stop|logs|report [JOB]` all resolve JOB here.

JOB omitted          ─▶ the most recently updated job in the index
JOB = a directory    ─▶ that job directory (must hold job.json)
JOB = an index id    ─▶ that row (ids are job-directory names, e.g. demo-20261122-131045)
JOB = a job name     ─▶ the newest row whose job has that name

`rlctl.launch.jobdir.resume_command` names a job the way `rlctl launch --resume JOB` resolves it back here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlctl.errors import UsageError
from rlctl.launch.jobdir import JobDir
from rlctl.ops.jobdb import JobDB, JobRow
from rlctl.textutil import did_you_mean


@dataclass(frozen=True)
class JobRef:
    id: str
    jobdir: JobDir
    row: JobRow | None  # None when the job was named by its directory and is not in the index


def resolve(ref: str | None, *, db: JobDB | None = None) -> JobRef:
    """The job `ref` names; UsageError (exit 2) naming what is known when nothing matches."""
    own = db is None
    db = db if db is not None else JobDB()
    try:
        return _resolve(ref, db)
    finally:
        if own:
            db.close()


def _resolve(ref: str | None, db: JobDB) -> JobRef:
    if ref is None:
        row = db.latest()
        if row is None:
            raise UsageError(f"no jobs in the index ({db.path})", hint="start one with `rlctl launch JOB.yaml`")
        return JobRef(row.name, JobDir(Path(row.job_dir)), row)
    path = Path(ref).expanduser()
    if path.is_dir():
        if not (path / "job.json").exists():
            raise UsageError(f"{path}: not a job directory (no job.json)")
        ids = {r.job_dir: r for r in db.list()}
        row = ids.get(str(path.resolve()))
        return JobRef(path.resolve().name, JobDir(path.resolve()), row)
    rows = db.list()
    by_id = {r.name: r for r in rows}
    if ref in by_id:
        row = by_id[ref]
        return JobRef(row.name, JobDir(Path(row.job_dir)), row)
    named = [r for r in rows if r.spec.get("name") == ref]
    if named:
        row = max(named, key=lambda r: r.created_s)
        return JobRef(row.name, JobDir(Path(row.job_dir)), row)
    known = sorted({*by_id, *(str(r.spec.get("name")) for r in rows)})
    raise UsageError(
        f"no job {ref!r} in the index ({db.path}); known: {', '.join(known) or 'none'}{did_you_mean(ref, known)}",
        hint="give a job name, an id from `rlctl status --all`, or a job directory",
    )
