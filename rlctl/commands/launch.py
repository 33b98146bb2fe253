"""`rlctl launch JOB.yaml`: plan, start controller + trainer + rollout agents, watch, summarise.

Progress goes to stderr (a live line on a TTY, plain log lines otherwise); the summary goes to stdout
(`-o json`: one JSON object). Ctrl-C stops every agent before exiting. `--detach` returns once the job runs and
leaves a launcher in the background to watch it to its end; an attached launcher whose terminal goes away (SIGHUP)
becomes one (`rlctl.ops.detach`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import sys
from collections.abc import Callable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rlctl.config.job import MAX_ITERATIONS
from rlctl.errors import ConfigError, LaunchError, RlctlError, UsageError
from rlctl.ops import detach
from rlctl.render import OutputFormat, OutputOpt, emit, grid, reward_failures_line
from rlctl.textutil import duration

if TYPE_CHECKING:  # the runtime's modules load when a command runs (`rlctl --help` starts in a fraction of a second)
    from rlctl.config.job import JobFile
    from rlctl.launch.jobdir import JobDir
    from rlctl.ops.autoresume import Runs
    from rlctl.ops.jobdb import JobDB
    from rlctl.ops.jobref import JobRef
    from rlctl.ops.preflight.base import Problem
    from rlctl.ops.run import JobRun

log = logging.getLogger(__name__)


class Mode(StrEnum):
    sync = "sync"
    stream = "stream"
    async_ = "async"


def _fmt(v: Any, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def progress_line(st: dict[str, Any]) -> str:
    left = f" (≈ {duration(st['eta_s'])} left)" if st.get("eta_s") else ""
    return (
        f"iter {st['iteration']}/{st['iterations']}{left}  reward {_fmt(st.get('reward'))}  "
        f"samples/s {_fmt(st.get('samples_per_s'), '.1f')}  T_gen {_fmt(st.get('t_gen_s'), '.2f')}s  "
        f"T_train {_fmt(st.get('t_train_s'), '.2f')}s  δ {_fmt(st.get('delta_s'), '+.2f')}s  "
        f"weights v{st.get('weight_version')}  agents "
        + " ".join(f"{a['name']}:{a['state']}" for a in st.get("agents", []))
    )


def _heldout(s: dict[str, Any]) -> str | None:
    """The summary's held-out row; None without figures, or where they do not read (null or text: a summary.json
    edited, an older rlctl's), as `rlctl status` leaves it out (`outcome_rows`), versus a TypeError traceback as
    the launch ended, its table lost."""
    from rlctl.ops.evaluation import heldout_line

    if not isinstance(held := s.get("heldout"), dict):
        return None
    try:
        return heldout_line(held)
    except (KeyError, TypeError, ValueError):
        return None


def summary_table(s: dict[str, Any]) -> str:
    led = s["ledger"]
    rows = [
        ["state", s["state"]],
        ["mode (η)", f"{s['mode']} ({s['eta']})"],
        ["iterations", f"{s['iterations']}/{s['iterations_planned']}"],
        ["reward", f"{_fmt(s['reward_first'])} → {_fmt(s['reward_last'])} (mean of first/last {s['reward_window']})"],
        *([["held-out", held]] if (held := _heldout(s)) is not None else []),
        *([["reward failures", failures]] if (failures := reward_failures_line(s.get("rewards") or {})) else []),
        ["samples/s", _fmt(s["samples_per_s"], ".1f")],
        ["tokens/s", _fmt(s["tokens_per_s"], ".0f")],
        [
            "T_gen / T_train / δ",
            f"{_fmt(s['t_gen_s'], '.2f')} / {_fmt(s['t_train_s'], '.2f')} / {_fmt(s['delta_s'], '+.2f')} s",
        ],
        [
            "bubble rollout / trainer",
            f"{_fmt(s['bubble_fraction']['rollout'], '.2f')} / {_fmt(s['bubble_fraction']['trainer'], '.2f')}",
        ],
        [
            "staleness",
            " ".join(f"{k}:{v}" for k, v in s["staleness"].items()) + f"  violations {s['staleness_violations']}",
        ],
        ["ledger", ledger_line(led)],
        ["partial rollouts", partials_line(led)],
        *time_rows(s),
        ["job dir", s["job_dir"]],
    ]
    if (far := s.get("controller_job_dir")) is not None:  # where the controller's site keeps the job's record
        rows.append(["controller's job dir", f"{far['path']} (on site {far['site']})"])
    if (n := s.get("next")) is not None:
        rows.append(["next", f"`{n['report']}` (curves), `{n['checkpoints']}`, `{n['pull']}` (its final model)"])
    return grid(rows, ["", ""], f"Job {s['job']}")


def time_rows(s: dict[str, Any]) -> list[list[str]]:
    """What each time figure covers: this launcher's (`wall`: staging, every run, its automatic resumes), the job's
    training across resumes and this run's (`training`), and how often the job resumed (`resumed`, when it did).
    Before, `wall` (the last run's alone), summary.json's run_s and `report`'s wall s disagreed unexplained, and a
    resume showed only in `--output json`."""
    auto = int(s.get("auto_resumes") or 0)
    wall = f"{s['wall_s']:.1f} s, this launcher's"
    if auto and s.get("run_wall_s") is not None:
        wall += f" (its last run: {s['run_wall_s']:.1f} s)"
    rows = [["wall", wall]]
    if s.get("run_s") is not None:
        training = f"{s['run_s']:.1f} s this run (first sample → last iteration)"
        if s.get("job_wall_s") is not None and (s.get("resilience") or {}).get("resumes"):
            training += f"; {s['job_wall_s']:.1f} s since the job's first start"
        rows.append(["training", training])
    resumes = int((s.get("resilience") or {}).get("resumes") or 0)
    if resumes:
        by = f", {auto} by this launcher (checkpoint.auto_resume)" if auto else ""
        rows.append(["resumed", f"{resumes} time{'s' * (resumes > 1)}{by}"])
    return rows


def ledger_line(led: dict[str, Any]) -> str:
    """The summary's prompt ledger; the samples left out of a trained group (`filtered`: their reward held the
    trainer) when there were any, without which the staleness row's sum (the trained samples) matched no count."""
    return (
        f"prompts {led['prompts']} trained {led['trained']} requeued {led['requeued']} "
        f"lost {led['lost']} duplicated {led['duplicated']}"
        + (f" dropped {led['dropped']} (no signal)" if led.get("dropped") else "")
        + (f" quarantined {led['quarantined']} (crashed units)" if led.get("quarantined") else "")
        + (
            f"; samples: {led['filtered']} filtered (their reward held the trainer), "
            f"{led.get('trained_samples', '-')} trained"
            if led.get("filtered")
            else ""
        )
    )


