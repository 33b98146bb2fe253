"""The controller's state and its links to its peers: `ControllerBase` sets up what the controller's parts share
(the core, the books, the listener, /metrics, the scaler) and sends to, replies to and reads from each peer; the
parts are mixins on it (`controller.py` draws them). Also `Peer` (the record of one connection) and `core_config`."""

from __future__ import annotations

import itertools
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from rlctl.agents.appliedlog import AppliedLog
from rlctl.agents.books import GoneBook
from rlctl.agents.core import ControllerCore
from rlctl.agents.coretypes import CoreConfig, Out, PromptSpec
from rlctl.agents.evaluation import Evaluator
from rlctl.agents.listen import listen_field
from rlctl.agents.messages import TO_CONTROLLER, Heartbeat, Hello, make, parse, recv_checked
from rlctl.agents.placement import Placement
from rlctl.agents.rowbook import RowBook
from rlctl.agents.samplelog import SampleLog
from rlctl.agents.scaling import Scaler
from rlctl.agents.views import Snapshot
from rlctl.agents.weightbook import WeightBook
from rlctl.config.job import JobFile, refills
from rlctl.config.task import DatasetTask
from rlctl.errors import RlctlError, TransportError
from rlctl.launch.jobdir import JobDir
from rlctl.metrics import JobMetrics
from rlctl.rl.ranker import LengthRanker
from rlctl.rl.reward_pool import RewardStats
from rlctl.rl.source import DatasetSource, DigitsSource, RlPrompt, task_source
from rlctl.tracking import FanOut
from rlctl.transport import Connection, Listener, Message, Transport
from rlctl.transport.base import bind_host

log = logging.getLogger(__name__)

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


class ControllerBase:
    """The state the controller's parts share, set up for `listen`; the links to its peers."""

    tracker: FanOut  # (set once the controller has resumed: `ControllerAgent.__init__`)
    evaluator: Evaluator | None

    def __init__(self, jobdir: JobDir, job: JobFile, transport: Transport, *, listen: str) -> None:
        self.jobdir, self.job = jobdir, job
        # rewards are scored here, as samples arrive, in worker processes beside the controller: a slow or hung
        # reward holds only its own group (which the staleness buffers let later groups overtake)
        self.task = task_source(job, jobdir.path, jobdir.init_model, scoring=True)
        self.ranker = LengthRanker()  # hashed token features: any vocabulary; refit online on real lengths
        if isinstance(self.task, DigitsSource):  # the demo's verifier knows lengths: bootstrap on them
            self.ranker.fit(*self.task.bootstrap(RANKER_BOOTSTRAP))
        self.placement = Placement.read(jobdir, job)
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
        self._gauged = -float("inf")  # when the loop last set the agents' gauges (`ControllerAgent._gauges`)
        self.paused: str | None = None  # why the job waits (status), None when it runs
        self.metrics = JobMetrics()
        self.metrics.last_trained.set(time.time())  # the start counts as progress: a job stuck before its first
        # iteration is a stalled job too (docs/prometheus/rlctl-alerts.yml)
        # bound now (a port another server holds ends the start before a resume moves anything aside), answered once
        # `ControllerAgent.__init__` restored what a resume restores: a scrape between read the job's 0s and NaNs
        self.metrics_port = self._bind_metrics(job.metrics.port)
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

    def _bind_metrics(self, port: int) -> int:
        """/metrics's port where the controller listens, `metrics.port` (0: a free one), held (`JobMetrics.bind`). A
        port that cannot be bound (another server holds it) is one line naming metrics.port and the address, which
        launch quotes."""
        host = bind_host(self.listener.address)
        try:
            return self.metrics.bind(port, addr=host)
        except OSError as e:
            self.listener.close()
            raise RlctlError(
                f"metrics.port {port}: cannot serve /metrics on {host}:{port} ({e.strerror or e})",
                hint="set metrics.port to a port free on the controller's host, or 0 for one picked at each start",
            ) from e

    def _prompts(self, iteration: int) -> list[PromptSpec]:
        return [self._spec(p) for p in self.task.rl_prompts(iteration, self.job.batch.prompts_per_iteration)]

    def _refill(self, iteration: int, j: int) -> PromptSpec:
        return self._spec(self.task.refill_prompt(iteration, self.job.batch.prompts_per_iteration, j))

    def _spec(self, p: RlPrompt) -> PromptSpec:
        return PromptSpec(p.prompt_id, p.tokens, p.target_tokens or self.task.max_new_tokens)

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

    def _broken(self, peer: Peer, why: str, *, since: float) -> None:
        """A send to `peer` failed. Its loss is left to its reader, which hears the connection's end too and says
        how the stream ended (`closed`: in order, `core.lost`): the reader may have closed the connection on the
        peer's in-order end just before this send; a failed TCP send closes the connection, which ends the read
        as closed on this side (not in order, and the loss gives this send's reason). A peer whose reader says
        nothing within BROKEN_GRACE_S is lost for the send (`_watch`)."""
        if peer.broken is None:  # `since`: when the send began (before its failure could end the read)
            peer.broken, peer.broken_since = why, since

    def _reply(self, peer: Peer, request: Message, body: dict[str, Any]) -> None:
        try:
            peer.conn.reply(request, make(request.kind, body))
        except TransportError as e:  # the asker left; its reader thread reports the close
            log.info("controller: %s reply to %s failed: %s", request.kind, peer.name, e)

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
