"""`rlctl attach JOB [-d]`: become the launcher of a running job whose launcher is gone.

A launcher that dies (its machine rebooted, the process killed) leaves its job running with nobody to record its
end, run the held-out evaluation or resume it (`checkpoint.auto_resume`). `attach` takes over from the job dir's
record: it watches the latest run's controller to its end and does what the launch would have done, with the same
progress lines and summary; Ctrl-C stops the job, as in `launch`. Refused while the recorded launcher runs (two
launchers would both resume a failed run), and for a job that ended.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from rlctl.buildid import code_digest
from rlctl.commands.launching.detached import run_detached
from rlctl.commands.launching.launcher import be_launcher
from rlctl.commands.status import JobArg
from rlctl.errors import UsageError
from rlctl.ops import detach
from rlctl.ops.jobdb import LIVE, JobRow
from rlctl.render import OutputFormat, OutputOpt

if TYPE_CHECKING:
    from rlctl.ops.autoresume import Runs
    from rlctl.ops.run import JobRun


def refuse_attach(job_id: str, row: JobRow | None, *, force: bool) -> None:
    """UsageError, one line, unless the job runs (in this machine's index) with no launcher left to watch it. The
    commands it hints name the job as a shell reads it (an id from a job dir `my run`: `rlctl status 'my run'`)."""
    arg = shlex.quote(job_id)
    if row is None:
        raise UsageError(f"{job_id}: not in this machine's job index (attach takes over jobs launched from it)")
    if row.state not in LIVE:
        # a finished job's plain resume is refused (nothing left to run): it trains on with --iterations
        go_on = (
            f"train it on with `rlctl launch --resume {arg} --iterations N`"
            if row.state == "finished"
            else f"continue it with `rlctl launch --resume {arg}`"
        )
        raise UsageError(f"job {job_id} ended ({row.state}): nothing to watch", hint=f"`rlctl status {arg}`; {go_on}")
    info = row.info.get("launcher")
    running = detach.launcher_running(info)
    if running is False or info is None or (running is None and force):
        return
    where = f"pid {info.get('pid')} on {info.get('host')}" if isinstance(info, dict) else repr(info)
    if running:
        raise UsageError(f"job {job_id} has a launcher ({where})", hint=f"`rlctl logs {arg} launcher -f` follows it")
    raise UsageError(
        f"job {job_id} has a launcher ({where}) on a machine this one cannot check",
        hint=f"if it is gone, `rlctl attach {arg} --force`",
    )


def register(app: typer.Typer) -> None:
    @app.command()
    def attach(
        job: JobArg = None,
        detach_: Annotated[
            bool,
            typer.Option(
                "--detach",
                "-d",
                help="in the background: return once attached (JOB_DIR/logs/launcher.log; `rlctl status -w JOB`)",
            ),
        ] = False,
        force: Annotated[
            bool,
            typer.Option(
                "--force", help="attach although the recorded launcher runs on another machine (it must be gone)"
            ),
        ] = False,
        output: OutputOpt = OutputFormat.table,
    ) -> None:
        """Watch a running job whose launcher is gone, to its end: record it, evaluate it, resume it if it fails
        (`checkpoint.auto_resume`), as its launcher would have."""
        from rlctl.launch.locks import LOCK_FD_ENV
        from rlctl.ops.jobdb import JobDB
        from rlctl.ops.jobref import require_job_dir, resolve
        from rlctl.ops.refusals import refuse_if_unprepared

        code_digest()  # this launcher's code as it starts, which the agents it starts must run (rlctl.buildid)
        db = JobDB()
        lock = contextlib.ExitStack()  # the launcher lock, from its checks into the run's end
        try:
            ref = resolve(job, db=db)
            # its index row outlived it: said so, versus an ended job's hints (`rlctl status JOB`, `launch --resume
            # JOB`), which both fail on it
            require_job_dir(ref)
            source = ref.row.info.get("source") if ref.row is not None else None
            if ref.row is not None and ref.row.state not in LIVE:
                # stopped before it was prepared: launch it anew, versus `refuse_attach`'s `continue it with
                # rlctl launch --resume JOB`, which refuses it
                refuse_if_unprepared(ref.jobdir, source=source, nothing="nothing to watch")
            refuse_attach(ref.id, ref.row, force=force)
            # its launcher died preparing it (a reboot in the SFT warm-up): no job.json, no agent to watch
            refuse_if_unprepared(ref.jobdir, source=source, nothing="nothing to watch")
            plan = ref.jobdir.read_plan()  # a damaged one said here, not in a detached launcher's log
            # this process as the job's launcher from here, as `launch --resume` takes it: of two attaches started at
            # once (both passed the checks above), the second is refused here in one line; with --detach the lock is
            # handed on to the launcher it spawns (its descriptor inherited: `JobDir.launcher_lock`), versus taken
            # only by that launcher, the second's then refused in its log (`has a launcher already`)
            lock_fd = lock.enter_context(ref.jobdir.launcher_lock())
        except BaseException:
            lock.close()
            db.close()
            raise
        jd = ref.jobdir
        if detach_:
            db.close()
            with lock:  # (its own copy let go once that launcher said it attached, or ended)
                run_detached(
                    ["attach", str(jd.path), *(["--force"] if force else [])],
                    jd.path,
                    output,
                    env={LOCK_FD_ENV: str(lock_fd)},
                    pass_fds=(lock_fd,),
                )
            return

        def begin(runs: Runs, say: Callable[[str], None]) -> JobRun:
            run = runs.attach()
            say(f"job {spec.name}: attached to {run.controller.spec.name if run.controller else '?'}")
            return run

        # the lock taken above, held to the run's end; the index closed however it ends (`be_launcher` closes it too:
        # a second close does nothing), versus left open where job.json does not read
        with lock, contextlib.closing(db):
            spec = jd.read_job()
            be_launcher(jd, spec, plan, db, begin, output, locked=True)
