"""What `launch --resume` refuses before it starts anything (and `attach`, `pull`, `report`, `status` refuse of a
job never prepared): a finished job, an unprepared one, an id another live job of the index runs under, a job
whose controller still answers (`refuse_if_running` stops what is left of its last run otherwise)."""

from __future__ import annotations

import logging
import shlex
from pathlib import Path

from rlctl.errors import LaunchError, RlctlError, UsageError
from rlctl.launch.agentrecords import all_recorded_agents
from rlctl.launch.backends import Backends, read_sites, stop_agents
from rlctl.launch.jobdir import JobDir
from rlctl.ops.client import connect_client, controller_address
from rlctl.ops.extend import trained_iterations
from rlctl.ops.jobdb import LIVE, JobDB
from rlctl.ops.jobprep import launch_again
from rlctl.ops.runstate import current_run, run_summary

log = logging.getLogger(__name__)


def refuse_if_finished(jobdir: JobDir, *, state: str | None) -> None:
    """Before `launch --resume`: refuse a job that finished (its last run trained every planned iteration), which a
    resume would only run again (every agent, the held-out evaluation; all of it without a checkpoint). `state`: its
    row's in the job index (None for a job named by a directory the index does not hold); summary.json says it too."""
    summary = run_summary(jobdir, current_run(jobdir))
    done = summary if summary is not None and summary.get("state") == "done" else None
    if done is None and state != "finished":
        return
    planned = jobdir.read_job().iterations
    # its count was raised since it finished (`--iterations`); none trained here is no count known (its controller's
    # site's record not fetched, nor its summary: the index's `finished` stands)
    if 0 < trained_iterations(jobdir) < planned:
        return
    # (one read from its run's job_end event, its summary.json damaged, has no planned count: job.json's)
    counts = f" ({done.get('iterations')}/{done.get('iterations_planned', planned)} iterations)" if done else ""
    ref = shlex.quote(jobdir.id if state is not None else str(jobdir.path))  # (an id the index lacks names no job)
    raise UsageError(
        f"job {jobdir.id}: finished{counts}; nothing to resume",
        hint=f"`rlctl status {ref}` shows how it ended; to train on from its last checkpoint: "
        f"`rlctl launch --resume {ref} --iterations {2 * planned}`",
    )


def refuse_if_unprepared(jobdir: JobDir, *, source: str | None, nothing: str = "nothing to resume") -> None:
    """Before `launch --resume` (or `attach`, `pull`: `nothing` says "nothing to watch", "nothing to pull"): refuse
    a job whose launch ended before it had prepared it (no job.json: `prepare` writes it last; a `rlctl stop` during
    its SFT warm-up, or its launcher's machine rebooted then), which has nothing to resume (UsageError naming how to
    launch it anew; `source`: its job file, as its index row recorded it). A job.json without its plan.json (deleted
    by hand) is refused too, naming the file: each of these commands reads the plan."""
    if jobdir.job_json.exists():
        if not jobdir.plan_json.exists():
            raise UsageError(
                f"{jobdir.plan_json}: missing (the job's plan, written with its job.json); {nothing}",
                hint=f"put the job dir's plan.json back from a copy, or launch the job anew: `{launch_again(source)}`",
            )
        return
    jobdir.refuse_lost_job_json(nothing=nothing)  # prepared (its plan.json there), its job.json removed
    holder = jobdir.launcher_holder()
    if holder is not None:  # its launch holds it while it prepares (an SFT warm-up, tokenizing): not one that ended
        arg = shlex.quote(jobdir.id)
        raise UsageError(
            f"job {jobdir.id} is being prepared by its launcher ({holder}); {nothing}",
            hint=f"watch it with `rlctl status {arg}`, or end it with `rlctl stop {arg}`",
        )
    again = launch_again(source)
    raise UsageError(
        f"job {jobdir.id} was never prepared (no {jobdir.job_json.name}: its launch was stopped or failed "
        f"before any agent started); {nothing}",
        hint=f"launch it anew: `{again}`",
    )