def partials_line(led: dict[str, Any]) -> str:
    """The summary ledger's partial rollouts: moved and resumed work, and what lost units' generations kept and
    lost (at most; and as measured by the flight records the controller's host held)."""
    p = led["partials"]
    line = f"migrated {led['migrated']} resumed {p['resumed']} ({p['resumed_tokens']} tokens not generated again)"
    if p.get("interrupted"):
        line += (
            f"; {p['interrupted']} cut by a lost unit: {p['interrupted_kept_tokens']} tokens kept, "
            f"≤ {p['interrupted_lost_tokens_max']} generated again"
        )
        if n := p.get("lost_units_measured"):
            line += f" ({p['interrupted_lost_tokens_measured']} by the flight records of {n} lost unit{'s' * (n > 1)})"
    return line


class Progress:
    """A live line on a TTY, one plain line per new iteration otherwise (stderr either way)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = -1
        self.live: Any = None
        if self.tty:
            from rich.console import Console
            from rich.live import Live

            # redrawn by this thread's updates only: no refresh thread writing to a terminal that may go away
            self.live = Live(console=Console(stderr=True), auto_refresh=False, transient=False)
            with detach.terminal_frame():
                self.live.start()

    def _live(self) -> Any:
        """The live display, until a SIGHUP moved this process's output to the job's log (plain lines from then)."""
        if self.live is not None and detach.hung_up():
            live, self.live = self.live, None
            live.console.quiet = True  # its last frame is for a terminal: not for the log
            with contextlib.suppress(OSError), detach.terminal_frame():
                live.stop()
        return self.live

    def say(self, text: str) -> None:
        try:  # a terminal that went away, or a closed pipe, must not end the launcher
            if (live := self._live()) is not None:
                with detach.terminal_frame():
                    live.console.print(text)
            else:
                sys.stderr.write(text + "\n")
                sys.stderr.flush()
        except OSError:
            pass

    def show(self, text: str) -> None:
        """The live line, e.g. the staging bar (a TTY only: nothing otherwise)."""
        if (live := self._live()) is not None:
            with contextlib.suppress(OSError), detach.terminal_frame():
                live.update(text, refresh=True)

    def __call__(self, st: dict[str, Any]) -> None:
        if self._live() is not None:
            self.show(progress_line(st))
        elif st["iteration"] != self.last:
            self.last = st["iteration"]
            self.say(progress_line(st))

    def close(self) -> None:
        if (live := self._live()) is not None:
            with contextlib.suppress(OSError), detach.terminal_frame():
                live.stop()


DRY_RUN_MASTER_PORT = 29500  # a real launch picks a free port on the trainer's first host


def _sites_of(plan: dict[str, Any]) -> set[str]:
    return {plan["trainer"]["site"], plan["controller_site"], *(g["site"] for g in plan["rollout"])}


def staging_table(staging: list[dict[str, Any]]) -> str:
    """Where `launch` copies the job's files on each site (sites share no filesystem)."""
    rows = [[s["site"], ", ".join(s["hosts"]), s["job_dir"], " ".join(s["files"]) or "-", s["note"]] for s in staging]
    return grid(rows, ["site", "hosts", "job dir on the site", "staged there", ""], "Staging")


