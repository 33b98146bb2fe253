"""The runs of one job by one launcher: the first, then — `checkpoint.auto_resume: N` — up to N resumes of a run
that failed after it completed a newer checkpoint.

A job that runs for weeks loses a trainer node now and then; the controller then ends the run as failed and names
`rlctl launch --resume JOB`. With `auto_resume` its launcher runs that itself, so a failure at night costs the
iterations since the last checkpoint, not the night:

    start ─▶ wait ─▶ done / stopped ─────────────────────────────────────────▶ the summary
               └─▶ failed (the controller's summary says so, or it exited without one)
                     ├─ no resumes left, or no checkpoint completed since this run started ─▶ that failure
                     ├─ job.json edited in a field its checkpoints depend on (`refuse_fixed_edits`) ─▶ that failure
                     ├─ … or in one a rank is priced on, its need raised past its GPU (`judge_memory`) ─▶ that failure
                     ├─ … or into what `rlctl check` refuses of a job file (`edit_problems`) ─▶ that failure
                     ├─ another run's controller answers on the job's sites (`controller_elsewhere`) ─▶ that failure
                     ├─ what is left of the run cannot be stopped (a site that does not answer) ─▶ that failure
                     └─ else: say the resume, what changed since the launch (`launch_changes`) and a rank priced
                        past its GPU (`judge_memory`: recorded for the run), as `launch --resume` does,
                        `start(resume=True)` ─▶ wait …

A run that ended at its site's time limit (a SLURM job's `--time`: the site's `scheduler.time_limit_min`; SLURM's
TERM, then the controller's `failed: controller got SIGTERM` or a trainer lost) is a planned end, not a crash: it is
resumed as a failure is (a newer checkpoint completed, `auto_resume` > 0) but spends none of `auto_resume`, so a
week-long job under a 24 h limit needs no `auto_resume: 7`; the checkpoint it must have completed keeps it from
looping. `JobRun.time_limit` asks the controller's and the trainer's scheduler (`LaunchBackend.at_time_limit`).

A run that completed no newer checkpoint is not resumed: it would start where it started and, most likely, fail the
same way (a reward that raises, a trainer that cannot load): a crash loop that spends the cluster. A user's stop
(`rlctl stop`: state stopped; or its controller killed after the grace, without a summary: `rlctl stop` writes a
`stop_requested` event first) and the launcher's own end (Ctrl-C, SIGTERM) are never resumed; a SIGTERM to the
controller that neither asked for (a SLURM time limit, a pre-emption) is a failure (`failed: controller got
SIGTERM`); a stop while a resume stages or starts the job ends that start (`JobRun.start` raises Stopped, having
stopped what it started).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

from rlctl.config.job import JobFile
from rlctl.errors import LaunchError, RlctlError, UsageError
from rlctl.launch.jobdir import JobDir, event_time, row_count
from rlctl.launch.layout import plan_sites
from rlctl.launch.recordfiles import open_record
from rlctl.ops.detach import this_launcher
from rlctl.ops.jobchanges import edited_fields, launch_changes, refuse_fixed_edits, take_edits
from rlctl.ops.jobdb import LIVE, JobDB
from rlctl.ops.jobprep import StopCheck
from rlctl.ops.preflight.base import Problem
from rlctl.ops.preflight.slurmoptions import ASK_S, launched_option_problems
from rlctl.ops.refusals import controller_elsewhere
from rlctl.ops.resumecheck import edit_problems
from rlctl.ops.resumememory import judge_memory
from rlctl.ops.run import JobRun
from rlctl.ops.runstate import UNSTARTED, WARNING, resumes, stop_requested

RESUME_HINT = "; continue the job with "  # how the controller's reason for a failure ends (`ControllerAgent._lose`)


def newest_checkpoint(jobdir: JobDir, *, since: float) -> int | None:
    """The newest checkpoint the controller completed at or after `since` (time.time()), from the job's events
    (a `checkpoint` event is written once both parts of it are complete); None when it completed none. An event
    without a number for its version (null, text: an edited one) names none (int(None) was a TypeError traceback as
    the launcher resumed the job)."""
    done = [row_count(e.get("version")) for e in jobdir.read_events("checkpoint") if event_time(e) >= since]
    return max((v for v in done if v is not None), default=None)


class Runs:
    """The launcher's current `JobRun` of the job, and what is left of its automatic resumes."""

    def __init__(
        self,
        jobdir: JobDir,
        spec: JobFile,
        plan: dict[str, Any],
        *,
        db: JobDB | None,
        say: Callable[[str], None],
        show: Callable[[str], None] | None = None,
    ) -> None:
        self.jobdir, self.spec, self.plan = jobdir, spec, plan
        self.db, self.say, self.show = db, say, show
        self.left = spec.checkpoint.auto_resume  # resumes after a failure left (a time limit spends none)
        self.resumes = 0  # automatic resumes done, time limits' among them
        self.run: JobRun | None = None
        self.source: str | None = None  # a fresh launch's job file (`preparing`)
        self._preparing = False  # its row entered the index before its first run (`preparing`)
        self._began = time.time() - 0.001  # when this launcher began (events' times are rounded to the millisecond)
        self._t0 = time.monotonic()  # … on this clock: the launch table's `wall`
        self._since = 0.0  # when the current run started (time.time())
        self._from = 0  # the checkpoint it started from (0: the job's start)
        # the warnings of the run it starts next, recorded as `warning` events of it (`rlctl status` shows the latest
        # run's: `runstate.run_warnings`): the first's as `launch --resume` said them (`start`), an automatic resume's
        # judged again before it (`_refusal`: a trainer rank this rlctl prices past its GPU, `judge_memory`)
        self.warnings: list[str] = []

    def _wrong_site_options(self) -> list[Problem]:
        """The constraints and reservations of the run's SLURM sites (as launched) their clusters say are wrong."""
        plan = self.plan
        if not plan:
            return []
        return launched_option_problems(self.jobdir.path, plan_sites(plan), timeout_s=ASK_S)

    def preparing(self, *, source: str) -> StopCheck:
        """A fresh launch's job in the index (`launching`, its launcher and job file `source`) from the moment its
        directory exists, while its launcher prepares it (an SFT warm-up, a dataset's tokenizing: minutes), so that
        `rlctl stop` and `status` find it, named or not; before, it entered the index once prepared and a stop meant
        the job launched before it. Returns the check `prepare` makes between its steps (Stopped once stopped)."""
        name = self.jobdir.id
        if self.db is not None:
            spec = self.spec.model_dump(mode="json", by_alias=True)  # one write, its launcher with it (`_register`)
            self.db.put(
                name, job_dir=str(self.jobdir.path), spec=spec, info={"launcher": this_launcher(), "source": source}
            )
            self._preparing = True
        self.source = source
        return StopCheck(self.jobdir, since=self._stops_since(), db=self.db, source=source)

    def unindex(self) -> None:
        """A fresh launch refused as its launcher prepared the job (its inputs, by `copy_inputs`: a reward file gone
        since the check): its index row (`preparing`'s) out, and `stop` leaves it so; the launch then removes what it
        made in the job dir (`launchdir.unmake`), as a refusal by the check leaves nothing, versus a row `failed` and
        the dir's .launcher.lock, secret, logs/, checkpoints/ and model/init/ left, a job that never was one."""
        if self._preparing and self.db is not None:
            self.db.remove(self.jobdir.id, only_from=("launching",))
        self._preparing = False

    def start(
        self, *, resume: bool = False, checkpoint: int | None = None, warnings: list[str] | None = None
    ) -> JobRun:
        """Start a run (`resume`: from the job's latest complete checkpoint, or `checkpoint`, and say which);
        `warnings`: lines said before it, recorded for it (None: `self.warnings`, an automatic resume's)."""
        self._since = time.time() - 0.001  # events' times are rounded to the millisecond
        if warnings is not None:
            self.warnings = list(warnings)
        run = self.run = JobRun(
            self.jobdir, self.spec, self.plan, db=self.db, say=self.say, show=self.show, stop_since=self._stops_since()
        )
        try:
            run.start(resume=resume, checkpoint=checkpoint)  # Stopped when `rlctl stop` came first
        finally:  # started or not (`JobRun.start` gives the run its id first): a start that failed after its
            # controller started (a trainer that died starting) is the run `rlctl status` shows, with its warnings,
            # versus none recorded for it. Those of a run whose controller never started are recorded too, read by
            # nothing: `rlctl status` shows the warnings of the run the latest controller's `agent_started` names
            if run.run_id is not None:  # (typed optional: an id is given as the start begins)
                for line in self.warnings:
                    self.jobdir.event(WARNING, run=run.run_id, line=line)
        point = run.resumed
        self._from = point.version if point is not None else 0
        if point is not None and point.version == 0:  # started over: the job as job.json has it now is the launch its
            take_edits(self.jobdir)  # checkpoints are of, which the resumes after this one hold edits against
        if point is not None:
            skipped = "".join(f"; v{v} not used: {why}" for v, why in point.skipped)
            start = f"checkpoint v{point.version}" if point.version else "the start (no checkpoint was completed)"
            if checkpoint is not None:  # a roll-back: its agents set the newer ones aside
                start += " (--checkpoint: the newer ones go to checkpoints/abandoned/)"
            self.say(f"job {self.spec.name}: resumed from {start}{skipped}")
        return run

    def attach(self) -> JobRun:
        """Watch the job's current run, started by a launcher that is gone (`JobRun.attach`); its start and the
        checkpoint it started from are read from the job's events. A `rlctl stop` of that run before this attach
        ends it as one after would (the run's wait: Stopped, index state stopped), not as a failure."""
        run = self.run = JobRun(self.jobdir, self.spec, self.plan, db=self.db, say=self.say, show=self.show)
        run.attach()
        # only the lines naming a resume are parsed (`JobDir.read_events`), and the first event's time where none
        resumed = resumes(self.jobdir.read_events("resumed", UNSTARTED))
        self._since = event_time(resumed[-1]) if resumed else first_event_time(self.jobdir)
        self._from = int(resumed[-1]["version"]) if resumed else 0
        run.stop_since = self._stops_since()  # it was this attach: a stop of the run since it started was missed
        return run

    def wait(self, *, on_progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Until the job ends for good: done, stopped, or failed with no resume due; the last run's summary (or
        its LaunchError, when its controller exited without one; Stopped, never resumed, when `rlctl stop` forced
        that end)."""
        while True:
            assert self.run is not None
            try:
                summary, error = self.run.wait(on_progress=on_progress), None
            except LaunchError as e:
                summary, error = None, e
            if summary is not None and not str(summary.get("state", "")).startswith("failed"):
                return self._timed(summary)
            why = str(summary["state"]) if summary is not None else str(error)
            if not self._resume_after(why):
                if error is not None:
                    raise error
                assert summary is not None
                return self._timed(summary)

    def _timed(self, summary: dict[str, Any]) -> dict[str, Any]:
        """The last run's summary with this launcher's times: `wall_s` from its start (staging, every run and each
        automatic resume), `run_wall_s` the last run's (its staging to its end), `auto_resumes` how many it did.
        Before, `wall_s` was the last run's alone: 59.1 s of a job that ran 81 s with one resume."""
        run_wall = summary.get("wall_s")
        return summary | {
            "wall_s": round(time.monotonic() - self._t0, 2),
            "run_wall_s": run_wall,
            "auto_resumes": self.resumes,
        }

    def _resume_after(self, why: str) -> bool:
        """Resume the run that failed (`why`) when that is due (see the module's text); whether it was."""
        if stop_requested(self.jobdir, since=self._stops_since()):
            return False
        assert self.run is not None
        limit = self.run.time_limit()  # a planned end: it spends no resume
        name = self.spec.name
        failure = why.splitlines()[0].partition(RESUME_HINT)[0]  # the controller's hint to resume: done here
        if not failure.startswith("failed"):  # the launcher's error (no summary), not the summary's state
            failure = f"failed: {failure}"
        allowed = self.spec.checkpoint.auto_resume
        if allowed <= 0 or (limit is None and self.left <= 0):
            if limit is not None:
                self.say(
                    f"job {name}: time limit reached on {limit}; not resumed automatically (checkpoint.auto_resume "
                    f"is 0): continue it with `{self.run.resume_command()}`"
                )
            elif allowed > 0:  # said, versus the failure alone, as if the job had no automatic resumes
                self.say(
                    f"job {name} {failure}; not resumed automatically: the {allowed} resume(s) of its "
                    f"checkpoint.auto_resume are spent (why its runs fail: {self.jobdir.path}/logs); "
                    f"`{self.run.resume_command()}` continues it, with {allowed} more"
                )
            return False
        newest = newest_checkpoint(self.jobdir, since=self._since)
        if newest is None or newest <= self._from:
            if limit is not None:
                self.say(
                    f"job {name}: time limit reached on {limit} before the run completed a checkpoint past "
                    f"v{self._from}: not resumed automatically (it would end the same way; checkpoint more often "
                    "than the site's scheduler.time_limit_min, or raise it)"
                )
            else:
                self.say(
                    f"job {name} failed and completed no checkpoint past v{self._from} in this run: "
                    "not resumed automatically (it would most likely fail the same way)"
                )
            return False
        ended = f": time limit reached on {limit}" if limit is not None else f" {failure}"
        if (refused := self._refusal(newest)) is not None:
            said, reason = refused
            self.say(f"job {name}{ended}; not resumed automatically: {said}")
            self.jobdir.event("auto_resume_refused", after=why, reason=reason)
            return False
        # what is left of the failed run, stopped before its resume is said, spent and recorded: one whose agents may
        # still run (a site that does not answer) is not resumed over them, versus "resuming it from checkpoint vN"
        # said and then the stop's error, no resume
        try:
            self.run.stop()
        except LaunchError as e:
            self.say(
                f"job {name}{ended}; not resumed automatically: what is left of its run could not be stopped ({e}); "
                f"once it is, `{self.run.resume_command()}` continues it"
            )
            self.jobdir.event("auto_resume_refused", after=why, reason=str(e))
            return False
        changes = self._changes()
        self.resumes += 1
        if limit is not None:
            self.say(
                f"job {name}: time limit reached on {limit}; resuming it from checkpoint v{newest} "
                f"(a time limit spends no checkpoint.auto_resume: {self.left} left)"
            )
        else:
            self.left -= 1
            self.say(
                f"job {name} {failure}; resuming it from checkpoint v{newest} "
                f"(checkpoint.auto_resume: {self.left} more left)"
            )
        for line in changes + self.warnings:  # as `launch --resume` says them: the edits the resumed run takes up, or
            self.say(f"job {name}: {line}")  # does not, and a rank this rlctl prices past its GPU
        self.jobdir.event("auto_resume", after=why, version=newest, left=self.left, time_limit=limit)
        self.start(resume=True)
        return True

    def _refusal(self, newest: int) -> tuple[str, str] | None:
        """Why the resume from checkpoint `newest` is not made (what is said, the `auto_resume_refused` event's
        reason), or None: what `launch --resume` refuses, and another run of the job live."""
        # as `launch --resume` refuses it: a field the checkpoints depend on, edited in job.json during the run. Here,
        # not in the run's start alone (`JobRun._prepare` checks the checkpoint its sites hold, after staging): before
        # the failed run's remains are stopped, an `auto_resume` event written and a resume spent, and as this path's
        # end, said with an `auto_resume_refused` event and the failure the job's, not an error out of `wait`
        try:
            refuse_fixed_edits(self.jobdir, resumed=newest)
        except UsageError as e:
            return f"{e} ({e.hint})", str(e)
        # as `launch --resume` judges it: a trainer rank at the run's split priced with the job as job.json has it
        # now; edited in a field a rank's memory is priced on and no longer fitting, refused as `launch --resume`
        # refuses it; else the warning it says, if any, this resume's (`self.warnings`). Versus the first run's
        # warning replayed unjudged (a cut lowered since: a stale "need 188 GB") and an edit that no longer fits
        # resumed with no word
        try:
            self.warnings = self._judged()
        except UsageError as e:
            return f"{e} ({e.hint})", str(e)
        # as `launch --resume` refuses it: job.json edited during the run into what `rlctl check` refuses of a job
        # file (`edit_problems`), versus the resumed run taking it up unchecked (read as launched: `RECORDED`)
        if found := self._edit_problems():
            reason = "; ".join(f"{p.field}: {p.message}" for p in found)
            # each problem with its own hint, versus the first's alone after them all (the others' fix unsaid)
            said = "; ".join(f"{p.field}: {p.message}" + (f" (hint: {p.hint})" if p.hint else "") for p in found)
            return f"{self.jobdir.job_json}: {said}", reason
        # as `launch --resume` refuses them: a SLURM site's constraint or reservation its cluster says is wrong (a
        # reservation ended during the run), versus a resume spent on a run whose every sbatch is refused after staging
        if wrong := self._wrong_site_options():
            reason = "; ".join(f"{p.field}: {p.message}" for p in wrong)
            return f"{self.jobdir.path / 'sites.json'}: {reason}", reason
        # another run of the job answering on its sites (a copy of the job dir resumed from another machine, where
        # this run's controller did not answer, stopped this run's agents and started its own over the same site
        # job dirs): not resumed over it, versus stopping that run's agents (the site's agents.jsonl is its now) and
        # starting a second controller in its site job dir, each launcher then resuming over the other
        assert self.run is not None
        if (other := controller_elsewhere(self.jobdir, own=self.run.address)) is not None:
            reason = f"another run of the job is live: its controller answers at {other}, not this run's"
            return (
                f"{reason} (a copy of the job dir resumed elsewhere?); `rlctl status {self.jobdir.path}` shows it",
                reason,
            )
        return None

    def _edit_problems(self) -> list[Problem]:
        """What `rlctl check` refuses of job.json as edited since the launch, in the fields edited (`edit_problems`).
        None for a job.json or sites.json that does not read (the run's start says it)."""
        if not self.plan:
            return []
        try:
            return edit_problems(self.jobdir, self.plan, edited=edited_fields(self.jobdir))
        except (OSError, RlctlError):
            return []

    def _judged(self) -> list[str]:
        """The warning a resume of the job as job.json has it now says (`judge_memory`: a trainer rank at the plan's
        split this rlctl prices past its GPU, no edit since the launch raising its need); UsageError where one did.
        None for a job.json or sites.json that does not read (the run's start says it)."""
        if not self.plan:
            return []
        try:
            unfit = judge_memory(self.jobdir, self.plan, edited=edited_fields(self.jobdir))
        except UsageError:
            raise
        except (OSError, RlctlError):
            return []
        return [unfit] if unfit is not None else []

    def _changes(self) -> list[str]:
        """What `launch --resume` says as it resumes the job (`launch_changes`): job.json edited since the
        launch (a new learning rate: the resumed run takes it up), its job file, inventory or reward changed (it
        does not), a loss an older rlctl computed otherwise (`older_rlctl_changes`). Before, an automatic resume said
        none of them. None for a job.json gone or not JSON (the run's start says it)."""
        try:
            return launch_changes(self.jobdir)
        except (OSError, RlctlError):
            return []

    def _stops_since(self) -> float:
        """From when a `rlctl stop` ends the job for this launcher: its start, or the start of the run it attached
        to (`attach`), whichever came first; a stop of an earlier launcher's run was that run's."""
        return min(self._began, self._since) if self._since else self._began

    def stop(self) -> None:
        """Stop every agent of the current run (the launcher's `finally`). A launch that ended while it prepared
        the job (`preparing`: an error, Ctrl-C, SIGTERM), before any run, leaves its index row failed or stopped,
        versus `launching` with no launcher."""
        if self.run is not None:
            self.run.stop()
        elif self._preparing and self.db is not None:
            ended = sys.exc_info()[0]
            interrupted = ended is not None and issubclass(ended, KeyboardInterrupt | SystemExit)
            self.db.update(self.jobdir.id, state="stopped" if interrupted else "failed", only_from=LIVE)


def first_event_time(jobdir: JobDir) -> float:
    """The time of the job's first event that parses (0.0 with none), read from the file's start only: a job of
    weeks holds hundreds of thousands of events after it."""
    if not jobdir.events.exists():
        return 0.0
    with open_record(jobdir.events) as f:
        for line in f:
            try:
                row = json.loads(line) if line.strip() else None
            except ValueError:
                continue
            if isinstance(row, dict):
                return event_time(row)
    return 0.0