def refuse_if_id_live(jobdir: JobDir, db: JobDB) -> None:
    """Before a resume of a job the index does not hold (its row is put under its id): UsageError when another job
    of the index runs under that id (launched before ids were made unique, or a copied job dir): the resume would
    take that job's row (`rlctl status ID`, `stop ID` would mean this one) and its sites' job dirs."""
    try:
        row = db.get(jobdir.id)
    except RlctlError:
        return
    here = jobdir.path.resolve()
    if Path(row.job_dir).resolve() == here or row.state not in LIVE or not Path(row.job_dir).is_dir():
        return
    raise UsageError(
        f"job dir {jobdir.path}: its id {jobdir.id} is the indexed job in {row.job_dir}, which is {row.state}; "
        "a resume would take that job's index row and its sites' job dirs",
        hint=f"resume it once that job has ended (`rlctl status {shlex.quote(jobdir.id)}`), or stop it first",
    )


def controller_elsewhere(jobdir: JobDir, *, own: str | None) -> str | None:
    """The address of a controller of the job that answers and is not `own` (this launcher's run's, whose run
    failed): another run of the job on its sites (a copy of the job dir resumed from another machine, its controller
    now the one the site's controller.json names); None where none answers, or the one named is this run's."""
    try:
        address = controller_address(jobdir)
    except (LaunchError, OSError, ValueError):
        return None
    if address == own:
        return None
    try:
        conn = connect_client(jobdir, timeout_s=3.0, name="resume")
    except (RlctlError, OSError, ValueError, KeyError):  # none answers
        return None
    conn.close()
    return address


def refuse_if_running(jobdir: JobDir, *, arg: str | None = None, indexed: bool = True) -> None:
    """Before a resume (by the job's launcher, holding its lock: no other launcher watches it): refuse while the
    job's controller answers, naming `rlctl attach` (which watches it again, as its gone launcher did) before `rlctl
    stop`; stop what is left of the run that ended (an orphaned unit, a trainer rank whose peer died), so two runs
    of one job never overlap. `arg`: the job as the hints name it (`JobRef.arg`: its directory where the index lacks
    it: its id names no job there, `rlctl attach ID` failed), else its id. A job the index lacks (`indexed` False: a
    copy of its job dir, another machine's launch) is said with its controller's address and no `attach`, which
    refuses such a job: its launcher, elsewhere, may watch it still."""
    try:
        conn = connect_client(jobdir, timeout_s=3.0, name="resume")
    except (RlctlError, OSError, ValueError, KeyError):  # none answers (an unreadable controller.json: none can)
        pass
    else:
        conn.close()
        name = arg if arg is not None else shlex.quote(jobdir.id)
        if not indexed:
            try:
                at = f" at {controller_address(jobdir)}"
            except (LaunchError, OSError, ValueError):  # (read a moment ago: removed, or replaced by a damaged one)
                at = ""
            raise UsageError(
                f"job {jobdir.id} is running: its controller answers{at}, and this machine's job index does not hold "
                "it (a copy of its job dir? launched from another machine?)",
                hint=f"`rlctl status {name}` shows it; `rlctl stop {name}` ends it; resume it once it ended",
            )
        raise UsageError(
            f"job {jobdir.id} is running (its controller answers; no launcher watches it)",
            hint=f"`rlctl attach {name}` watches it to its end again; `rlctl stop {name}` ends it",
        )
    backends = Backends(read_sites(jobdir.path), job=jobdir.id, job_dir=jobdir.path)
    skipped: list[str] = []  # a line cut short by a full disk stays in agents.jsonl: read strictly, no resume passed
    try:
        problems = stop_agents(backends, all_recorded_agents(jobdir.path, skipped=skipped), grace_s=5.0)
    finally:
        backends.close()
    for line in skipped:  # an agent whose record was cut short is no one this resume can stop; it ends on its own
        log.warning("%s (an agent recorded there, if it still runs, exits once it finds its controller gone)", line)
    if problems:
        raise LaunchError("cannot stop what is left of the last run: " + "; ".join(problems))