def refused_lines(found: list[Problem]) -> list[str]:
    """What `rlctl check` (and a launch) refuses in the job, for `--dry-run`: a marked section, one line each."""
    if not found:
        return []
    return [f"# would be refused by `rlctl check` ({len(found)}): a launch stops before starting anything"] + [
        f"#   {p.field}: {p.message}" + (f" (hint: {p.hint})" if p.hint else "") for p in found
    ]


def _devices_cell(r: dict[str, Any]) -> str:
    """The dry-run table's CUDA_VISIBLE_DEVICES / SLURM request of one agent: "none" where it gets no GPU (it is
    told CUDA_VISIBLE_DEVICES="", the controller and a `gpu: CPU` site's agents)."""
    if r["cuda_visible_devices"] is None or (r["cuda_visible_devices"] == "" and r["gpu_request"]):  # (SLURM's)
        return str(r["gpu_request"] or "-")
    return str(r["cuda_visible_devices"] or "none")


def dry_table(
    rows: list[dict[str, Any]], staging: list[dict[str, Any]] | None = None, refused: list[Problem] | None = None
) -> str:
    """What `rlctl check` refuses (if anything), where each agent runs and what it gets (one table), the
    staging plan, then every exact sbatch script / SSH command."""
    from rlctl.ops.runstart import DRY_RUN_CONTROLLER

    table = [
        [
            r["agent"],
            r["site"],
            r["host"] or ("(SLURM places it)" if r["backend"] == "slurm" else "this machine"),
            r["backend"],
            _devices_cell(r),
            r["threads"],
            r["parallel"],
        ]
        for r in rows
    ]
    head = ["agent", "site", "host", "backend", "CUDA_VISIBLE_DEVICES / SLURM request", "threads", "parallel"]
    out = refused_lines(refused or [])
    out += [
        f"# {len(rows)} agents; MASTER_PORT={DRY_RUN_MASTER_PORT} stands for the free port picked at launch, "
        f"{DRY_RUN_CONTROLLER} for the controller's address once it listens",
        grid(table, head),
    ]
    if staging is not None:
        out += ["", staging_table(staging)]
    for r in rows:
        out.append(f"\n# ---- {r['agent']} on site {r['site']} ({r['backend']}) ----\n{r['script'].rstrip()}")
    return "\n".join(out)


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
            Path | None, typer.Option("--job-dir", help="job directory (default runs/<name>-<time>)")
        ] = None,
        dry_run: Annotated[
            bool, typer.Option("--dry-run", help="print every agent's exact sbatch script / SSH command; start nothing")
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
        detach_: Annotated[
            bool,
            typer.Option(
                "--detach",
                "-d",
                help="return once the job runs: a launcher in the background watches it to its end "
                "(JOB_DIR/logs/launcher.log; `rlctl status -w JOB` follows it)",
            ),
        ] = False,
        output: OutputOpt = OutputFormat.table,
    ) -> None:
        """Run a job: SFT warm-up (cached), then controller, trainer and rollout agents on their sites
        (local processes, SLURM jobs, SSH hosts). `--resume JOB` continues a stopped or failed one."""
        with said_if_interrupted(job_file, resume) as made:  # (`made`: the job dir, once made)
            from rlctl.config import load_job
            from rlctl.config.job import HfModel, Job, sft_steps
            from rlctl.launch.jobdir import JobDir
            from rlctl.ops.counts import plan_counts, resolve_job
            from rlctl.ops.inputs import prepare_data, refuse_users_dirs
            from rlctl.ops.jobdb import JobDB
            from rlctl.ops.jobprep import prepare
            from rlctl.ops.launchdir import entries, fresh_dir, index_left, launch_dir, reserved, unmade_left, unmake
            from rlctl.ops.preflight import preflight, problems, refuse
            from rlctl.ops.run import JobRun
            from rlctl.rl.dataset import keeping_rows

            if resume is not None:
                if job_file is not None or dry_run or mode is not None or job_dir is not None:
                    raise UsageError("--resume JOB takes no job file, --dry-run, --mode or --job-dir")
                _resume(resume, output, detached=detach_, iterations=iterations, checkpoint=checkpoint)
                return
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
                sites = {n: job.inventory.sites[n] for n in _sites_of(plan)}
                with contextlib.closing(JobDB()) as db:  # the id the launch would give it: its sites' job dirs
                    job_id = db.id_for(path)
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
                if steps := sft_steps(spec):
                    say(f"SFT warm-up: {steps} steps (cached after the first run)")
                try:
                    prepare(jd, spec, plan, source=str(job_file), job=job, check=check)
                except (ConfigError, UsageError):  # its inputs refused (`copy_inputs`): nothing left, as a check's
                    runs.unindex()  # refusal leaves nothing (a launcher in the background: what it made)
                    unmake(jd.path, found)
                    raise
                return runs.start()

            be_launcher(jd, spec, plan, JobDB(), begin, output)


