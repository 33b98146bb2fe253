"""A fresh launch's job directory: chosen and refused when it holds a job (`fresh_dir`), made with its index row
(`launch_dir`, `reserved`), and what a launch that never ran left of it indexed (`index_left`) or removed
(`entries`, `unmake`, `unmade_left`)."""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path

from rlctl.config.job import Job, JobFile
from rlctl.errors import RlctlError, UsageError
from rlctl.launch.jobdir import HOME_ENV, JobDir, refuse_taken, resume_command, why_not_made
from rlctl.ops.detach import this_launcher
from rlctl.ops.jobdb import LIVE, JobDB
from rlctl.ops.refusals import refuse_if_finished

log = logging.getLogger(__name__)


def launch_dir(job: Job, spec: JobFile, job_dir: str | Path | None) -> JobDir:
    """A fresh launch's job directory, created, with its id (`JobDB.id_for`: its name, unless another job of the index
    has that name) and its row in the index, `launching` (`JobDB.reserve`); one that already holds a job (or is a
    file) is refused (`fresh_dir`), nothing written. `job_dir`: the --job-dir flag; None: the job file's `job_dir`,
    else a new timestamped directory, chosen and made here (one `fresh_dir` chose before preflight may be another
    launch's by now)."""
    if job_dir is None and spec.job_dir is None:  # a new timestamped directory, not one another launch made since
        jd = JobDir.create(spec.name)
    else:
        jd = JobDir.create(spec.name, explicit=fresh_dir(job, spec, job_dir))
    # its job file too: a launch stopped before its launcher took it on (`Runs.preparing` records it) is launched anew
    # from it, as `status` says (it said `rlctl launch JOB.yaml`)
    return reserved(jd, spec, source=str(job.path.absolute()))


def reserved(jd: JobDir, spec: JobFile, *, source: str | None = None) -> JobDir:
    """`jd`, with its id and its row in the index, `launching`, this process its launcher (`JobDB.reserve`), and the
    job file `source` where given (what `status` says to launch anew). Its secret is written first, the launch's claim
    on the directory: from the row on, `rlctl stop` finds the job and writes its request in events.jsonl, and a
    launch that ended before `prepare` wrote the secret (Ctrl-C, an error) left a directory whose events.jsonl a
    relaunch refused as the user's (`refuse_taken`)."""
    jd.secret()
    with contextlib.closing(JobDB()) as db:
        db.reserve(
            jd.path,
            spec=spec.model_dump(mode="json", by_alias=True),
            info={"launcher": this_launcher()} | ({"source": source} if source is not None else {}),
            record=jd.name_as,
        )
    return jd


def index_left(path: Path, spec: JobFile, *, source: str) -> str | None:
    """A fresh launch's job dir `path` that its launcher never took on (one `launch --detach` made, its launcher in
    the background stopped as it began, before its index row): in the index, `stopped`, as a launch stopped while it
    prepares leaves its own, so that `rlctl status` and `stop` find it. Its id; None where a row names it already, or
    no directory was made."""
    if not path.is_dir():
        return None
    here = path.resolve()
    with contextlib.closing(JobDB()) as db:
        if any(Path(r.job_dir).resolve() == here for r in db.list()):
            return None
    jd = reserved(JobDir.create(spec.name, explicit=path), spec, source=source)
    with contextlib.closing(JobDB()) as db:
        db.update(jd.id, state="stopped", only_from=LIVE)
    return jd.id


def entries(path: Path) -> set[str] | None:
    """The names in the directory `path`, None where there is none: what `unmake` puts it back to."""
    return {p.name for p in path.iterdir()} if path.is_dir() else None


def unmake(path: Path, before: set[str] | None) -> None:
    """What a fresh launch made in `path` removed: the directory where it made it (`before` None), else the names
    in it that `before` (`entries`, as the launch found it) lacks. One that cannot be removed is said (a warning)."""
    for p in [path] if before is None else [p for p in path.iterdir() if p.name not in before]:
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
        except OSError as e:
            log.warning("%s: made by the refused launch, left there: %s", p, e)


def unmade_left(path: Path, before: set[str] | None) -> None:
    """What `launch --detach` made in `path` (`before`: as it found it) for a launcher in the background that ended
    before the job ran and left no job there (no index row names it, no job.json, no launcher holds it: refused as
    it prepared, `Runs.unindex`) removed, versus left outside the index (its launcher's log alone)."""
    if not path.is_dir() or (path / "job.json").exists() or JobDir(path).launcher_holder() is not None:
        return
    here = path.resolve()
    with contextlib.closing(JobDB()) as db:
        if any(Path(r.job_dir).resolve() == here for r in db.list()):
            return
    unmake(path, before)


def _resume_taken(path: Path) -> str | None:
    """The command that continues the job a fresh launch's `path` holds (None: none there, or `launch --resume`'s
    own): a finished one's names `--iterations`, without which its resume is refused (`refuse_if_finished`); the
    hint said `rlctl launch --resume DIR` alone."""
    if not (path / "job.json").is_file():
        return None
    jobdir = JobDir(path)
    try:
        refuse_if_finished(jobdir, state=None)
    except UsageError:
        return f"{resume_command(path)} --iterations {2 * jobdir.read_job().iterations}"
    except (RlctlError, OSError):  # a damaged record: the resume says what is wrong with it
        return None
    return None


def fresh_dir(job: Job, spec: JobFile, job_dir: str | Path | None) -> Path:
    """Where a fresh launch of `job` writes (--job-dir `job_dir`, else the job file's `job_dir`, else a new
    timestamped directory); UsageError, one line, when that is a file or holds a job already (`refuse_taken`), or
    cannot be made (`why_not_made`)."""
    explicit = job_dir if job_dir is not None else spec.job_dir
    path = JobDir.choose_path(spec.name, explicit=explicit)
    if explicit is not None:
        refuse_taken(
            path, named_by="--job-dir" if job_dir is not None else f"{job.path}: job_dir", resume=_resume_taken(path)
        )
    elif (why := why_not_made(path)) is not None:  # a new timestamped directory, which no flag or field named
        raise UsageError(
            f"the job's new directory: {why}",
            hint=f"name one with --job-dir (or the job file's job_dir), or set {HOME_ENV} to a directory you may "
            "write in (its runs/ holds them)",
        )
    return path
