"""The controller's part of checkpoints (`Checkpoints`): a resume from one (the rows, samples and state it
continues from), its state kept when a checkpoint is due and written when the trainer's part is on disk, and
whether the trainer may still complete one (what a stop waits for)."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shlex
import time
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from rlctl.agents.controller_base import ControllerBase
from rlctl.agents.coretypes import Out
from rlctl.agents.ledger import Entry, State
from rlctl.agents.messages import CheckpointWritten
from rlctl.agents.rowbook import RowBook, job_start_offset, timed
from rlctl.checkpoint.choose import checkpoints_at
from rlctl.checkpoint.controller import PART, cut_metrics, load_controller, prune_controller, save_controller
from rlctl.checkpoint.files import newest_complete, set_aside_newer
from rlctl.launch.jobdir import JobDir, abandoned, resume_points

log = logging.getLogger(__name__)


def scale_history(jobdir: JobDir, version: int) -> Iterator[dict[str, Any]]:
    """The scale events of the job's history a run resumed from checkpoint `version` continues (those of a run a
    later resume abandoned left out: `abandoned`), one at a time as events.jsonl is read (twice: its resumes first,
    one a run, then its scales), so that the `ScaleLog` they go to holds its latest only, versus every scale event
    the job ever wrote held in a list first."""
    resumes = [*resume_points(jobdir.read_events("resumed_from")), (math.inf, version)]
    return (
        {k: v for k, v in e.items() if k not in ("t", "event")}
        for e in jobdir.iter_events("scale")
        if not abandoned(e, resumes)
    )


class Checkpoints(ControllerBase):
    """The controller's part of the job's checkpoints, and a resume from one."""

    def _resume(self, version: int) -> None:
        """`launch --resume`: the controller's part of checkpoint `version` (0: none, start over); the metrics
        rows and the sample log's lines the failed run wrote past it move aside, so that the curves and the log
        continue from the checkpoint."""
        # the checkpoints newer than this one belong to a run this one abandons: out of iter-*, so that a resume
        # that finds no latest.json never takes one of them, nor pairs its part with one this run writes
        set_aside = set_aside_newer(self.jobdir.checkpoints, PART, resumed=version, keep=self.job.checkpoint.keep)
        st = load_controller(self.jobdir, version) if version > 0 else None
        requeued = 0
        retired: list[Entry] = []
        if st is not None:
            # the rounds the checkpoint's ledger holds trained, which `restore` retires, follow the log's cut: the
            # log of an earlier resume from this checkpoint holds them there already (not set aside, not written twice)
            self.core.on_retire = retired.extend
            try:
                self.core.restore(version=version, ledger=st.ledger)
            finally:
                self.core.on_retire = self.samples.write
            # (after `restore`: the rounds past a count lowered since are not generated)
            requeued = sum(1 for e in self.core.ledger.entries.values() if e.state is State.QUEUED)
            if st.ranker_tokens:
                self.ranker.fit(st.ranker_tokens, st.ranker_lengths)
            self.scaler.rule.window = list(st.rebalance_window)
            # `status` counts replaced units across resumes; the units `scale` / the rebalance rule added start again
            self.scaler.restore(replaced=st.replaced, units=st.rollout_units)
            self.core.skipped_in_a_row = list(st.skipped_in_a_row)
            self.violations = st.violations
            # the job's, as status's: a resume does not clear it (the counter counts this controller's: from 0)
            self.metrics.job_staleness_violations.set(st.violations)
            self.rewards_before = st.reward_stats
            self.expect_checkpoint = st.trainer_digest
            self.complete.append(version)
            self.checkpointed = (version, None)  # complete before this run: its age is not known here
            self.metrics.checkpoint_version.set(version)
            self.metrics.iteration.set(version)  # the iterations completed, as status's (trainer_version): not 0
        # the scale events of the job's history this run continues (summary, status), as `rlctl report` draws them
        self.scaler.scale_log = scale_history(self.jobdir, version)
        # from no checkpoint, nothing is kept
        discarded = self.samples.cut((st.samples_log_bytes or 0) if st is not None else 0, then=retired)
        # the rows before the checkpoint, each counted as it is read (`RowBook`'s totals), versus every row of the
        # job's iterations held at once; the first that says when the job started is kept
        self.rows = RowBook()
        first: list[dict[str, Any]] = []
        with contextlib.closing(cut_metrics(self.jobdir, version)) as rows:
            for row in rows:
                self.rows.add_kept(row)
                if not first and timed(row):
                    first.append(row)
        kept = self.rows.kept
        self.wall_offset_s = job_start_offset(
            first, self.jobdir.read_events("controller_listening"), now=self.t_start_wall
        )
        self.resumes += 1
        self.jobdir.event(
            "resumed_from",
            version=version,
            regenerate=requeued,
            rows_kept=kept,
            samples_discarded=discarded,
            set_aside=set_aside,
        )
        log.info("controller: resumed from checkpoint v%d; %d samples to generate again", version, requeued)

    def _checkpoint_due(self, version: int) -> None:
        """The trainer is writing its part of checkpoint `version`: keep the controller's state as it is now (the
        state that checkpoint resumes), to write once the trainer's part is on disk."""
        tokens, lengths = self.ranker.history()
        state = {
            "iteration": self.core.trainer_version,
            "ranker": {"tokens": list(tokens), "lengths": list(lengths)},
            "rebalance_window": list(self.scaler.rule.window),
            "samples_log_bytes": self.samples.size(),  # the rounds retired so far: this ledger holds the rest
            "rollout_units": self.scaler.unit_counts(),  # a resume starts again those `scale` added
            # skip_nonfinite bounds the steps skipped in a row across a resume (else each resume took as many more)
            "skipped_in_a_row": list(self.core.skipped_in_a_row),
            "violations": self.violations,  # the job's, across resumes: a stale sample trained is never undone
            "reward_stats": asdict(self.rewards_before.plus(self.task.reward_stats())),  # the job's, as iterations
        }
        self.writing[version] = (state, json.dumps(self.core.ledger.to_json()), self.scaler.replaced)

    def _checkpoint(self, w: CheckpointWritten) -> list[Out]:
        """The trainer wrote its part of checkpoint `w.version`: write ours (as it was at its `trained`), then move
        `latest` to it; remove our part of the checkpoints `checkpoint.keep` lets go. The message that tells the
        trainer to remove its own. A part the trainer could not write ends the job (one line naming why)."""
        state, ledger, replaced = self.writing.pop(w.version)
        if w.error:
            self.core.failed = f"the trainer could not write its part of checkpoint iter-{w.version}: {w.error}"
            if w.full_dir:  # a resume writes its next checkpoint there too
                self.core.failed += (
                    f"; free space in {w.full_dir} first; continue the job with "
                    f"`rlctl launch --resume {shlex.quote(self.jobdir.id)}`"
                )
            return []
        save_controller(
            self.jobdir, w.version, state=state, ledger=ledger, trainer_digest=w.checkpoint, replaced=replaced
        )
        keep = self.job.checkpoint.keep
        self.jobdir.event("checkpoint", version=w.version, keep=keep)  # (keep: this rlctl says what it prunes)
        self.complete.append(w.version)
        self.checkpointed = (w.version, time.monotonic())
        self.metrics.checkpoint_version.set(w.version)
        prune_controller(self.jobdir, complete=self.complete, keep=keep)  # (its event, then the removal)
        self.complete = newest_complete(self.complete, keep=keep)  # what a prune reads, versus one per checkpoint
        return [Out("trainer", "checkpointed", {"version": w.version})]

    def _checkpoint_coming(self) -> bool:
        """Whether the trainer may still complete a checkpoint: its part of one is being written (its `trained`
        came), or it holds every group of the iteration it trains now and that iteration's version checkpoints (it
        may be in that step, which it finishes before it reads the stop; told to stop before, it trains nothing
        more and says bye at once)."""
        version = self.core.trainer_version
        return bool(self.writing) or (self.core.buffers.ready(version) and checkpoints_at(self.job, version + 1))

    def _checkpoint_version(self) -> int:
        """The checkpoint a stop waits for (`_checkpoint_coming`): the one being written, else the one the trainer's
        current step makes."""
        return max(self.writing) if self.writing else self.core.trainer_version + 1

    def _checkpoint_given_up(self) -> None:
        """The stop's deadline passed with a checkpoint still being written (or the trainer gone): said, with the
        checkpoint a resume takes instead."""
        versions = sorted(self.writing)
        latest = self.checkpointed[0] if self.checkpointed is not None else None
        self.jobdir.event("checkpoint_abandoned", versions=versions, latest=latest)
        log.warning(
            "controller: checkpoint iter-%s not complete when the stop ended; a resume takes %s",
            ", iter-".join(map(str, versions)),
            f"iter-{latest}" if latest is not None else "none (the job starts over)",
        )