class InterruptSaid(KeyboardInterrupt):
    """A Ctrl-C whose line was said (by the launcher, or the launch that waits for one in the background): exit 130,
    nothing more said."""


@contextlib.contextmanager
def said_if_interrupted(job_file: Path | None, resume: str | None) -> Iterator[list[JobDir]]:
    """Around `rlctl launch`: a Ctrl-C before its launcher says what became of the job (`InterruptSaid`) — the
    modules it loads, the job read, planned and checked (a dataset's every row), the directory made — is said in one
    line as well, versus exit 130 with nothing said (typer ends a KeyboardInterrupt so). A fresh launch's job
    directory, once made (appended to the list yielded), is in the index `launching`: it is stopped there."""
    made: list[JobDir] = []
    try:
        yield made
    except InterruptSaid:
        raise
    except KeyboardInterrupt:
        if resume is not None:
            line = f"rlctl: interrupted: the resume of job {resume} stopped before it started anything; "
            line += "the job is as it was"
        elif made:
            from rlctl.ops.jobdb import LIVE, JobDB

            with contextlib.closing(JobDB()) as db:  # its launcher never took it on: the row says how it ended
                db.update(made[0].id, state="stopped", only_from=LIVE)
            line = interrupted_line(made[0], None, source=str(job_file))
        else:
            line = f"rlctl: interrupted: the launch of {job_file} stopped before it started anything: nothing to stop"
        with contextlib.suppress(OSError):
            sys.stderr.write(line + "\n")
        raise


