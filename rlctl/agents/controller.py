"""The controller process: the I/O shell around `ControllerCore` — connections, heartbeats, metrics and
the job directory. Scaling lives in `scaling.py` (`Scaler`, on its layers `healing.py` and `unitstarts.py`; where
units run: `placement.py`), what it shows in `views.py`.

This module holds the loop and its end (the summary); the controller's other parts are mixins by concept, each on
the parts it calls:

    ControllerAgent (the loop, the end)
      └─ Dispatch           controller_dispatch     each inbox event to the part that acts on it
           ├─ Membership    controller_members      hello, heartbeats and silence, a lost agent
           │    └─ WeightBookkeeping  controller_weights  the versions units hold, their transfers
           ├─ StopRequests  controller_stop         `rlctl stop`, every agent told to stop
           │    └─ Checkpoints  controller_checkpoints  resume, the controller's part of a checkpoint
           └─ Rows          controller_rows         an iteration trained → its metrics row
                └─ Checkpoints
      all on ControllerBase   controller_base       the shared state and the links to the peers

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

import logging
import os
import queue
import threading
import time

from rlctl.agents.controller_dispatch import Dispatch
from rlctl.agents.evaluation import EvalSchedule, Evaluator, cut_evaluations
from rlctl.agents.messages import SIGTERM_FAILURE, STOP_GRACE_S, Heartbeat, parse
from rlctl.agents.views import agent_gauges, summary
from rlctl.checkpoint.choose import resume_version
from rlctl.config.job import JobFile
from rlctl.launch.agentenv import ENV_RUN
from rlctl.launch.jobdir import JobDir
from rlctl.tracking import FanOut, make_trackers
from rlctl.transport import Transport

log = logging.getLogger(__name__)

NO_ROLLOUT_TIMEOUT_S = 60.0
START_WAIT_S = 90.0  # how long to wait for every planned rollout unit before starting with fewer
BYE_WAIT_S = 5.0
FINAL_EVALUATION_WAIT_S = 600.0  # how long a job that is done waits for its last held-out evaluation's row
# how often the loop sets the agents' gauges (Prometheus scrapes seconds apart): an update reads every agent and every
# sample in the ledger (0.6-1.5 ms at 64 units and 10,240 samples in flight), once a message was seconds an iteration
GAUGES_EVERY_S = 1.0


class ControllerAgent(Dispatch):
    def __init__(self, jobdir: JobDir, job: JobFile, transport: Transport, *, listen: str) -> None:
        super().__init__(jobdir, job, transport, listen=listen)
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
        # what the resume restored (the checkpoint's version, the job's violations, the kept evaluations' gauges) is
        # set: /metrics answers now, its first scrape the job's figures, versus 0 then N (a counter's reset)
        self.metrics.start()
        jobdir.write_json(
            jobdir.controller_json,
            {"address": self.listener.address, "pid": os.getpid(), "metrics_port": self.metrics_port},
        )
        jobdir.event("controller_listening", address=self.listener.address)
        threading.Thread(target=self._accept, name="accept", daemon=True).start()

    def _evaluator(self, resumed: int) -> Evaluator | None:
        """Held-out evaluation during the run (`evaluation.every_iterations`), from the version the run starts at."""
        e = self.job.evaluation
        if not (e.every_iterations and e.heldout_prompts):
            return None
        schedule = EvalSchedule(
            e.every_iterations,
            self.job.iterations,
            self.task.heldout(e.most_prompts),
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
                self._gauges(now)
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
            self._gauges(time.monotonic(), due=True)  # as the loop left them: what the end's scrapes read
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

    def _gauges(self, now: float, *, due: bool = False) -> None:
        """The agents' gauges (`views.agent_gauges`), at most every GAUGES_EVERY_S unless `due`."""
        if due or now - self._gauged >= GAUGES_EVERY_S:
            self._gauged = now
            agent_gauges(self.metrics, self.core, self.peers, self.sites, now=now)

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
        terminated = False
        try:
            self._await_byes(graceful=graceful)
        except SystemExit:  # a (second) SIGTERM, the agent's handler's, while it waits: the wait is cut short, the end
            # still written (before, it raised out of here: no summary.json, no job_end); a first one's SystemExit
            # still ends the process as it would have
            log.warning("controller: SIGTERM while it waited for the agents' byes: the end is written now")
            terminated = True
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
        linger = self.metrics.linger_s() if on_purpose and not terminated else 0.0  # (told to go: no scrape waited)
        # within the stop's grace (a second to spare): killed while it waits, it would page as a controller gone
        linger = min(linger, self.stop_by - time.monotonic() - 1.0)
        if linger > 0 and not self.metrics.wait_scraped(ending, timeout_s=linger):
            log.warning(
                "controller: /metrics was not scraped in %.0f s after the end; RlctlControllerDown may page", linger
            )

    def _await_byes(self, *, graceful: bool) -> None:
        """Until every agent told to stop said bye (`_waiting`), still answering clients and booking what the end
        still books (a graceful stop's checkpoint)."""
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

    def _waiting(self, *, bye_by: float, checkpoint_by: float) -> bool:
        """Whether `_shutdown` waits on: an agent told to stop has not said bye yet (until `bye_by`), or the trainer
        has a checkpoint to finish (until `checkpoint_by`; its bye comes after it)."""
        running = [p for p in self.peers.values() if p.state == "running" and p.role != "client"]
        now = time.monotonic()
        if not running or now < bye_by:
            return bool(running)
        return self._checkpoint_coming() and now < checkpoint_by and any(p.role == "trainer" for p in running)
