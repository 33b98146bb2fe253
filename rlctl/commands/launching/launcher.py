"""This process as a job's launcher (`launch`, `launch --resume`, `attach`): start or take over a run, watch it to
its end, evaluate it and print the summary; SIGTERM and Ctrl-C stop every agent, a SIGHUP moves its output to the
job's log (`rlctl.ops.detach`)."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlctl.commands.launching.interrupts import InterruptSaid, interrupted_line
from rlctl.commands.launching.views import Progress, summary_table
from rlctl.errors import RlctlError
from rlctl.ops import detach
from rlctl.render import OutputFormat, emit

if TYPE_CHECKING:
    from rlctl.config.job import JobFile
    from rlctl.launch.jobdir import JobDir
    from rlctl.ops.autoresume import Runs
    from rlctl.ops.jobdb import JobDB
    from rlctl.ops.run import JobRun

log = logging.getLogger(__name__)


def be_launcher(
    jd: JobDir,
    spec: JobFile,
    plan: dict[str, Any],
    db: JobDB,
    begin: Callable[[Runs, Callable[[str], None]], JobRun],
    output: OutputFormat,
    *,
    locked: bool = False,
) -> None:
    """This process as the job's launcher (launch, `--resume`, attach): `begin` starts (or takes over) a run; it
    watches the job to its end (resuming it as `checkpoint.auto_resume` says), evaluates it and prints the summary.
    SIGTERM and Ctrl-C stop every agent; a SIGHUP moves its output to the job's log (`rlctl.ops.detach`); a
    launcher started by `--detach` is told the run started. `locked`: this process holds the job's launcher lock
    already (`launch --resume` takes it before it fetches the job's record), versus taken here."""
    from rlctl.ops.autoresume import Runs
    from rlctl.ops.evaluation import add_heldout

    with contextlib.ExitStack() as held:
        held.callback(db.close)
        if not locked:  # (a second flock of it, on a file opened again, would be refused by this process's own)
            held.enter_context(jd.launcher_lock())  # one launcher per job: no other resumes it meanwhile
        detach.survive_hangup(detach.log_path(jd.path))
        if not detach.spawned():  # (a detached one's header was written as it was spawned)
            detach.log_header(detach.log_path(jd.path), pid=os.getpid(), args=sys.argv[1:], detached=False)
        progress = Progress()
        runs = Runs(jd, spec, plan, db=db, say=progress.say, show=progress.show)
        stopped = True  # whether the `finally` below stopped the run without a problem (`stop_runs`)
        # SIGTERM (and SIGINT, as KeyboardInterrupt) unwind through `finally`: every agent is stopped
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            try:
                detach.say_started(started(begin(runs, progress.say)))
                summary = runs.wait(on_progress=progress)
            finally:
                progress.close()
                stopped = stop_runs(runs)
        except KeyboardInterrupt as e:  # Ctrl-C: exit 130 (the CLI's), once the operator is told what became of the job
            progress.say(interrupted_line(jd, runs.run, source=runs.source, stopped=stopped))
            raise InterruptSaid from e
        except SystemExit as e:  # SIGTERM (the handler above) stops the job as Ctrl-C does: said as it is, versus an
            # exit 143 that said nothing (a detached launcher's log ended at its last iteration line)
            if e.code == 143:
                progress.say(interrupted_line(jd, runs.run, source=runs.source, why="SIGTERM", stopped=stopped))
            raise
        # still the job's launcher while it evaluates the final checkpoint: a `launch --resume` (which may set that
        # checkpoint aside) is refused meanwhile, and `rlctl stop` waits for it rather than saying it ended
        try:
            summary = add_heldout(jd, spec, summary, say=progress.say)
        except (KeyboardInterrupt, SystemExit) as e:  # the job is over: said so, versus an exit that said nothing
            if not isinstance(e, SystemExit) or e.code == 143:  # Ctrl-C, or SIGTERM (the handler above)
                why = "interrupted" if isinstance(e, KeyboardInterrupt) else "SIGTERM"
                progress.say(
                    f"rlctl: {why}: job {jd.id} {summary['state']} ({summary.get('iterations')} iterations); its "
                    f"held-out evaluation was cut, so its summary has none (`rlctl status {shlex.quote(jd.id)}` "
                    "shows it)"
                )
            if isinstance(e, KeyboardInterrupt):
                raise InterruptSaid from e
            raise
    if summary["state"] == "done":  # what a finished job's operator does next, by the id the index holds it under
        ref = shlex.quote(jd.id)  # (its run put it in the index under its id)
        summary["next"] = {
            "report": f"rlctl report {ref}",
            "checkpoints": f"rlctl status {ref} --checkpoints",
            "pull": f"rlctl pull {ref}",
        }
    emit(summary, output, summary_table)
    if summary["state"] != "done":
        assert runs.run is not None  # it ran: the summary came from it
        resume = runs.run.resume_command()
        said = resume in summary["state"]  # a failed job's state names it already (the controller's line)
        raise RlctlError(
            f"job {spec.name} did not finish: {summary['state']}",
            hint=f"see {jd.path}/logs" + ("" if said else f"; continue it with `{resume}`"),
        )


def stop_runs(runs: Runs) -> bool:
    """`runs.stop()`, in the launcher's `finally`: where an error already ends the launch (a start that failed,
    Ctrl-C, SIGTERM), a stop that fails too (the controller's site unreachable: the job's record not fetched) is a
    warning line and that error the one said, versus the stop's raised in its place. Whether it stopped cleanly."""
    ending = sys.exc_info()[1]
    try:
        runs.stop()
    except RlctlError as e:
        if ending is None:
            raise
        log.warning("stopping the job's agents: %s", e)
        return False
    return True


def started(run: JobRun) -> dict[str, Any]:
    """What `launch --detach` reports once the job runs (`run`: its JobRun, started)."""
    return {
        "id": run.id,
        "state": "running",
        "job_dir": str(run.jobdir.path),
        "launcher_pid": os.getpid(),
        "launcher_log": str(detach.log_path(run.jobdir.path)),
    }