def be_launcher(
    jd: JobDir,
    spec: JobFile,
    plan: dict[str, Any],
    db: JobDB,
    begin: Callable[[Runs, Callable[[str], None]], JobRun],
    output: OutputFormat,
) -> None:
    """This process as the job's launcher (launch, `--resume`, attach): `begin` starts (or takes over) a run; it
    watches the job to its end (resuming it as `checkpoint.auto_resume` says), evaluates it and prints the summary.
    SIGTERM and Ctrl-C stop every agent; a SIGHUP moves its output to the job's log (`rlctl.ops.detach`); a
    launcher started by `--detach` is told the run started."""
    from rlctl.ops.autoresume import Runs
    from rlctl.ops.evaluation import add_heldout

    with contextlib.ExitStack() as held:
        held.callback(db.close)
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


def interrupted_line(
    jd: JobDir, run: JobRun | None, *, source: str | None = None, why: str = "interrupted", stopped: bool = True
) -> str:
    """What a launch Ctrl-C stopped says: the job stopped (every agent), and how to continue it; one stopped while
    it was prepared (no job.json: `launch --resume` refuses it), how to launch it again from `source`. `stopped`
    False: the stop failed (its warning line said why): not said to have stopped every agent."""
    from rlctl.launch.jobdir import resume_command
    from rlctl.ops.jobprep import launch_again

    if run is None and not jd.job_json.exists():
        return (
            f"rlctl: {why}: job {jd.id} stopped while its launch prepared it (nothing started); "
            f"launch it again with `{launch_again(source)}`"
        )
    how = run.resume_command() if run is not None else resume_command(jd.path)
    if run is not None and run.unstarted:  # a resume stopped while it staged: no agent ran, the job put back as it
        # was (a finished one stays finished: a plain resume is refused; a roll-back's --checkpoint is not kept)
        return (
            f"rlctl: {why}: the resume of job {jd.id} stopped before any agent of it started; the job is as it "
            f"was before it: continue it with `{how}` (and the resume's --iterations / --checkpoint, where it had them)"
        )
    if not stopped:  # (an agent on a site the stop could not reach may still run)
        return f"rlctl: {why}: job {jd.id}: its stop failed (the warning above); continue it with `{how}`"
    return f"rlctl: {why}: job {jd.id} stopped (every agent); continue it with `{how}`"


def started(run: JobRun) -> dict[str, Any]:
    """What `launch --detach` reports once the job runs (`run`: its JobRun, started)."""
    return {
        "id": run.id,
        "state": "running",
        "job_dir": str(run.jobdir.path),
        "launcher_pid": os.getpid(),
        "launcher_log": str(detach.log_path(run.jobdir.path)),
    }


def _started_table(r: dict[str, Any]) -> str:
    ref = shlex.quote(r["id"])  # as a shell reads it (a job dir `my run (2)`)
    rows = [
        ["job dir", r["job_dir"]],
        ["launcher", f"pid {r['launcher_pid']}, watching the job to its end; its log: {r['launcher_log']}"],
        ["follow", f"rlctl status -w {ref}  ·  rlctl logs {ref} launcher -f"],
        ["stop", f"rlctl stop {ref}"],
    ]
    return grid(rows, ["", ""], f"Job {r['id']}: running (detached)")


def _flags() -> list[str]:
    """This process's --debug / -v, for a launcher it starts."""
    level = logging.getLogger().getEffectiveLevel()
    return ["--debug"] if level <= logging.DEBUG else ["-v"] if level <= logging.INFO else []


PREFLIGHT_PASSED_ENV = "RLCTL_PREFLIGHT_PASSED"  # `_checked` of the job file the detaching launcher checked


