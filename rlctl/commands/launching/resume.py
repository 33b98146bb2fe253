"""`rlctl launch --resume JOB`: the same job directory and plan, continued from its latest complete checkpoint (or
one chosen: a roll-back), with --iterations its new total."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlctl.commands.launching.detached import run_detached
from rlctl.commands.launching.launcher import be_launcher
from rlctl.errors import LaunchError, RlctlError, UsageError
from rlctl.render import OutputFormat, emit

if TYPE_CHECKING:
    from rlctl.launch.jobdir import JobDir
    from rlctl.ops.autoresume import Runs
    from rlctl.ops.run import JobRun


def resume_job(
    ref: str,
    output: OutputFormat,
    *,
    detached: bool = False,
    iterations: int | None = None,
    checkpoint: str | None = None,
    trainer_split: str | None = None,
    dry_run: bool = False,
) -> None:
    """`launch --resume JOB`: the same job directory and plan; the controller and trainer restore the latest complete
    checkpoint (every trainer rank the shard of its (tp, pp) position; written at another tp × pp × dp, its state
    rebuilt from the old shards: `rlctl.checkpoint.resplit`), every prompt it had not trained is generated again, the
    curves continue. `iterations`: the job's new total (`rlctl.ops.extend`), which a finished job trains on to;
    `checkpoint`: the one it continues from instead of the latest (a roll-back). `trainer_split`: `--trainer-split`'s
    text, the trainer's new tp × pp × dp (`rlctl.ops.trainersplit`), checked before anything is written and written to
    plan.json as the run starts; `dry_run`: that split checked and shown, nothing written or started."""
    from rlctl.launch.jobdir import JobDir
    from rlctl.launch.layout import plan_sites, trainer_parallel
    from rlctl.launch.locks import LOCK_FD_ENV
    from rlctl.launch.record import record_is_here, record_view
    from rlctl.launch.recordfiles import replace_text
    from rlctl.ops.extend import (
        completed_checkpoints,
        replace_job_json,
        rollback_to,
        with_iterations,
        write_iterations,
    )
    from rlctl.ops.jobchanges import edited_fields, job_json_edits, refuse_fixed_edits, resume_changes
    from rlctl.ops.jobdb import JobDB
    from rlctl.ops.jobprep import launch_again
    from rlctl.ops.jobref import JobRef, require_job_dir, resolve
    from rlctl.ops.operate import fetch_job_record
    from rlctl.ops.preflight import refuse
    from rlctl.ops.preflight.slurmoptions import ASK_S, launched_option_problems
    from rlctl.ops.refusals import refuse_if_finished, refuse_if_id_live, refuse_if_running, refuse_if_unprepared
    from rlctl.ops.resumecheck import edit_problems
    from rlctl.ops.resumememory import judge_memory
    from rlctl.ops.resumepoint import refuse_lost_checkpoints
    from rlctl.ops.runstart import launched_from
    from rlctl.ops.trainersplit import parse_split, predicted_iteration, predicted_said, said

    asked = parse_split(trainer_split) if trainer_split is not None else None  # a bad value: one line, first
    db = JobDB()
    ref_ = resolve(ref, db=db)
    old = db.moved_here(ref_.jobdir.path) if ref_.row is None else None
    moved = old is not None
    if old is not None:
        # its directory was moved or renamed since its row was put: the job keeps its id (its row, moved here as the
        # run starts, and its sites' W/jobs/<id>), recorded in the directory by `begin`; versus the new directory's
        # name, a second row beside the old one, whose directory is gone (`status --all` listed the job twice)
        ref_ = JobRef(old.name, JobDir(ref_.jobdir.path, job_id=old.name), old)
    jd = ref_.jobdir
    counted, back = None, None
    lock = contextlib.ExitStack()  # the launcher lock, from before the record is fetched into the run's end
    try:
        require_job_dir(ref_)  # its index row outlived it: not "never prepared"
        refuse_if_unprepared(jd, source=ref_.row.info.get("source") if ref_.row is not None else None)
        plan = jd.read_plan()  # a damaged one refused before a roll-back sets checkpoints aside, or a detach
        jd.check_secret()  # a damaged one refused before a detach (and by the run: `JobRun.start`)
        if dry_run:  # (`launch` takes --dry-run with --resume only beside --trainer-split)
            assert asked is not None
            shown = _resplit(jd, plan, asked) or plan
            same = f"the plan's trainer split already: {trainer_parallel(plan).short()}; plan.json stays"
            line = (
                f"{said(plan, shown)}: the resume writes it to plan.json (dry run: nothing written)"
                if shown is not plan
                else same
            )
            shown_json = {"trainer": shown["trainer"], "was": plan["trainer"]}
            if shown is not plan and (pred := predicted_iteration(plan, shown, mode=jd.read_job().pipeline.mode)):
                line += f"; {predicted_said(pred)}"
                shown_json["predicted_iteration"] = pred
            emit(shown_json, output, lambda _: line)
            db.close()
            return
        # this process as the job's launcher from here (`JobDir.launcher_lock`, held into `be_launcher`): a job
        # another launcher holds is refused before anything below fetches the controller site's record into the job
        # dir that launcher works in (a --checkpoint is only checked here, `rollback_to`: the run's agents set the
        # newer ones aside as it starts); versus a probe of it (`launcher_holder`) that two resumes started at once
        # both passed, each then fetching before either took the lock
        lock_fd = lock.enter_context(jd.launcher_lock())
        if checkpoint is not None or iterations is not None:  # they read its events, metrics and summary: as the
            # controller's site has them (its launcher gone before its run ended fetched none), as `status` does
            fetch_job_record(ref_)
        # checkpoints/ lost where its events record some: one line here, before a detach and before anything is set
        # aside, versus a start from 0 (a staged.json that does not read: the run's, after staging, `resume_point`;
        # a --checkpoint not on disk: `rollback_to`'s own line)
        try:
            view = record_view(jd.path)
        except LaunchError:
            view = None
        if checkpoint is None and view is not None and record_is_here(view[0], view[2], jd.path):
            refuse_lost_checkpoints(jd, start_over=launch_again(launched_from(jd)))
        if checkpoint is not None:
            back = rollback_to(jd, checkpoint)
        # a hand edit its checkpoint cannot run on, refused before anything starts; a job that completed none (as
        # its events say) starts over and takes it, said as the run starts. One of three calls, each kept: here (the
        # checkpoint --checkpoint or the events name) it comes before a detach (whose error would go to its log, not
        # this terminal), before --iterations is written to job.json, and before the run sets the summary aside,
        # marks the index row `launching` and stages; an automatic resume never comes through here
        # (`Runs._resume_after` refuses for itself); the run's (`JobRun._prepare`) refuses it where the sites hold a
        # checkpoint the events miss (a record not fetched), the one place that checkpoint is known, after staging
        refuse_fixed_edits(jd, resumed=back if back is not None else max(completed_checkpoints(jd), default=0))
        if iterations is not None:  # a finished job given more to train is not one with nothing to resume
            named = jd.id if ref_.row is not None else str(jd.path)  # (an id the index lacks names no job)
            spec, counted = with_iterations(jd, iterations, since=back, ref=named)
        if counted is None and back is None:  # (rolled back, a finished job has its iterations after it to train)
            refuse_if_finished(jd, state=ref_.row.state if ref_.row is not None else None)
        if back is not None and back >= (planned := (spec if counted is not None else jd.read_job()).iterations):
            raise UsageError(
                f"--checkpoint v{back}: the job's last ({planned} iterations); nothing after it to train",
                hint=f"train on past it with `--iterations {2 * planned}`",
            )
        if ref_.row is None:  # not in the index (copied here, an index lost): its row is put under its id
            refuse_if_id_live(jd, db)
        if iterations is None and not detached:
            spec = jd.read_job()
        # a SLURM site's constraint and reservation (one ended since the launch), asked of its cluster as `check
        # --reach` asks them, once the job is one to resume: sbatch refused them at the first agent's job, after the
        # run was marked launching and staged (before a detach: said here, not in its launcher's log)
        refuse(str(jd.path), launched_option_problems(jd.path, plan_sites(plan), timeout_s=ASK_S))
        # the trainer's new split, checked as a launch checks one (the model, the site's room): refused here, before a
        # detach and before anything is written; plan.json is rewritten as the run starts (`begin`)
        resplit = _resplit(jd, plan, asked) if asked is not None else None
        edited = edited_fields(jd, count_given=counted is not None)
        # job.json as edited since the launch, checked as `rlctl check` checks a job file (read as launched else,
        # `RECORDED`: an edit a job file is refused for ran), its problems in the fields edited refused here, before a
        # detach and before anything is written (`rlctl.ops.resumecheck`)
        refuse(str(jd.job_json), edit_problems(jd, resplit or plan, edited=edited, iterations=iterations))
        unfit = None  # the plan's split, checked at the launch with the job as it was then: judged again here
        if resplit is None:
            unfit = judge_memory(jd, plan, edited=edited)
    except RlctlError:
        lock.close()
        db.close()
        raise
    except BaseException:
        lock.close()
        raise
    if detached:
        # handed on to the launcher it spawns, which takes it over as it resumes the job again (its own `resume_job`:
        # it fetches and checks the --checkpoint under it): the lock file's descriptor inherited, so the job is never
        # without it; versus let go before the spawn, where a `launch --resume` started before that launcher took it
        # again passed, and that launcher was refused (`has a launcher already`) after this one had fetched
        db.close()
        again = ["--iterations", str(iterations)] if iterations is not None else []
        again += ["--checkpoint", str(back)] if back is not None else []
        again += ["--trainer-split", trainer_split] if trainer_split is not None else []
        with lock:  # (its own copy let go once that launcher said the job runs, or ended)
            run_detached(
                ["launch", "--resume", str(jd.path), *again],
                jd.path,
                output,
                env={LOCK_FD_ENV: str(lock_fd)},
                pass_fds=(lock_fd,),
            )
        return

    def begin(runs: Runs, say: Callable[[str], None]) -> JobRun:
        refuse_if_running(jd, arg=ref_.arg, indexed=ref_.row is not None)
        if moved:  # the id its run and its agents read
            jd.name_as(jd.id)
        # (before the count is written: one edited by hand is said as edited, unless --iterations sets another)
        edits = job_json_edits(jd, count_given=counted is not None)
        # the job file, inventory or reward changed since the launch, which the resume does not take up, and a loss
        # this rlctl computes otherwise than the one that launched the job (as an automatic resume says them): read
        # before the count is written (an error or Ctrl-C as it reads them leaves job.json as it was: nothing puts it
        # back before the `try` below), said before the run starts, so that a resume that then fails (staging on a
        # host the changed inventory dropped) says it
        sources = resume_changes(jd)
        # written once no run of it is left: its agents read job.json as they start; a count edited by hand is
        # written as one given with --iterations, the count it replaced kept among the earlier ones
        was = write_iterations(jd, spec.iterations)
        plan_was = jd.plan_json.read_text() if resplit is not None else None
        try:
            if resplit is not None:  # what the run's agents are laid out by, and the controller's copy is staged from
                jd.write_json(jd.plan_json, resplit)
            if counted is not None:
                say(f"job {spec.name}: {counted}")
            if resplit is not None:
                say(f"job {spec.name}: {said(plan, resplit)}, written to plan.json")
            for line in sources + ([unfit] if unfit is not None else []):
                say(f"job {spec.name}: {line}")
            # the warning recorded for the run too, where `rlctl status` shows it (and for each automatic resume of it)
            run = runs.start(resume=True, checkpoint=back, warnings=[unfit] if unfit is not None else None)
        except BaseException:  # ended before any agent started (a checkpoint refused, staging failed): job.json
            # and plan.json as they were, where no run was made (an error or Ctrl-C after they were written, before
            # `runs.start` made one) or the run put the job back; versus job.json's --iterations count kept where no
            # run was made, while plan.json was put back and the interrupt said 'the job is as it was'
            unstarted = runs.run is None or runs.run.unstarted
            if was is not None and unstarted:  # as the run put back its summary and index row (`JobRun._unstart`)
                replace_job_json(jd, was)
            if plan_was is not None and unstarted:  # the split takes effect only with a run of it
                replace_text(jd.plan_json, plan_was)
            raise
        # job.json edited since: said once the run started on it, versus before, where a run that then refused the
        # edit (`JobRun._prepare`: a checkpoint its events miss) said it "runs the job as edited" and then that it
        # cannot take it
        for line in edits:
            say(f"job {spec.name}: {line}")
        return run

    with lock:  # taken above, held to the run's end
        be_launcher(jd, spec, resplit if resplit is not None else plan, db, begin, output, locked=True)


def _resplit(jd: JobDir, plan: dict[str, Any], asked: dict[str, int]) -> dict[str, Any] | None:
    """The job's plan with the trainer split as `--trainer-split` asks (`rlctl.ops.trainersplit.resplit_plan`), judged
    by the job as launched (job.json), its sites (sites.json) and its model's architecture; None: the plan's split."""
    from rlctl.launch.backends import read_sites
    from rlctl.ops.jobchanges import launched_inventory
    from rlctl.ops.resumememory import resumed_job
    from rlctl.ops.trainersplit import resplit_plan

    job = resumed_job(jd)
    arch = job.model.arch
    sites, inventory = read_sites(jd.path, required=True), launched_inventory(jd, plan)
    return resplit_plan(plan, asked, spec=job, sites=sites, arch=arch, inventory=inventory)
