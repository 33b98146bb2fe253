"""The controller process: the I/O shell around `ControllerCore` — connections, heartbeats, metrics and
the job directory. Scaling lives in `scaling.py` (`Scaler`), what it shows in `views.py`.

    accept thread ──new connection──▶ reader thread per peer ──(peer, Message)──▶ inbox
    main loop:  event = inbox.get()
                  hello / sample / weights_applied / trained / closed ──▶ core ──▶ send its messages
                  status ──▶ reply with views.status
                  scale ──▶ Scaler: spawn thread starts / core drains units ──▶ "spawned" back into the inbox
                  shutdown ──▶ leave the loop (graceful stop requested by `rlctl stop`); every agent told to stop
                    at once (no new work), and the checkpoint the trainer reached still completed (`_shutdown`,
                    which still answers clients: `status`, and a second stop joins the wait)
                trained ──▶ metrics row ──▶ Scaler.rebalance: δ ≥ δ' and a free slot ──▶ spawn one more unit
                  (a checkpoint due: the controller's state kept) ··· checkpoint_written ──▶ its part, latest
                  heartbeat ──▶ agent figures;  every PING_INTERVAL_S ──▶ ping every agent
                done ──▶ stop everyone, wait for their last figures, write views.summary, exit

An agent that goes silent is not given up at once (its site's link may be down for a while):

    running ──silent HEARTBEAT_TIMEOUT_S──▶ unreachable ──any message / a new hello──▶ running (rejoined)
                                                 │  its samples requeued, out of dispatch and the broadcast;
                                                 │  no rollout unit left (or the trainer cut off) = paused
                                                 └──transport.unreachable_timeout_s──▶ lost (replaced)

Only the main loop sends, so each connection has one sender thread and one receiver thread.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import queue
import shlex
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from typing import Any, cast

import msgspec

from rlctl.agents import common
from rlctl.agents.appliedlog import AppliedLog
from rlctl.agents.core import ControllerCore, CoreConfig, Out, PromptSpec
from rlctl.agents.evaluation import EvalSchedule, Evaluator, cut_evaluations
from rlctl.agents.flight import read_flight
from rlctl.agents.gonebook import GoneAgent, GoneBook
from rlctl.agents.ledger import Entry, State
from rlctl.agents.listen import listen_field
from rlctl.agents.messages import (
    LAUNCHER_STOP,
    SIGTERM_FAILURE,
    STOP_GRACE_S,
    TO_CONTROLLER,
    CheckpointWritten,
    Heartbeat,
    Hello,
    Partial,
    SampleDone,
    Trained,
    make,
    parse,
    recv_checked,
)
from rlctl.agents.rowbook import RowBook, job_start_offset
from rlctl.agents.samplelog import SampleLog
from rlctl.agents.scaling import Placement, Scaler
from rlctl.agents.views import (
    LIVE_STATES,
    Snapshot,
    agent_gauges,
    forget_agent_gauges,
    iteration_gauges,
    metrics_row,
    status,
    summary,
)
from rlctl.agents.watchdog import HUNG
from rlctl.agents.weightbook import WeightBook
from rlctl.checkpoint.choose import checkpoints_at, resume_version
from rlctl.checkpoint.controller import PART, cut_metrics, load_controller, save_controller
from rlctl.checkpoint.files import PRUNED, prune, set_aside_newer
from rlctl.config.job import DatasetTask, JobFile, refills
from rlctl.errors import PeerClosed, RlctlError, TransportError
from rlctl.launch.agentenv import ENV_RUN
from rlctl.launch.jobdir import JobDir, abandoned, event_time, resume_points
from rlctl.metrics import JobMetrics
from rlctl.rl.ranker import LengthRanker, recall_at
from rlctl.rl.reward_pool import RewardStats
from rlctl.rl.source import DatasetSource, DigitsSource, RlPrompt, task_source
from rlctl.tracking import FanOut, make_trackers, row_to_metrics
from rlctl.transport import Connection, Listener, Message, Transport
from rlctl.transport.base import bind_host

log = logging.getLogger(__name__)

HEARTBEAT_TIMEOUT_S = 15.0
PING_INTERVAL_S = common.PING_INTERVAL_S
NO_ROLLOUT_TIMEOUT_S = 60.0
START_WAIT_S = 90.0  # how long to wait for every planned rollout unit before starting with fewer
BYE_WAIT_S = 5.0
FINAL_EVALUATION_WAIT_S = 600.0  # how long a job that is done waits for its last held-out evaluation's row
BROKEN_GRACE_S = 5.0  # a peer a send failed on is lost after this, unless its reader heard the end first
RANKER_BOOTSTRAP = 512


@dataclass
class Peer:
    name: str
    role: str
    conn: Connection
    last_seen: float
    figures: Heartbeat
    state: str = "running"  # running | unreachable | stopped | lost
    unreachable_since: float | None = None  # time.monotonic() when it went silent
    unreachable_wall: float = 0.0  # …and time.time(), for status
    broken: str | None = None  # why a send to it failed (`ControllerAgent._broken`)…
    broken_since: float = 0.0  # …and when (time.monotonic())
    pid: int = 0  # its process (its hello; 0: not said), to know its flight record (agents.flight)


def _parts(msg: Message, report: Partial) -> list[tuple[str, int, list[int], list[float], list[int]]]:
    """The parts of a partial report (`report`, the header of a `partial` or `withdrawn` message `msg`): sample id,
    start, tokens, log-probs, versions."""
    tokens, logprobs, versions = (t.tolist() for t in msg.tensors)
    out, at = [], 0
    for p in report.parts:
        end = at + p.count
        out.append((p.sample_id, p.start, tokens[at:end], logprobs[at:end], versions[at:end]))
        at = end
    return out


def core_config(
    job: JobFile, max_new_tokens: int, *, min_units: int = 1, dc_links: list[list[str]] | None = None
) -> CoreConfig:
    stall = job.task.reward_stall_s if isinstance(job.task, DatasetTask) else "auto"
    return CoreConfig(
        iterations=job.iterations,
        prompts_per_iteration=job.batch.prompts_per_iteration,
        samples_per_prompt=job.batch.samples_per_prompt,
        max_new_tokens=max_new_tokens,
        mode=job.pipeline.mode,
        eta=job.pipeline.eta,
        dispatch=job.rollout.dispatch,
        seed=job.seed,
        min_units=min_units,
        dc_links=dc_links,
        reward_stall_s=stall if isinstance(stall, float) else None,
        abort_stalled=stall != "never",
        partial_store_bytes=job.rollout.partial_store_mb << 20,
        unit_batch=job.rollout.max_batch_size,
        migrate=job.rollout.migrate,
        skip_nonfinite=job.trainer.skip_nonfinite,
        quarantine_after=job.rollout.quarantine_after,
        report_steps=job.rollout.partial_report_steps,
        max_refills=refills(job),
    )


# `rlctl stop` while a checkpoint is being written: the longest the controller waits for it (a model and its
# optimizer state, fsynced to shared storage, can take minutes), within the stop's grace (`_stop_deadline`)
STOP_CHECKPOINT_WAIT_S = 600.0

# who may send what to the controller (a kind not listed here is dropped from anyone)
SENDERS: dict[str, frozenset[str]] = {
    "sample": frozenset({"rollout"}),
    "evaluated": frozenset({"rollout"}),
    "partial": frozenset({"rollout"}),
    "withdrawn": frozenset({"rollout"}),
    "weights_applied": frozenset({"rollout"}),
    "weights_skipped": frozenset({"rollout"}),
    "trained": frozenset({"trainer"}),
    "checkpoint_written": frozenset({"trainer"}),
    "heartbeat": frozenset({"rollout", "trainer"}),
    "bye": frozenset({"rollout", "trainer"}),
    "status": frozenset({"client", "rollout", "trainer"}),
    "scale": frozenset({"client"}),
    "shutdown": frozenset({"client"}),
}


class ControllerAgent:
    def __init__(self, jobdir: JobDir, job: JobFile, transport: Transport, *, listen: str) -> None:
        self.jobdir, self.job = jobdir, job
        # rewards are scored here, as samples arrive, in worker processes beside the controller: a slow or hung
        # reward holds only its own group (which the staleness buffers let later groups overtake)
        self.task = task_source(job, jobdir.path, jobdir.init_model, scoring=True)
        self.ranker = LengthRanker()  # hashed token features: any vocabulary; refit online on real lengths
        if isinstance(self.task, DigitsSource):  # the demo's verifier knows lengths: bootstrap on them
            self.ranker.fit(*self.task.bootstrap(RANKER_BOOTSTRAP))
        self.placement = Placement.read(jobdir)
        self.sites = self.placement.sites  # agent → site; the Scaler adds the units it starts
        self.stop_requested = False
        self.stop_by = math.inf  # when `rlctl stop` kills this process if it has not ended (its grace)
        self.book = WeightBook()
        self.applied = AppliedLog(jobdir.event)  # the units' weight-fetch reports: one event per version
        self.done_at: float | None = None  # when the last iteration was trained (the final weight sync starts)
        self.stop_at: float | None = None  # when a stop was asked for (`_stop_deadline`)
        self.core = ControllerCore(
            core_config(
                job,
                self.task.max_new_tokens,
                min_units=self.placement.planned_units,
                dc_links=self.placement.dc_links,
            ),
            prompts=self._prompts,
            predict=lambda specs: self.ranker.predict([s.tokens for s in specs]).tolist(),
            refill=self._refill,
        )
        cfg = self.core.cfg
        if cfg.rounds_ahead < cfg.eta:  # (the bound holds: fewer rounds ahead only make the samples fresher)
            log.info(
                "controller: rounds are created at most %d ahead of the trainer (pipeline.staleness %d; %d samples a "
                "round, at most %d ahead)",
                cfg.rounds_ahead,
                cfg.eta,
                cfg.prompts_per_iteration * cfg.samples_per_prompt,
                cfg.max_samples_ahead,
            )
        self.samples = SampleLog(jobdir.samples)  # the rounds the ledger retires
        self.core.on_retire = self.samples.write
        self.inbox: queue.Queue[tuple[str, Any, Any]] = queue.Queue()
        self.peers: dict[str, Peer] = {}  # the live agents and clients, and the agents gone since the last row
        self.gone = GoneBook()  # the agents gone before it (`_prune`)
        self.listener: Listener = transport.listen(listen)
        self.t_start, self.t_start_wall = time.monotonic(), time.time()
        self.wall_offset_s = 0.0  # seconds from the job's first controller start to this one's (`job_start_offset`)
        self.start_waited = False  # START_WAIT_S passed without every planned unit (`start_with_fewer_units`)
        self.t_first: float | None = None
        self.violations = 0
        # the reward pool's counts of the runs before this one, up to the checkpoint it resumed (summary `rewards`)
        self.rewards_before = RewardStats()
        self.rows = RowBook()  # what status and the summary read of metrics.jsonl
        self._clients = itertools.count()
        self._closing = False
        self._pinged = 0.0
        self.paused: str | None = None  # why the job waits (status), None when it runs
        self.metrics = JobMetrics()
        self.metrics.last_trained.set(time.time())  # the start counts as progress: a job stuck before its first
        # iteration is a stalled job too (docs/prometheus/rlctl-alerts.yml)
        self.metrics_port = self._serve_metrics(job.metrics.port)
        self.listen_field = listen_field()  # what an operator changes to move the listener (and /metrics)
        self.scaler = Scaler(
            jobdir, job.rebalance, core=self.core, placement=self.placement, metrics=self.metrics, post=self.inbox.put
        )
        self.resumes = len(jobdir.read_events("resumed_from"))
        self.expect_checkpoint: str | None = None  # a resumed job: the trainer part's digest it must restore
        # checkpoints whose trainer part is being written: the controller's state when its `trained` came
        self.writing: dict[int, tuple[dict[str, Any], str, int]] = {}
        self.complete: list[int] = []  # checkpoints `latest` moved to (the one resumed from too): `checkpoint.keep`
        self.checkpointed: tuple[int, float | None] | None = None  # the latest complete: version, when (status)
        version = resume_version()
        if version is not None:
            self._resume(version)
        job_config = job.model_dump(mode="json", by_alias=True)
        trackers = make_trackers(
            job.tracking, jobdir.path, job.name, job_config, start_step=version or 0, run_name=jobdir.id
        )
        self.tracker = FanOut(trackers)
        self.evaluator = self._evaluator(version or 0)
        if self.evaluator is not None:
            self.core.evaluating = self.evaluator.schedule.holds
        jobdir.write_json(
            jobdir.controller_json,
            {"address": self.listener.address, "pid": os.getpid(), "metrics_port": self.metrics_port},
        )
        jobdir.event("controller_listening", address=self.listener.address)
        threading.Thread(target=self._accept, name="accept", daemon=True).start()

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
            self.rewards_before = st.reward_stats
            self.expect_checkpoint = st.trainer_digest
            self.complete.append(version)
            self.checkpointed = (version, None)  # complete before this run: its age is not known here
        # the scale events of the job's history this run continues (summary, status), as `rlctl report` draws them
        before = self.jobdir.read_events("scale", "resumed_from")
        resumes = [*resume_points(before), (math.inf, version)]
        self.scaler.scale_log = [
            {k: v for k, v in e.items() if k not in ("t", "event")}
            for e in before
            if e.get("event") == "scale" and not abandoned(e, resumes)
        ]
        # from no checkpoint, nothing is kept
        discarded = self.samples.cut((st.samples_log_bytes or 0) if st is not None else 0, then=retired)
        kept = cut_metrics(self.jobdir, version)
        self.rows = RowBook(kept, kept=len(kept))
        self.wall_offset_s = job_start_offset(
            kept, self.jobdir.read_events("controller_listening"), now=self.t_start_wall
        )
        self.resumes += 1
        self.jobdir.event(
            "resumed_from",
            version=version,
            regenerate=requeued,
            rows_kept=len(kept),
            samples_discarded=discarded,
            set_aside=set_aside,
        )
        log.info("controller: resumed from checkpoint v%d; %d samples to generate again", version, requeued)

    def _evaluator(self, resumed: int) -> Evaluator | None:
        """Held-out evaluation during the run (`evaluation.every_iterations`), from the version the run starts at."""
        e = self.job.evaluation
        if not (e.every_iterations and e.heldout_prompts):
            return None
        schedule = EvalSchedule(
            e.every_iterations,
            self.job.iterations,
            self.task.heldout(e.heldout_prompts),
            self.task.max_new_tokens,
            floor=resumed,
            max_lost=self.job.rollout.quarantine_after,
        )
        return Evaluator(
            schedule,
            task=self.task,
            jobdir=self.jobdir,
            tracker=self.tracker,
            metrics=self.metrics,
            post=lambda *m: self.inbox.put(m),
            step=lambda: int(self.rows.last["iteration"]) if self.rows.last else 0,
            rows=cut_evaluations(self.jobdir, resumed),
        )

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
        if pruned := prune(self.jobdir.checkpoints, PART, complete=self.complete, keep=keep):
            self.jobdir.event(PRUNED, versions=pruned, keep=keep)  # what a resume may no longer take
        return [Out("trainer", "checkpointed", {"version": w.version})]

    def _prompts(self, iteration: int) -> list[PromptSpec]:
        return [self._spec(p) for p in self.task.rl_prompts(iteration, self.job.batch.prompts_per_iteration)]

    def _refill(self, iteration: int, j: int) -> PromptSpec:
        return self._spec(self.task.refill_prompt(iteration, self.job.batch.prompts_per_iteration, j))

    def _spec(self, p: RlPrompt) -> PromptSpec:
        return PromptSpec(p.prompt_id, p.tokens, p.target_tokens or self.task.max_new_tokens)

    # -- the loop -----------------------------------------------------------------------------------
    def run(self) -> int:
        """Run the job to its end; 0 when every iteration was trained or a stop asked for its end (summary
        `stopped`: the launcher and `checkpoint.auto_resume` read the summary, never this code), 1 when it failed."""
        no_rollout_since: float | None = None
        try:
            while not self.core.failed and not self.stop_requested and not self._finished():
                try:  # while rewards compute, often enough to notice one holding the trainer (core.unstick)
                    what, who, payload = self.inbox.get(timeout=0.05 if self.core.scoring_since else 0.5)
                except queue.Empty:
                    pass
                else:
                    self._handle(what, who, payload)
                self._send(self.core.unstick() + self.core.migrate())
                for a in self.core.aborts:  # a reward held the trainer: filtered out, or the group generated again
                    self.jobdir.event("reward_stall", **a)
                    log.info(
                        "controller: group %s held iteration %d on its reward for %.2f s: %s",
                        a["group"],
                        a["iteration"],
                        a["waited_s"],
                        f"{a['filtered']} sample(s) filtered out" if a["filtered"] else "generated again",
                    )
                self.core.aborts.clear()
                for sample_id in self.core.unwanted:  # its worker is freed now, not at the reward's timeout
                    self.task.cancel_score(sample_id)
                self.core.unwanted.clear()
                now = time.monotonic()
                # a share waits for a unit catching up: hand it on when the wait ends; a unit empties for a suspect
                # prompt: hand it the suspect once it is empty (it may end an evaluation, which pumps nothing)
                if self.core.reserving or self.core.clearing:
                    self._send(self.core.pump())
                self._send(self.scaler.tick(now))
                agent_gauges(self.metrics, self.core, self.peers, self.sites, now=now)
                self._watch(now)
                self._flush_applied(now)
                if not self.core.started and now - self.t_start > START_WAIT_S:
                    if not self.start_waited:  # (the trainer may still be on its way: this is said once)
                        self.start_waited = True
                        self.jobdir.event("start_with_fewer_units", planned=self.core.cfg.min_units)
                    self._send(self.core.start_now())
                alive = any(u.alive for u in self.core.units.values())
                no_rollout_since = None if alive else (no_rollout_since or now)
                if no_rollout_since is not None and now - no_rollout_since > NO_ROLLOUT_TIMEOUT_S:
                    self.core.failed = f"no rollout agent for {NO_ROLLOUT_TIMEOUT_S:.0f} s"
        except Exception as e:  # an error no handler took: the summary names it (the job did not "stop")
            self.core.failed = self.core.failed or f"controller error: {type(e).__name__}: {e}"
            raise
        except SystemExit as e:  # SIGTERM (the agent's handler): stopped only when a stop was asked for
            if e.code == 143 and not self.stop_requested and not self._stop_meant():
                # a scheduler's time limit, a pre-emption: a failure `checkpoint.auto_resume` resumes (was `stopped`)
                self.core.failed = self.core.failed or SIGTERM_FAILURE
                log.warning("controller: SIGTERM with no stop asked for: the run ends failed")
            raise
        finally:
            self._shutdown()
        # a stop is not a failure: every stopped job's `rlctl status` said `controller-0 exited 1`, and a SLURM site
        # recorded its step FAILED
        return 0 if self.core.done or (self.stop_requested and not self.core.failed) else 1

    def _stop_meant(self) -> bool:
        """Whether the job's end was asked for since this controller started, where it can tell: a `rlctl stop`
        whose request it did not answer (its `stop_requested` event, written first), or its launcher's own stop (Ctrl-C,
        a stop while it started the run). A controller whose job dir is on another site sees neither: its launcher
        says `stopped` for it (`rlctl.ops.run.JobRun`). Events it cannot read (a damaged line, a full disk) tell
        nothing: the SIGTERM stays the run's end, as a failure."""
        try:
            events = self.jobdir.read_events(LAUNCHER_STOP, "stop_requested")  # (only these lines are parsed)
        except (RlctlError, OSError) as e:
            log.warning("controller: cannot read the job's events to tell whether a stop was asked for: %s", e)
            return False
        since = self.t_start_wall - 0.001  # events' times are rounded to the millisecond
        return any(
            event_time(e) >= since
            and (e.get("event") == LAUNCHER_STOP or (e.get("event") == "stop_requested" and "by" not in e))
            for e in events
        )

    def _watch(self, now: float) -> None:
        """Ping every agent; mark the silent ones unreachable, and lost once the job's bound has passed."""
        bound = self.job.transport.unreachable_timeout_s
        ping = now - self._pinged >= PING_INTERVAL_S
        for p in list(self.peers.values()):
            if p.role == "client":
                continue
            if p.state == "running" and p.broken is not None:
                if now - p.broken_since > BROKEN_GRACE_S:
                    self._lose(p.name, p.broken)
            elif p.state == "running" and now - p.last_seen > HEARTBEAT_TIMEOUT_S:
                self._unreachable(p, now)
            elif p.state == "unreachable" and p.unreachable_since is not None and now - p.unreachable_since > bound:
                self._lose(
                    p.name,
                    f"unreachable for {now - p.unreachable_since:.0f} s (no message for {now - p.last_seen:.0f} s)",
                )
            elif p.state == "running" and ping:
                try:
                    p.conn.send(make("ping"))
                except TransportError as e:
                    self._broken(p, f"ping failed: {e}", since=now)
        if ping:
            self._pinged = now
        self._pause_state(now)

    def _unreachable(self, p: Peer, now: float) -> None:
        """`p` went silent: its samples go to the others; it may come back until the bound (module docstring)."""
        p.state, p.unreachable_since, p.unreachable_wall = "unreachable", now, time.time()
        before = self.core.ledger.requeued
        if p.role == "rollout":
            self._send(self.core.unreachable(p.name))
        requeued = self.core.ledger.requeued - before
        site = self.sites.get(p.name, "")
        bound = self.job.transport.unreachable_timeout_s
        self.jobdir.event(
            "agent_unreachable", agent=p.name, site=site, silent_s=round(now - p.last_seen, 1), requeued=requeued
        )
        log.warning(
            "controller: %s (site %s) silent for %.0f s: unreachable, %d samples requeued; waiting up to %.0f s for it",
            p.name,
            site,
            now - p.last_seen,
            requeued,
            bound,
        )

    def _rejoin(self, p: Peer, *, version: int, new_connection: bool) -> None:
        """`p` (unreachable, or reconnecting with a new hello) is back."""
        now = time.monotonic()
        away = now - p.unreachable_since if p.unreachable_since is not None else 0.0
        p.state, p.unreachable_since, p.last_seen = "running", None, now
        if p.role == "rollout":
            self._send(self.core.rejoin(p.name, version=version, requeue=new_connection))
            self._holds(p.name, version)
        how = "a new connection" if new_connection else "its connection"
        self.jobdir.event(
            "agent_rejoined", agent=p.name, site=self.sites.get(p.name, ""), away_s=round(away, 1), how=how
        )
        log.info("controller: %s is back after %.0f s (on %s)", p.name, away, how)

    def _pause_state(self, now: float) -> None:
        """Whether the job waits for an unreachable site: no rollout unit left to dispatch to, or the trainer cut
        off. Logged and recorded when it changes (events job_paused / job_resumed); status shows it."""
        away = [p for p in self.peers.values() if p.state == "unreachable"]
        stalled = away and (not self.core.live_units or any(p.role == "trainer" for p in away))
        if not stalled:
            if self.paused is not None:
                self.jobdir.event("job_resumed", after=self.paused)
                log.info("controller: resumed (was %s)", self.paused)
            self.paused = None
            return
        sites = sorted({self.sites.get(p.name, "") or p.name for p in away})
        since = min(p.unreachable_wall for p in away)
        bound = self.job.transport.unreachable_timeout_s
        was = self.paused
        self.paused = (
            f"paused: site {', '.join(sites)} unreachable since {time.strftime('%H:%M:%S', time.localtime(since))} "
            f"({time.time() - since:.0f} s; the job waits up to {bound:.0f} s)"
        )
        if was is None:
            self.jobdir.event("job_paused", sites=sites, agents=sorted(p.name for p in away))
            log.warning("controller: %s", self.paused)

    def _stop_asked(self, by: str, grace_s: float | None) -> dict[str, Any]:
        """`rlctl stop`'s request: the loop ends, and the reply says how long the end may take (`grace_s`: the
        operator's `--grace`, after which it kills this process; none given: STOP_GRACE_S, and STOP_CHECKPOINT_WAIT_S
        more while the trainer may complete a checkpoint, so that a default stop keeps the checkpoint the trainer
        reached) and which checkpoint the stop waits for (`checkpoint`, or None)."""
        now = time.monotonic()
        coming = self._checkpoint_coming()
        if grace_s is None:
            grace_s = STOP_GRACE_S + (STOP_CHECKPOINT_WAIT_S if coming else 0.0)
        self.stop_requested, self.stop_at, self.stop_by = True, now, now + float(grace_s)
        version = self._checkpoint_version() if coming else None
        self.jobdir.event("stop_requested", by=by, grace_s=grace_s, checkpoint=version)
        # told now, before the answer, not once the loop has ended: a trainer holding its next iteration began that
        # step when the stop had not reached it yet (an iteration more, trained for nothing)
        self._tell_stop()
        return {"ok": True, "grace_s": grace_s, "checkpoint": version}

    def _checkpoint_version(self) -> int:
        """The checkpoint a stop waits for (`_checkpoint_coming`): the one being written, else the one the trainer's
        current step makes."""
        return max(self.writing) if self.writing else self.core.trainer_version + 1

    def _stop_again(self, grace_s: float | None, *, waiting: bool) -> dict[str, Any]:
        """A stop request while this controller ends (`_shutdown`: a second `rlctl stop` while the first waits for
        the checkpoint the trainer reached): answered, so the asker joins the wait — the grace left (a shorter
        `grace_s` shortens it), the checkpoint waited for (`waiting`: the end still waits for one), `stopping`.
        Before, the end no longer answered, and a second stop, hearing nothing in 10 s, killed every agent with the
        checkpoint's write."""
        now = time.monotonic()
        if grace_s is not None:
            self.stop_by = min(self.stop_by, now + float(grace_s))
        left = self.stop_by - now if math.isfinite(self.stop_by) else STOP_GRACE_S
        version = self._checkpoint_version() if waiting else None
        self.jobdir.event("stop_requested_again", grace_s=grace_s, checkpoint=version)
        return {"ok": True, "grace_s": round(max(0.0, left), 1), "checkpoint": version, "stopping": True}

    def _stop_deadline(self) -> float:
        """Until when a stop (`rlctl stop`) waits for the checkpoint the trainer reached, so that the job resumes from
        it: STOP_CHECKPOINT_WAIT_S after the request, and a second before the stop's grace ends (then it kills this
        process: the summary is written in that second)."""
        asked = self.stop_at if self.stop_at is not None else time.monotonic()
        return min(asked + STOP_CHECKPOINT_WAIT_S, self.stop_by - 1.0)

    def _finished(self) -> bool:
        """Done once every iteration is trained, every live unit holds the last version (so a job ends with its
        rollout units on the trainer's final weights) and that version's held-out evaluation is in (with
        `evaluation.every_iterations`), or that wait timed out."""
        if not self.core.done or self.writing:  # the last checkpoint's parts are written before the end
            return False
        now = time.monotonic()
        if self.done_at is None:
            self.done_at = now
        behind = [
            u.name
            for u in self.core.units.values()
            if u.alive and u.reachable and u.version < self.core.trainer_version
        ]
        if not behind and self.evaluator is not None:  # the last version's evaluation, if no unit was asked yet
            for u in self.core.live_units:
                self._evaluate(u.name, u.version)
        evaluating = self.evaluator is not None and self.evaluator.pending
        if not behind and not evaluating:
            return True
        # the last evaluation decodes the held-out set and scores it: longer than a weight transfer may take
        wait = self.job.transport.timeout_s if behind else max(self.job.transport.timeout_s, FINAL_EVALUATION_WAIT_S)
        if now - self.done_at > wait:
            if behind:
                log.warning("controller: %s did not get v%d in time", ", ".join(behind), self.core.trainer_version)
                self.jobdir.event("final_weights_timeout", agents=behind, version=self.core.trainer_version)
            if evaluating:
                log.warning("controller: the last held-out evaluation did not end in time")
                self.jobdir.event("evaluation_timeout", version=self.core.trainer_version)
            return True
        return False

    def _handle(self, what: str, who: Any, payload: Any) -> None:
        if what == "hello":
            self._hello(who, payload)
            return
        if what == "spawned":
            self.scaler.spawned(who, payload)
            return
        if what == "not_joining":
            gone, queued = payload
            self.scaler.not_joining(gone, now=time.monotonic(), queued=queued)
            return
        if what == "unjoined_stopped":
            self.scaler.unjoined_stopped(who, payload)
            return
        if what == "scored":
            attempt, reward = payload
            self._send(self.core.scored(who, attempt=attempt, reward=reward))
            return
        if what == "unscored":  # a sample still waiting for this call would wait for ever: the job fails, saying so
            why = self.task.reward_failure()
            self.core.failed = self.core.failed or self.core.reward_lost(who, attempt=payload, why=why)
            return
        if what == "eval_scored" and self.evaluator is not None:
            why = self.task.reward_failure() if payload is None else None
            if why is not None:  # not the job ending: the pool that scores its evaluations stopped for good
                self.core.failed = self.core.failed or f"the held-out evaluation of v{who} cannot be scored ({why})"
            self.evaluator.scored(who, payload)
            return
        peer = self.peers.get(who)
        if peer is None:
            return
        if what == "closed":
            conn, err, heard = payload
            if conn is not peer.conn:  # the end of a connection this agent already replaced
                return
            if peer.state == "running" and peer.role != "client":
                closed = isinstance(err, PeerClosed)  # in order
                # a send that failed before the reader heard the end (and closed the connection, ending the
                # read) says why; a reset or a bad message the reader heard first says it itself
                reason = str(err)
                if not closed and peer.broken is not None and peer.broken_since <= heard:
                    reason = peer.broken
                self._lose(who, reason, at=heard, closed=closed)
            if peer.role == "client":
                del self.peers[who]
            return
        msg, heard = cast("tuple[Message, float]", payload)
        peer.last_seen = time.monotonic()
        if peer.state == "unreachable":
            self._rejoin(peer, version=peer.figures.version, new_connection=False)
        self._message(peer, msg, heard)

    def _message(self, peer: Peer, msg: Message, heard: float) -> None:
        """Act on a message from `peer` (heard at `heard`), or drop it saying why (`_wrong`): in the loop, and for
        the kinds a stopping controller still books (`_shutdown`)."""
        who = peer.name
        if (why := self._wrong(peer, msg)) is not None:
            log.warning("controller: dropped %s from %s: %s", msg.kind, who, why)
            return
        if msg.kind == "sample":
            s = parse(msg, SampleDone)
            self.scaler.sampled(who)
            refused = self.core.ledger.refused
            self._send(
                self.core.sample(
                    who,
                    sample_id=s.sample_id,
                    version=s.version,
                    output_tokens=s.num_output_tokens,
                    payload=msg.tensors,
                    reward=None,
                    attempt=s.attempt or None,
                )
            )
            if self.core.ledger.refused > refused:
                log.warning("controller: dropped sample %r from %s: not dispatched to it", s.sample_id[:80], who)
            else:
                self._score(s.sample_id, msg.tensors)
        elif msg.kind == "partial":
            report = parse(msg, Partial)
            for sample_id, start, tokens, logprobs, versions in _parts(msg, report):
                self.core.partial(
                    who,
                    sample_id=sample_id,
                    start=start,
                    tokens=tokens,
                    logprobs=logprobs,
                    versions=versions,
                    made_s=report.made_s,
                    heard_s=heard,
                )
            self.core.reported(who, free_rows=report.free_rows)
        elif msg.kind == "withdrawn":
            self._send(
                self.core.withdrawn(who, [(sid, t, lp, v) for sid, _, t, lp, v in _parts(msg, parse(msg, Partial))])
            )
            for m in self.core.migrations:
                self.jobdir.event("migrated", **m)
                log.info("controller: %(samples)d samples (%(tokens)d tokens so far) moved from %(from)s to %(to)s", m)
            self.core.migrations.clear()
        elif msg.kind in ("weights_applied", "weights_skipped"):
            version = int(msg.header["version"])
            holder = self.book.nodes.get(str(msg.header.get("holder", "")), ("", ""))[0]
            fields = {
                "source": holder,
                "encoding": msg.header.get("encoding"),
                "base": msg.header.get("base_version"),
                "bytes": msg.header.get("wire_bytes"),
                "fetch_s": msg.header.get("fetch_s"),
                "xxh3": msg.header.get("xxh3"),
            }
            self.applied.add(msg.kind, who, version, fields, now=heard)
            self._flush_applied(heard)  # (the version's row, when this unit was the last live one to report it)
            self._transfer(who, version, msg.header, applied=msg.kind == "weights_applied")
            if msg.kind == "weights_applied":
                self._send(self.core.weights_applied(who, version))
                self._evaluate(who, version)
        elif msg.kind == "evaluated":
            if self.evaluator is not None:
                self.evaluator.answered(who, msg)
        elif msg.kind == "trained":
            self._trained(parse(msg, Trained))
        elif msg.kind == "checkpoint_written":
            self._send(self._checkpoint(parse(msg, CheckpointWritten)))
        elif msg.kind in ("heartbeat", "bye"):
            peer.figures = parse(msg, Heartbeat)
            if msg.kind == "bye":
                peer.state = "stopped"
                if self.evaluator is not None:  # a unit retired after a drain: what it was evaluating is lost
                    self.evaluator.lost(who)
        elif msg.kind == "status":
            self._reply_status(peer, msg)
        elif msg.kind == "scale":
            reply, outs = self.scaler.scale(int(msg.header["delta"]), msg.header.get("site"), reason="manual")
            self._send(outs)
            self._reply(peer, msg, reply)
        elif msg.kind == "shutdown" and msg.header.get("failed"):  # the launcher's: the loop ends, failed
            self.core.failed = self.core.failed or str(msg.header["failed"])
            self._reply(peer, msg, {"ok": True, "grace_s": STOP_GRACE_S, "checkpoint": None})
        elif msg.kind == "shutdown":
            self._reply(peer, msg, self._stop_asked(peer.name, msg.header.get("grace_s")))
        else:
            log.warning("controller: unexpected %r from %s", msg.kind, who)

    def _score(self, sample_id: str, tensors: list[Any]) -> None:
        """Score a finished sample (its output tokens are its payload's first tensor): at once when the task's
        verifier is in-line, else when the reward pool answers (an event on the inbox, for this attempt only)."""
        attempt = self.core.awaiting_reward(sample_id)
        if attempt is None:
            return
        entry = self.core.ledger.entries[sample_id]
        future = self.task.score(sample_id, entry.prompt_id, tensors[0].tolist())
        if future.done() and not future.cancelled():  # (one cancelled at once: the reward pool had failed)
            self._send(self.core.scored(sample_id, attempt=attempt, reward=future.result()))
        else:  # a call cancelled: given up on (`unwanted`), or the pool closed (at the job's end, or it failed)

            def post(f: Future[float]) -> None:
                if f.cancelled():
                    self.inbox.put(("unscored", sample_id, attempt))
                else:
                    self.inbox.put(("scored", sample_id, (attempt, f.result())))

            future.add_done_callback(post)

    def _wrong(self, peer: Peer, msg: Message) -> str | None:
        """Why a well-formed message (its header passed `messages.check`) is not for the controller to act on:
        not its sender's to send, or naming a version or iteration the job is not at. None when it is."""
        if peer.role not in SENDERS.get(msg.kind, ()):
            return f"a {peer.role} does not send it (only: {', '.join(sorted(SENDERS.get(msg.kind, ())))})"
        if msg.kind in ("weights_applied", "weights_skipped"):
            version = int(msg.header["version"])
            if not self.core.known(peer.name):
                return "not a rollout unit of this job"
            # a unit may apply the version the trainer just published before the trainer's `trained` is here
            if version > self.core.trainer_version + 1:
                return f"version {version}: the trainer has published up to {self.core.trainer_version + 1}"
        if msg.kind == "trained":
            iteration, version = int(msg.header["iteration"]), int(msg.header["version"])
            if iteration != self.core.trainer_version or version != iteration + 1:
                return (
                    f"iteration {iteration} → version {version}, and the trainer is at version "
                    f"{self.core.trainer_version} (expected iteration {self.core.trainer_version} → "
                    f"{self.core.trainer_version + 1})"
                )
            buffers = self.core.buffers
            if not buffers.ready(iteration):
                return (
                    f"iteration {iteration} is not complete: {buffers.capacity - buffers.free(iteration)} of its "
                    f"{buffers.capacity} groups were delivered"
                )
        if msg.kind == "bye" and not self._told_to_stop(peer.name):
            # a stopped agent is never watched again: what it held would wait for ever. Still running, it is
            # counted lost as any other when its connection ends or it falls silent
            return "it was not told to stop"
        if msg.kind == "checkpoint_written" and int(msg.header["version"]) not in self.writing:
            return f"no checkpoint of version {msg.header['version']} is being written"
        return None

    def _reply_status(self, peer: Peer, request: Message) -> None:
        self._reply(peer, request, status(self.snapshot(), now=time.monotonic()))

    def _reply(self, peer: Peer, request: Message, body: dict[str, Any]) -> None:
        try:
            peer.conn.reply(request, make(request.kind, body))
        except TransportError as e:  # the asker left; its reader thread reports the close
            log.info("controller: %s reply to %s failed: %s", request.kind, peer.name, e)

    # -- events -------------------------------------------------------------------------------------
    def _hello(self, conn: Connection, h: Hello) -> None:
        name = h.name if h.role != "client" else f"client-{next(self._clients)}"
        old = self.peers.get(name)
        if old is not None and h.role == "rollout" and old.role == "rollout" and old.state != "stopped":
            self._hello_again(old, conn, h)
            return
        gone = self.gone.get(name)
        if gone is not None and h.role == "rollout" and gone.role == "rollout" and gone.state == "lost":
            self._refuse(name, conn)  # as `_hello_again` when its record was still in `peers`
            return
        if old is not None and old.state in ("running", "unreachable"):
            log.warning("controller: %s joined twice; dropping the old connection", name)
            self._lose(name, "replaced")
        self.gone.pop(name)  # its name is a new agent's (a stopped unit's, a trainer's): listed as that
        self.peers[name] = Peer(
            name, h.role, conn, time.monotonic(), Heartbeat(name=name, state="running", version=h.version), pid=h.pid
        )
        threading.Thread(target=self._read, args=(name, conn), name=f"read-{name}", daemon=True).start()
        if h.role == "client":
            return
        if h.role == "trainer" and (
            h.version != self.core.trainer_version
            or (self.expect_checkpoint is not None and h.checkpoint != self.expect_checkpoint)
        ):
            self.core.failed = (
                f"the trainer restored v{h.version} (manifest {h.checkpoint[:12] or '-'}) but the controller's "
                f"checkpoint is v{self.core.trainer_version} "
                f"(trainer manifest {(self.expect_checkpoint or '-')[:12]}): "
                "the two parts of the checkpoint do not belong together"
            )
            return
        dc = self.placement.datacenter(name)
        if h.role != "trainer" and (cost := self.placement.decode_cost(name)) is not None:
            self.core.unit_costs[name] = cost  # migration splits a unit's running work only where it pays
        for i, address in enumerate(h.weight_roots or [h.weights]):  # a trainer's ranks, or the unit itself
            self.book.node(address, agent=name if h.role != "trainer" else f"trainer-{i}", datacenter=dc)
        self.jobdir.event(
            "agent_joined", agent=name, role=h.role, version=h.version, pid=h.pid, datacenter=dc, weights=h.weights
        )
        self._send(
            self.core.join(name, role=h.role, version=h.version, address=h.address, weights=h.weights, datacenter=dc)
        )
        if h.role == "rollout":
            self._holds(name, h.version)
            self._evaluate(name, h.version)

    def _evaluate(self, unit: str, version: int) -> None:
        """`unit` holds `version`: it evaluates it when a version is due (and it takes work)."""
        u = self.core.units.get(unit)
        if self.evaluator is None or u is None or not u.alive or not u.reachable or u.draining:
            return
        if unit in self.core.isolating():
            return  # it runs a suspect prompt alone (or empties for one): the next unit to hold a version is asked
        self._send(self.evaluator.unit_at(unit, version))

    def _hello_again(self, p: Peer, conn: Connection, h: Hello) -> None:
        """A rollout unit that reconnected: back on its new connection, unless it was counted lost meanwhile
        (then it is told to stop: its work went to the others and a replacement may be running)."""
        if p.state == "lost":
            self._refuse(p.name, conn)
            return
        p.conn.close()  # its reader reports the close of a connection that is no longer the peer's: ignored
        p.conn, p.broken = conn, None
        if self.evaluator is not None:  # an `evaluate` or its answer may have been lost with the old connection
            self.evaluator.lost(p.name)
        p.figures = Heartbeat(name=p.name, state="running", version=h.version)
        threading.Thread(target=self._read, args=(p.name, conn), name=f"read-{p.name}", daemon=True).start()
        if p.state != "unreachable":
            p.unreachable_since = time.monotonic()  # it never went silent for long: away since now
        self._rejoin(p, version=h.version, new_connection=True)
        self._evaluate(p.name, h.version)  # asked again (it ignores an evaluation it decodes already, and answers it)

    def _refuse(self, name: str, conn: Connection) -> None:
        """Rollout unit `name` said hello again after it was counted lost: told to stop (its work went to the others
        and a replacement may be running)."""
        log.warning("controller: %s came back after it was counted lost; telling it to stop", name)
        self.jobdir.event("rejoin_refused", agent=name, reason="counted lost")
        with contextlib.suppress(TransportError):  # it left already
            conn.send(make("stop"))
        conn.close()

    def _transfer(self, who: str, version: int, header: dict[str, Any], *, applied: bool) -> None:
        """One unit fetched `version`: book its transfer (bytes, the link it crossed) and, when its engine applied
        it, whether every live unit now has that version (and the ones it skipped)."""
        wire = header.get("wire_bytes")
        wire_bytes = wire if isinstance(wire, int) else 0
        fetch = header.get("fetch_s")
        link = self.book.applied(
            who,
            datacenter=self.placement.datacenter(who),
            version=version,
            holder=str(header.get("holder", "")),
            encoding=str(header.get("encoding", "")),
            wire_bytes=wire_bytes,
            fetch_s=float(fetch) if isinstance(fetch, int | float) else 0.0,
        )
        self.metrics.weight_transfer_bytes.inc(wire_bytes)
        if link is not None:
            self.metrics.weight_inter_dc_bytes.labels(link).inc(wire_bytes)
            self.metrics.weight_inter_dc_copies.labels(link).inc()
        if applied:
            self._holds(who, version)

    def _flush_applied(self, now: float) -> None:
        """Write the units' weight-fetch reports of each version every live unit has reported (or waited long)."""
        self.applied.flush([u.name for u in self.core.units.values() if u.alive], now=now)

    def _holds(self, unit: str | None, version: int = -1) -> None:
        """`unit` holds `version` (applied, or (re)joined with it), or a unit was lost (None): the versions every
        live unit now has are delivered (the book times them)."""
        live = {u.name for u in self.core.units.values() if u.alive}
        now = time.monotonic()
        for seconds in self.book.settle(live, now) if unit is None else self.book.reached(unit, version, live, now):
            self.metrics.weight_transfer_seconds.observe(seconds)
            self.metrics.weight_last_unit_seconds.set(seconds)

    def _broken(self, peer: Peer, why: str, *, since: float) -> None:
        """A send to `peer` failed. Its loss is left to its reader, which hears the connection's end too and says
        how the stream ended (`closed`: in order, `core.lost`): the reader may have closed the connection on the
        peer's in-order end just before this send; a failed TCP send closes the connection, which ends the read
        as closed on this side (not in order, and the loss gives this send's reason). A peer whose reader says
        nothing within BROKEN_GRACE_S is lost for the send (`_watch`)."""
        if peer.broken is None:  # `since`: when the send began (before its failure could end the read)
            peer.broken, peer.broken_since = why, since

    def _told_to_stop(self, name: str) -> bool:
        """Whether agent `name` was sent `stop`: every agent once the job ends, a unit once its drain retired it
        (or it came back after it was counted lost)."""
        return self._closing or name in self.core.left

    def _lose(self, name: str, why: str, *, at: float | None = None, closed: bool = False) -> None:
        """An agent stopped heartbeating or its connection broke (`at`: when its reader heard the end; `closed`:
        the stream ended in order, `core.lost`). A rollout unit's in-flight samples are requeued at once and a
        replacement is started on its site; a lost trainer ends the job (a clean stop whose message names the
        resume command)."""
        peer = self.peers[name]
        if peer.figures.state.startswith(HUNG):  # its watchdog's last word (rlctl.agents.watchdog)
            why = f"{why}; it ended itself, {peer.figures.state} (its log has every thread's stack)"
        peer.state = "lost"
        peer.conn.close()
        before = self.core.ledger.requeued
        unsent = self._unsent(peer) if closed else None
        evaluating = self.evaluator is not None and self.evaluator.schedule.holds(name)
        unit = self.core.units.get(name)  # (before `lost`: a unit lost leaves `core.units`)
        self._send(self.core.lost(name, at=at, closed=closed, unsent=unsent, evaluating=evaluating))
        self._quarantines()
        self.jobdir.event(
            "agent_lost",
            agent=name,
            reason=why,
            in_order=closed,
            requeued=self.core.ledger.requeued - before,
            unsent_tokens=unsent,
        )
        log.warning("controller: %s lost (%s); %d samples re-queued", name, why, self.core.ledger.requeued - before)
        if self.evaluator is not None:
            self.evaluator.lost(name)
        if peer.role == "rollout":
            self._holds(None)
        if peer.role == "rollout" and unit is not None and not unit.draining and not self.stop_requested:
            self.scaler.replace(name, now=time.monotonic())
        if peer.role == "trainer" and self.core.failed:
            self.core.failed += f" ({why}); continue the job with `rlctl launch --resume {shlex.quote(self.jobdir.id)}`"

    def _quarantines(self) -> None:
        """What the loss of a unit made of the prompts it held (`ControllerCore._blame`): an event, a log line and
        the counter of each suspect (it now runs alone on a unit) and each quarantined prompt."""
        for q in self.core.quarantines:
            source = self.task.origin(q["prompt"])
            fields = {k: v for k, v in q.items() if k != "action"} | ({"source": source} if source else {})
            self.jobdir.event(f"prompt_{q['action']}", **fields)
            if q["action"] == "quarantined":
                self.metrics.quarantined_prompts.inc()
                log.error(
                    "controller: prompt %s%s quarantined: it was in flight at %d rollout-unit losses, the last (%s) "
                    "running it alone; a new prompt takes its place",
                    q["prompt"],
                    f" ({source})" if source else "",
                    q["losses"],
                    q["unit"],
                )
            else:
                log.warning(
                    "controller: prompt %s was in flight at %d rollout-unit losses (the last: %s): it runs alone on a "
                    "unit from now on, and is quarantined if that unit is lost too",
                    q["prompt"],
                    q["losses"],
                    q["unit"],
                )
        self.core.quarantines.clear()

    def _unsent(self, peer: Peer) -> int | None:
        """A rollout unit whose stream ended in order (every report it wrote arrived; its process ended, or it
        closed its link): its tokens generated and not sent, from its flight record when it ran on this host (the
        record's pid and host are its) — what its loss cost its generations. None otherwise: a record on another
        host (a shared job dir's copy may be stale)."""
        if peer.role != "rollout" or not peer.pid:
            return None
        flight = read_flight(self.jobdir.flight(peer.name))
        if flight is None or flight.pid != peer.pid or flight.host != socket.gethostname()[:64]:
            return None
        return flight.unsent_tokens

    def _send(self, outs: list[Out]) -> None:
        if self._closing:  # every agent was told to stop: no new work (a late `trained` is still booked)
            return
        if self.t_first is None and any(o.kind == "generate" for o in outs):
            self.t_first = time.monotonic()
        for o in outs:
            name = self.core.trainer.name if o.to == "trainer" and self.core.trainer else o.to
            peer = self.peers.get(name)
            if peer is None or peer.state != "running" or peer.broken is not None:  # (a broken one: `_broken`)
                continue
            tensors = [t for pair in o.payload for t in pair] if o.kind == "samples" else []
            began = time.monotonic()
            try:
                peer.conn.send(make(o.kind, o.header, tensors))
            except TransportError as e:
                self._broken(peer, f"send failed: {e}", since=began)

    def _serve_metrics(self, port: int) -> int:
        """/metrics where the controller listens, on `metrics.port` (0: a free one); its port. A port that cannot be
        bound (another server holds it) is one line naming metrics.port and the address, which launch quotes."""
        host = bind_host(self.listener.address)
        try:
            return self.metrics.serve(port, addr=host)
        except OSError as e:
            self.listener.close()
            raise RlctlError(
                f"metrics.port {port}: cannot serve /metrics on {host}:{port} ({e.strerror or e})",
                hint="set metrics.port to a port free on the controller's host, or 0 for one picked at each start",
            ) from e

    def _trained(self, t: Trained) -> None:
        generated = self._generated(t)  # before the core retires the round it completes
        outs = self.core.trained(
            iteration=t.iteration,
            version=t.version,
            sample_ids=t.sample_ids,
            stats={"reward_mean": t.reward_mean, "train_s": t.train_s, "loss": t.loss, "busy_s": t.busy_s},
            skipped=t.skipped,
        )
        if t.skipped:
            self.jobdir.event(
                "step_skipped",
                iteration=t.iteration,
                grad_norm=repr(t.grad_norm),
                in_a_row=len(self.core.skipped_in_a_row),
            )
        self.violations += t.staleness_violations
        trainer = self.peers.get(self.core.trainer.name if self.core.trainer else "")
        if trainer is not None:
            trainer.figures.busy_s, trainer.figures.version = t.busy_s, t.version
        row = metrics_row(self.snapshot(), t, wall_time=time.time())
        if extras := self.task.reward_extras(t.sample_ids):  # a dict reward's other figures, over what it trained
            row["reward_extra"] = {k: round(v, 6) for k, v in extras.items()}
        if self.evaluator is not None and self.evaluator.overlapped():
            row["evaluating"] = True  # a held-out evaluation decoded beside this iteration's generation
        self.scaler.rebalance(row, stopping=self._closing)
        self._refit_ranker(row, *generated)
        self.rows.add(row)
        self.jobdir.append(self.jobdir.metrics, row)
        self._prune()
        self.tracker.log(t.iteration, row_to_metrics(row))
        if t.checkpointing:
            self._checkpoint_due(t.version)
        self._send(outs)
        iteration_gauges(self.metrics, row, t, self.core.stats[t.iteration], self.rows)
        self.book.published(t.version, time.monotonic())
        self.jobdir.event("trained", iteration=t.iteration, version=t.version)

    def _prune(self) -> None:
        """A metrics row was written: the agents gone (lost or stopped) leave `peers`, which holds the live ones and
        those gone since the last row (that row lists them once: `views.metrics_row`), and /metrics, so that a run
        whose units are replaced for weeks holds, shows, watches and exports the agents it has. What summary.json and
        the status reply's counts say of each is kept (`gone`: every one counted, the latest GONE_KEPT by name), and
        a lost unit that says hello again is still told to stop (`_hello`); its weight node's address leaves the
        weight book (a transfer from it was reported by now)."""
        for p in [p for p in self.peers.values() if p.role != "client" and p.state not in LIVE_STATES]:
            del self.peers[p.name]
            self.gone.add(p.name, GoneAgent(p.role, p.state, p.figures.busy_s))
            self.book.forget(p.name)  # its weight node's address (one a unit, for weeks of units)
            forget_agent_gauges(self.metrics, p, self.sites)
            p.conn.close()  # a lost one's is closed; a stopped one said bye (its reader's end is ignored: `_handle`)

    def _generated(self, t: Trained) -> tuple[list[list[int]], list[float], list[float]]:
        """What the groups iteration `t` trained generated (a slow one of its round moved on): each prompt's tokens,
        mean output length and predicted length, read before `core.trained` retires them."""
        by_prompt: dict[str, list[int]] = {}
        for sid in t.sample_ids:
            e = self.core.ledger.entries.get(sid)
            if e is not None and e.state is State.DELIVERED and e.iteration == t.iteration:
                by_prompt.setdefault(e.prompt_id, []).append(e.output_tokens)
        tokens = [self.core.prompts[p].tokens for p in by_prompt]
        lengths = [sum(v) / len(v) for v in by_prompt.values()]
        return tokens, lengths, [self.core.pred_len[p] for p in by_prompt]

    def _refit_ranker(
        self, row: dict[str, Any], tokens: list[list[int]], lengths: list[float], preds: list[float]
    ) -> None:
        """Online refit on what the policy actually generated; records the ranker's recall on it in `row`."""
        if len(tokens) >= 5:
            row["ranker_recall_20"] = round(recall_at(preds, lengths, 0.2), 3)
        self.ranker.update(tokens, lengths)

    # -- views and the end ----------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The books the views read (see views.py)."""
        return Snapshot(
            job=self.job,
            core=self.core,
            book=self.book,
            peers=self.peers,
            sites=self.sites,
            rows=self.rows,
            t_start=self.t_start,
            t_first=self.t_first,
            violations=self.violations,
            reading=self.scaler.reading,
            scale_log=self.scaler.scale_log,
            free_slots=self.scaler.free_slots(),
            stop_requested=self.stop_requested,
            metrics_port=self.metrics_port,
            metrics_host=bind_host(self.listener.address),
            listen_field=self.listen_field,
            job_dir=str(self.jobdir.path),
            resilience={"resumes": self.resumes, **self.scaler.resilience(), "paused": self.paused},
            data=self._data_view(),
            reward_stats=self.rewards_before.plus(self.task.reward_stats()),
            evaluations=self.evaluator.rows if self.evaluator is not None else [],
            checkpoint=self.checkpointed,
            gone=self.gone,
            wall_offset_s=self.wall_offset_s,
            first_samples=self.scaler.first_sample_s,
            failed_starts=self.scaler.failed_starts,
        )

    def _data_view(self) -> dict[str, Any]:
        """A dataset task's prompts and the bad rows skipped when it was prepared (never silent)."""
        if not isinstance(self.task, DatasetSource):
            return {}
        d = self.task.data
        return {"prompts": len(d), "bad_rows_skipped": d.num_bad_rows, "checksum": d.checksum}

    def _tell_stop(self) -> None:
        """Every running agent is told to stop (once), and nothing new is sent from then on (`_send`)."""
        if self._closing:
            return
        self._closing = True
        for p in self.peers.values():
            if p.state == "running" and p.role != "client":
                if p.broken is not None:
                    p.state = "lost"
                    continue
                try:
                    p.conn.send(make("stop"))
                except TransportError:
                    p.state = "lost"

    def _shutdown(self) -> None:
        # the units' weight-fetch reports still held, first: none comes in from here on (the wait below books no
        # `weights_applied`), and a controller killed while it waits (a stop's grace, a time limit's SIGKILL) or an
        # error before the summary lost them (its events are the rows per unit readers take, `appliedlog`)
        self.applied.flush_all()
        # an end on purpose is said on /metrics and waited for one scrape below: a /metrics that vanishes without it
        # is a controller that is gone (docs/prometheus/rlctl-alerts.yml, RlctlControllerDown)
        on_purpose = not self.core.failed and (self.core.done or self.stop_requested)
        ending = time.monotonic()
        if on_purpose:
            self.metrics.ended.set(1)
        self._tell_stop()
        graceful = self.stop_requested and not self.core.failed
        bye_by, checkpoint_by = time.monotonic() + BYE_WAIT_S, self._stop_deadline() if graceful else 0.0
        while self._waiting(bye_by=bye_by, checkpoint_by=checkpoint_by):
            try:
                what, who, payload = self.inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            if what == "hello" and payload.role == "client":  # `rlctl status`, a second `rlctl stop`: answered
                self._hello(who, payload)
                continue
            peer = self.peers.get(who) if isinstance(who, str) else None
            if peer is None:
                continue
            if what == "closed":
                peer.state = "stopped" if peer.state == "running" else peer.state
                continue
            msg, heard = payload
            if msg.kind == "shutdown" and peer.role == "client" and msg.header.get("failed"):
                # the launcher's (a trainer rank gone before it joined): the summary says it, as `_message` does
                self.core.failed = self.core.failed or str(msg.header["failed"])
                self._reply(peer, msg, {"ok": True, "grace_s": STOP_GRACE_S, "checkpoint": None})
            elif msg.kind == "shutdown" and peer.role == "client":
                waiting = graceful and self._checkpoint_coming() and time.monotonic() < checkpoint_by
                self._reply(peer, msg, self._stop_again(msg.header.get("grace_s"), waiting=waiting))
                checkpoint_by = min(checkpoint_by, self.stop_by - 1.0)  # a shorter grace: the summary still written
            elif msg.kind == "bye":  # not the loop's: what a unit was evaluating is not asked again now
                peer.figures, peer.state = parse(msg, Heartbeat), "stopped"
            elif msg.kind == "scale" and peer.role == "client":  # answered at once, not at the client's timeout
                self._reply(peer, msg, {"error": "the job is stopping: no rollout units are added or removed"})
            elif msg.kind in ("heartbeat", "status") or (graceful and msg.kind in ("trained", "checkpoint_written")):
                # a graceful stop books the trainer's late `trained` and `checkpoint_written` (a stop during the
                # step of an iteration that checkpoints, or while its `trained` was on its way: the trainer
                # finishes both before its bye, `_checkpoint_coming`), so that the checkpoint it reached is
                # completed and `latest` names it; nothing new is sent (`_send`)
                self._message(peer, msg, heard)
        if graceful and self.writing:
            self._checkpoint_given_up()
        # the run it ends: a launcher takes only its own run's summary (`rlctl.ops.runstate.run_summary`)
        end = {**summary(self.snapshot()), "run": os.environ.get(ENV_RUN)}
        self.jobdir.write_json(self.jobdir.summary_json, end)
        self.jobdir.event("job_end", state=end["state"], iterations=end["iterations"])
        self.tracker.close()
        self.samples.close()
        for p in self.peers.values():
            p.conn.close()
        self.listener.close()
        self.scaler.close()
        self.task.close()
        linger = self.metrics.linger_s() if on_purpose else 0.0
        # within the stop's grace (a second to spare): killed while it waits, it would page as a controller gone
        linger = min(linger, self.stop_by - time.monotonic() - 1.0)
        if linger > 0 and not self.metrics.wait_scraped(ending, timeout_s=linger):
            log.warning(
                "controller: /metrics was not scraped in %.0f s after the end; RlctlControllerDown may page", linger
            )

    def _waiting(self, *, bye_by: float, checkpoint_by: float) -> bool:
        """Whether `_shutdown` waits on: an agent told to stop has not said bye yet (until `bye_by`), or the trainer
        has a checkpoint to finish (until `checkpoint_by`; its bye comes after it)."""
        running = [p for p in self.peers.values() if p.state == "running" and p.role != "client"]
        now = time.monotonic()
        if not running or now < bye_by:
            return bool(running)
        return self._checkpoint_coming() and now < checkpoint_by and any(p.role == "trainer" for p in running)

    def _checkpoint_coming(self) -> bool:
        """Whether the trainer may still complete a checkpoint: its part of one is being written (its `trained`
        came), or it holds every group of the iteration it trains now and that iteration's version checkpoints (it
        may be in that step, which it finishes before it reads the stop; told to stop before, it trains nothing
        more and says bye at once)."""
        version = self.core.trainer_version
        return bool(self.writing) or (self.core.buffers.ready(version) and checkpoints_at(self.job, version + 1))

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

    # -- threads ------------------------------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                conn = self.listener.accept()
            except TransportError as e:
                if self._closing:
                    return
                log.warning("controller: a connection failed the handshake: %s", e)
                continue
            threading.Thread(target=self._greet, args=(conn,), daemon=True).start()

    def _greet(self, conn: Connection) -> None:
        try:
            msg = conn.recv(timeout_s=self.job.transport.timeout_s)
            hello = parse(msg, Hello)
        except (TransportError, msgspec.ValidationError) as e:
            log.warning("controller: no valid hello from %s: %s", conn.peer, e)
            conn.close()
            return
        self.inbox.put(("hello", conn, hello))

    def _read(self, name: str, conn: Connection) -> None:
        """Each message, and the connection's end, with when it was heard (`core.partial`, `core.lost`)."""
        while True:
            try:
                msg = recv_checked(conn, peer=name, kinds=TO_CONTROLLER)
            except TransportError as e:
                self.inbox.put(("closed", name, (conn, e, time.monotonic())))
                return
            self.inbox.put(("msg", name, (msg, time.monotonic())))