def _checked(job_file: Path) -> str:
    """The job file as `preflight` saw it: its path, size and modification time."""
    st = job_file.stat()
    return f"{job_file.absolute()}:{st.st_size}:{st.st_mtime_ns}"


def run_detached(
    args: list[str],
    job_dir: Path,
    output: OutputFormat,
    *,
    env: dict[str, str] | None = None,
    cancelled: Callable[[], object] = lambda: None,
    unstarted: Callable[[], object] = lambda: None,
) -> None:
    """`rlctl ARGS` as a launcher in the background (`detach.spawn`, with `env`); its lines shown here until the
    job runs. A Ctrl-C stops it (`cancelled` then puts right what it left) and says in one line what is left; one
    that ended before the job ran (its error among its lines) is put right by `unstarted`."""
    child = detach.spawn([*_flags(), *args], detach.log_path(job_dir), env=env)

    def write(data: bytes) -> None:
        sys.stderr.buffer.write(data)
        sys.stderr.flush()

    try:
        info = child.follow(write)
    except KeyboardInterrupt as e:
        sys.stderr.write("rlctl: interrupted: stopping the launch in the background... ")  # (up to a minute)
        sys.stderr.flush()
        try:
            child.cancel()
            ended = "it stopped"
        except KeyboardInterrupt:  # a second Ctrl-C: not waited for (SIGTERMed, it stops what it started), versus
            # 'stopped before it started anything: nothing to stop' said, and what it left not put right
            ended = "not waited for (told to stop, it may still be stopping)"
        try:
            cancelled()
            left = _left_by_cancel(job_dir, ended)
        except KeyboardInterrupt:  # a third: the line said without looking, versus a plain KeyboardInterrupt that
            # `rlctl launch` said of as 'stopped before it started anything: nothing to stop'
            left = (
                f"{ended}; what it left not looked at (interrupted again): `rlctl status {shlex.quote(str(job_dir))}`"
            )
        sys.stderr.write(left + "\n")
        raise InterruptSaid from e
    if info is None:  # it ended before the job ran: its error was among its lines
        try:
            unstarted()
        except KeyboardInterrupt as e:  # the line said without looking, versus a plain KeyboardInterrupt that
            # `rlctl launch` said of as 'stopped before it started anything: nothing to stop'
            sys.stderr.write(
                "rlctl: interrupted: the launch in the background ended before the job ran (its lines above say "
                f"why); what it made in {shlex.quote(str(job_dir))} may be left (interrupted as it was removed)\n"
            )
            raise InterruptSaid from e
        code = child.proc.returncode
        raise typer.Exit(code if code else 1)
    emit(info, output, _started_table)


def _left_by_cancel(job_dir: Path, ended: str = "it stopped") -> str:
    """What a launcher in the background, stopped as it began (`run_detached`), left: the job in the index and its
    state, a job dir outside it, or nothing; and the command that looks at it. Versus 'stopping the launch in the
    background' alone, which said neither."""
    from rlctl.launch.jobdir import JobDir
    from rlctl.ops.jobdb import JobDB
    from rlctl.ops.jobref import JobRef

    if not job_dir.is_dir():
        return f"{ended}; nothing is left (no job dir)"
    here = job_dir.resolve()
    with contextlib.closing(JobDB()) as db:
        row = next((r for r in db.list() if Path(r.job_dir).resolve() == here), None)
    ref = JobRef(row.name if row is not None else JobDir(here).id, JobDir(here), row)
    look = f"`rlctl status {ref.arg}`; its launcher's lines: `rlctl logs {ref.arg} launcher`"
    if row is None:
        return f"{ended}; its job dir {here} is left, outside the index ({look}){_go_on(ref)}"
    return f"{ended}; job {row.name} is left in the index, {row.state}, its job dir {here} ({look}){_go_on(ref)}"


