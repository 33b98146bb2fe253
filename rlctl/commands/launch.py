"""`rlctl launch JOB.yaml`: plan, start controller + trainer + rollout agents, watch, summarise.

Progress goes to stderr (a live line on a TTY, plain log lines otherwise); the summary goes to stdout
(`-o json`: one JSON object). Ctrl-C stops every agent before exiting. `--detach` returns once the job runs and
leaves a launcher in the background to watch it to its end; an attached launcher whose terminal goes away (SIGHUP)
becomes one (`rlctl.ops.detach`). This module is the command (its options, a fresh launch, `--dry-run`); its parts
by concept — the views, Ctrl-C lines, the launcher, `--detach`, `--resume` — are in `rlctl.commands.launching`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rlctl.buildid import code_digest
from rlctl.commands.launching.detached import run_detached
from rlctl.commands.launching.interrupts import said_if_interrupted
from rlctl.commands.launching.launcher import be_launcher
from rlctl.commands.launching.resume import resume_job
from rlctl.commands.launching.views import DRY_RUN_MASTER_PORT, dry_table, refused_lines
from rlctl.config.job import MAX_ITERATIONS
from rlctl.errors import ConfigError, LaunchError, UsageError
from rlctl.render import OutputFormat, OutputOpt, emit

if TYPE_CHECKING:  # the runtime's modules load when a command runs (`rlctl --help` starts in a fraction of a second)
    from rlctl.ops.autoresume import Runs
    from rlctl.ops.run import JobRun


class Mode(StrEnum):
    sync = "sync"
    stream = "stream"
    async_ = "async"


PREFLIGHT_PASSED_ENV = "RLCTL_PREFLIGHT_PASSED"  # `_checked` of the job file the detaching launcher checked


def _checked(job_file: Path) -> str:
    """The job file as `preflight` saw it: its path, size and modification time."""
    st = job_file.stat()
    return f"{job_file.absolute()}:{st.st_size}:{st.st_mtime_ns}"


def register(app: typer.Typer) -> None:
    @app.command()
    def launch(
        job_file: Annotated[
            Path | None, typer.Argument(help="job file (jobs/*.yaml)", metavar="JOB.yaml", show_default=False)
        ] = None,
        iterations: Annotated[
            int | None,
            typer.Option(
                "--iterations",
                min=1,
                max=MAX_ITERATIONS,
                help="override the job's iterations; with --resume, the job's new total (a finished job trains on)",
            ),
        ] = None,
        mode: Annotated[Mode | None, typer.Option("--mode", help="override the pipeline mode")] = None,
        job_dir: Annotated[
            Path | None,
            typer.Option(
                "--job-dir",
                help="job directory (default: the job file's job_dir, else runs/<name>-<time> here, or under "
                "$RLCTL_HOME where it is set)",
            ),
        ] = None,
        dry_run: Annotated[
            bool,
            typer.Option(
                "--dry-run",
                help="print every agent's exact sbatch script / SSH command; start nothing (with --resume JOB "
                "--trainer-split: that split checked and shown)",
            ),
        ] = False,
        resume: Annotated[
            str | None,
            typer.Option(
                "--resume",
                metavar="JOB",
                help="continue a stopped or failed job (name, id or directory) from its latest complete checkpoint "
                "(a finished one is refused, nothing is left to run, unless --iterations gives it more)",
            ),
        ] = None,
        checkpoint: Annotated[
            str | None,
            typer.Option(
                "--checkpoint",
                metavar="V",
                help="with --resume: continue from checkpoint V (20 or v20) instead of the latest, setting the "
                "newer ones aside (a roll-back)",
                show_default=False,
            ),
        ] = None,
        trainer_split: Annotated[
            str | None,
            typer.Option(
                "--trainer-split",
                metavar="tp=T,pp=P[,dp=D]",
                help="with --resume: the trainer's new split on its site (ranks = tp × pp × dp; a part left out keeps "
                "the plan's), checked as a launch checks one and written to plan.json; the checkpoint's state is "
                "rebuilt for it (megatron; torch dp). With --dry-run: checked and shown, nothing written",
                show_default=False,
            ),
        ] = None,
        detach_: Annotated[
            bool,
            typer.Option(
                "--detach",
                "-d",
                help="return once the job runs: a launcher in the background watches it to its end, its log "
                "JOB_DIR/logs/launcher.log (`rlctl status -w JOB` follows it)",
            ),
        ] = False,
        output: OutputOpt = OutputFormat.table,
    ) -> None:
        """Run a job: SFT warm-up (cached), then controller, trainer and rollout agents on their sites
        (local processes, SLURM jobs, SSH hosts). `--resume JOB` continues a stopped or failed one."""
        with said_if_interrupted(job_file, resume) as made:  # (`made`: the job dir, once made)
            from rlctl.config import load_job
            from rlctl.config.job import Job
            from rlctl.config.model import HfModel
            from rlctl.launch.jobdir import JobDir
            from rlctl.launch.layout import plan_sites
            from rlctl.ops.counts import plan_counts, resolve_job
            from rlctl.ops.inputs import prepare_data, refuse_users_dirs, warmup_line
            from rlctl.ops.jobdb import JobDB, open_or_none
            from rlctl.ops.jobprep import prepare
            from rlctl.ops.launchdir import entries, fresh_dir, index_left, launch_dir, reserved, unmade_left, unmake
            from rlctl.ops.preflight import preflight, problems, refuse
            from rlctl.ops.preflight.sites import job_sites
            from rlctl.ops.preflight.slurmoptions import ASK_S, sites_option_problems
            from rlctl.ops.run import JobRun
            from rlctl.rl.dataset_scan import keeping_rows

            code_digest()  # this launcher's code as it starts, which its agents must run (rlctl.buildid)
            if resume is not None:
                if job_file is not None or mode is not None or job_dir is not None:
                    raise UsageError("--resume JOB takes no job file, --mode or --job-dir")
                if dry_run and (trainer_split is None or detach_ or iterations is not None or checkpoint is not None):
                    raise UsageError(
                        "--resume JOB --dry-run shows a --trainer-split alone: it takes no --iterations, --checkpoint "
                        "or --detach, and needs --trainer-split"
                    )
                resume_job(
                    resume,
                    output,
                    detached=detach_,
                    iterations=iterations,
                    checkpoint=checkpoint,
                    trainer_split=trainer_split,
                    dry_run=dry_run,
                )
                return
            if trainer_split is not None:
                raise UsageError("--trainer-split changes a resumed job's split: give it with --resume JOB")
            if checkpoint is not None:
                raise UsageError("--checkpoint names where a resume continues from: give it with --resume JOB")
            if job_file is None:
                raise UsageError("missing JOB.yaml", hint="`rlctl launch jobs/demo.yaml`, or `--resume JOB`")
            if dry_run and detach_:
                raise UsageError("--dry-run starts nothing: it takes no --detach")
            job = load_job(job_file)
            spec = resolve_job(job, iterations=iterations, mode=mode.value if mode is not None else None)
            # what check refuses, of the job as it runs: --iterations and --mode change what its fields do (a field
            # of async mode is unread under --mode sync)
            runs = job if spec is job.spec else Job(spec, job.inventory, job.path, mapping=job.mapping)
            # a launcher started by --detach for this very file, unchanged: the launch that started it planned and
            # checked the job, and said what they found (its stamp taken here, never passed on to the agents)
            checked = os.environ.pop(PREFLIGHT_PASSED_ENV, None) == _checked(job_file)
            try:
                plan = plan_counts(job, spec, noted=checked)
            except ConfigError:  # a job field the planner refuses: every problem check finds, one line each, exit 2
                preflight(runs)
                raise
            if dry_run:  # the scripts even of a job check refuses, under what it refuses: nothing pretends it starts
                refused = problems(runs, plan=plan)
                try:
                    path = fresh_dir(job, spec, job_dir)
                except UsageError as e:  # shown all the same: what it would run is the question here
                    path = JobDir.choose_path(spec.name, explicit=job_dir if job_dir is not None else spec.job_dir)
                    if not path.name:  # the root: no id, and its sites' job dirs would be W/jobs/, every job's
                        raise
                    sys.stderr.write(f"rlctl: note: a launch would be refused: {e} (hint: {e.hint})\n")
                sites = {n: job.inventory.sites[n] for n in plan_sites(plan)}
                # the id the launch would give it (its sites' job dirs): its directory's name where the index cannot
                # be read, which a dry run does not write
                db = open_or_none(without=f"the job's id is taken as its directory's name, {path.name}")
                with contextlib.nullcontext() if db is None else contextlib.closing(db):
                    job_id = path.name if db is None else db.id_for(path)
                dry = JobRun(JobDir(path, job_id=job_id), spec, plan, sites=sites)
                try:
                    rows = dry.render(master_port=DRY_RUN_MASTER_PORT)
                except LaunchError:  # agents the sites cannot hold (check names why): no scripts to show; exit 2
                    refuse(str(job.path), refused)
                    raise
                finally:
                    dry.backends.close()
                staging = dry.staging_plan()
                if output is OutputFormat.json and refused:  # stdout stays the documented list of agents
                    sys.stderr.write("\n".join(refused_lines(refused)) + "\n")
                emit(rows, output, lambda r: dry_table(r, staging, refused))
                return
            path = fresh_dir(job, spec, job_dir)  # a directory holding a job already: refused, its record kept
            # the directory's model/, data/ or reward/ the user's: refused before anything is written there (the rows
            # --detach writes; the job dir's lock, secret, logs/ and checkpoints/, made by `launch_dir`), and before
            # the check reads the dataset (the rows it keeps for the prepare would be left in this process)
            refuse_users_dirs(JobDir(path), spec, job)
            # what `rlctl check` refuses, refused before anything is built or started (once: a launcher started by
            # --detach for this very file, unchanged, does not check again — a dataset's rows are read to the end)
            if not checked:
                # a dataset's rows, read and tokenized by the check, are kept for this process's prepare (or, with
                # --detach, written to the job dir below)
                with keeping_rows():
                    preflight(runs, plan=plan)
                # a SLURM site's constraint and reservation, asked of its cluster as `check --reach` asks them (sinfo,
                # scontrol): sbatch refused them at the first agent's job, after the job dir was made and staged
                used = {n: job.inventory.sites[n] for n in job_sites(runs)}
                refuse(str(job.path), sites_option_problems(used, files=job.inventory.origin, timeout_s=ASK_S))
            # the directory as this launch found it (None: a new one), as a launch refused as it prepares leaves it
            found = entries(path) if job_dir is not None or spec.job_dir is not None else None
            if detach_:  # the same launch in the background, into the directory chosen (and, if new, made) here
                if job_dir is None and spec.job_dir is None:  # a timestamped one: not one another launch made meanwhile
                    path = JobDir.create(spec.name).path
                if isinstance(spec.model, HfModel):  # a dataset's rows the check kept, prepared where the launcher's
                    # prepare finds them (its model/init holds the same tokenizer), versus read and tokenized again
                    try:
                        prepare_data(path, spec, job, model_dir=Path(spec.model.path))
                    except KeyboardInterrupt:  # the job dir made here goes in the index, stopped (as a launch that
                        # prepares it itself leaves it), versus outside it: `rlctl status` and `stop` did not find it
                        if path.is_dir():
                            jd = JobDir.create(spec.name, explicit=path)
                            made.append(reserved(jd, spec, source=str(job_file.absolute())))
                        raise
                over = ["--iterations", str(iterations)] if iterations is not None else []
                over += ["--mode", mode.value] if mode is not None else []
                args = ["launch", str(job_file.absolute()), "--job-dir", str(path), *over]
                # its launcher, stopped as it began (Ctrl-C), may not have put the job dir made here in the index
                # yet: put there, stopped, versus left outside it (`status`, `stop` did not find it)
                run_detached(
                    args,
                    path,
                    output,
                    env={PREFLIGHT_PASSED_ENV: _checked(job_file)},
                    cancelled=lambda: index_left(path, spec, source=str(job_file.absolute())),
                    unstarted=lambda: unmade_left(path, found),  # refused as it prepared: what was made here, removed
                )
                return
            # (a timestamped directory chosen again: `path` may be another launch's)
            jd = launch_dir(job, spec, job_dir)
            made.append(jd)

            def begin(runs: Runs, say: Callable[[str], None]) -> JobRun:
                units = sum(g["units"] for g in plan["rollout"])
                priced = plan["source"] + (f", profile {plan['profile']}" if "profile" in plan else "")
                named = (
                    "" if jd.id == jd.path.name else f", id {jd.id} (the id {jd.path.name} is another indexed job's)"
                )
                say(
                    f"job {spec.name}: {spec.pipeline.mode} (η={spec.pipeline.eta}), {spec.iterations} iterations, "
                    f"{plan['trainer']['ranks']} trainer rank(s), {units} rollout unit(s) ({priced}); "
                    f"dir {jd.path}{named}"
                )
                # in the index from here: `rlctl stop` finds it; its job file absolute, as the hints that name it (a
                # launch stopped here: `rlctl launch FILE` anew) are read from any directory
                check = runs.preparing(source=str(job_file.absolute()))
                if (warming := warmup_line(spec)) is not None:
                    say(warming)
                try:
                    prepare(jd, spec, plan, source=str(job_file), job=job, check=check)
                except (ConfigError, UsageError):  # its inputs refused (`copy_inputs`): nothing left, as a check's
                    runs.unindex()  # refusal leaves nothing (a launcher in the background: what it made)
                    unmake(jd.path, found)
                    raise
                return runs.start()

            be_launcher(jd, spec, plan, JobDB(), begin, output)