def _go_on(ref: JobRef) -> str:
    """What `_left_by_cancel` says goes on from the job left, as an attached launch's Ctrl-C line says it: a job
    never prepared (no job.json) launched anew from its job file, a finished one trained on (--iterations), another
    continued; nothing for one still live (its launcher not waited for, still stopping: `status` says when)."""
    from rlctl.launch.jobdir import resume_command
    from rlctl.ops.jobdb import LIVE
    from rlctl.ops.jobprep import launch_again

    if ref.row is not None and ref.row.state in LIVE:
        return ""
    if not ref.jobdir.job_json.is_file():
        return f"; launch it anew with `{launch_again(ref.row.info.get('source') if ref.row is not None else None)}`"
    if ref.row is not None and ref.row.state == "finished":
        return f"; train it on with `rlctl launch --resume {ref.arg} --iterations N`"
    return f"; continue it with `{resume_command(ref.id if ref.row is not None else ref.jobdir.path)}`"


def _resume(
    ref: str,
    output: OutputFormat,
    *,
    detached: bool = False,
    iterations: int | None = None,
    checkpoint: str | None = None,
) -> None:
    """`launch --resume JOB`: the same job directory and plan; the controller and trainer restore the latest
    complete checkpoint (every trainer rank the shard of its (tp, pp) position: a checkpoint written at
    another tp × pp × dp is refused), every prompt it had not trained is generated again, the curves continue.
    `iterations`: the job's new total (`rlctl.ops.extend`), which a finished job trains on to; `checkpoint`: the
    one it continues from instead of the latest (a roll-back)."""
    from rlctl.ops.extend import replace_job_json, rollback_to, with_iterations, write_iterations
    from rlctl.ops.jobchanges import launch_changes, refuse_fixed_edits
    from rlctl.ops.jobdb import JobDB
    from rlctl.ops.jobref import require_job_dir, resolve
    from rlctl.ops.operate import fetch_job_record
    from rlctl.ops.refusals import refuse_if_finished, refuse_if_id_live, refuse_if_running, refuse_if_unprepared

    db = JobDB()
    ref_ = resolve(ref, db=db)
    jd = ref_.jobdir
    counted, back = None, None
    try:
        require_job_dir(ref_)  # its index row outlived it: not "never prepared"
        refuse_if_unprepared(jd, source=ref_.row.info.get("source") if ref_.row is not None else None)
        refuse_fixed_edits(jd)  # (a hand edit its checkpoints cannot run on; the others are said as the run starts)
        plan = jd.read_plan()  # a damaged one refused before a roll-back sets checkpoints aside, or a detach
        if checkpoint is not None or iterations is not None:  # they read its events, metrics and summary: as the
            # controller's site has them (its launcher gone before its run ended fetched none), as `status` does
            fetch_job_record(ref_)
        if checkpoint is not None:
            back = rollback_to(jd, checkpoint)
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
    except RlctlError:
        db.close()
        raise
    if detached:
        db.close()
        again = ["--iterations", str(iterations)] if iterations is not None else []
        again += ["--checkpoint", str(back)] if back is not None else []
        run_detached(["launch", "--resume", str(jd.path), *again], jd.path, output)
        return
    if iterations is None:
        spec = jd.read_job()

    def begin(runs: Runs, say: Callable[[str], None]) -> JobRun:
        refuse_if_running(jd, arg=ref_.arg)
        # (before the count is written: one edited by hand is said as edited, unless --iterations sets another)
        changes = launch_changes(jd, count_given=counted is not None)
        # written once no run of it is left: its agents read job.json as they start; a count edited by hand is
        # written as one given with --iterations, the count it replaced kept among the earlier ones
        was = write_iterations(jd, spec.iterations)
        if counted is not None:
            say(f"job {spec.name}: {counted}")
        for line in changes:  # the job file edited since, or job.json: said, the job as launched runs
            say(f"job {spec.name}: {line}")
        try:
            return runs.start(resume=True, checkpoint=back)
        except BaseException:  # ended before any agent started (a checkpoint refused, staging failed): job.json
            if was is not None and runs.run is not None and runs.run.unstarted:  # as it was, as the run put back
                replace_job_json(jd, was)  # its summary and index row (`JobRun._unstart`)
            raise

    be_launcher(jd, spec, plan, db, begin, output)
