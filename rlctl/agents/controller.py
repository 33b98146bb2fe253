"""The controller process: the I/O shell around `ControllerCore` — connections, heartbeats, status,
metrics and the job directory.

    accept thread ──new connection──▶ reader thread per peer ──(peer, Message)──▶ inbox
    main loop:  event = inbox.get()
                  hello / sample / weights_applied / trained / closed ──▶ core ──▶ send its messages
                  status ──▶ reply with the status view
                  heartbeat ──▶ agent figures; an agent silent for HEARTBEAT_TIMEOUT_S is lost
                done ──▶ stop everyone, wait for their last figures, write summary.json, exit

Only the main loop sends, so each connection has one sender thread and one receiver thread.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from rlctl.agents.core import ControllerCore, CoreConfig, Out, PromptSpec
from rlctl.agents.ledger import State
from rlctl.agents.messages import Heartbeat, Hello, SampleDone, Trained, make, parse
from rlctl.config.job import JobFile
from rlctl.errors import TransportError
from rlctl.launch.jobdir import JobDir
from rlctl.metrics import JobMetrics
from rlctl.rl.ranker import LengthRanker, recall_at
from rlctl.rl.tasks import VOCAB_SIZE, DigitsTask
from rlctl.transport import Connection, Listener, Message, Transport

log = logging.getLogger(__name__)

HEARTBEAT_TIMEOUT_S = 15.0
NO_ROLLOUT_TIMEOUT_S = 60.0
START_WAIT_S = 90.0  # how long to wait for every planned rollout unit before starting with fewer
BYE_WAIT_S = 5.0
PROMPT_OFFSET = 1_000_000  # RL prompts are indices ≥ this in the task's stream; SFT draws at random
RANKER_BOOTSTRAP = 512


@dataclass
class Peer:
    name: str
    role: str
    conn: Connection
    last_seen: float
    figures: Heartbeat
    state: str = "running"


def core_config(job: JobFile, max_new_tokens: int, *, min_units: int = 1) -> CoreConfig:
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
    )


class ControllerAgent:
    def __init__(self, jobdir: JobDir, job: JobFile, transport: Transport, *, listen: str) -> None:
        if job.task.kind != "digits":
            raise ValueError(f"the runtime runs the digits task only, not {job.task.kind!r}")
        self.jobdir, self.job = jobdir, job
        self.task = DigitsTask(job.task)
        self.ranker = LengthRanker(VOCAB_SIZE)
        boot = self.task.prompts(0, RANKER_BOOTSTRAP)  # bootstrap on the verifier's lengths; refit online
        self.ranker.fit([p.tokens for p in boot], [p.target_tokens for p in boot])
        plan = jobdir.read_json(jobdir.plan_json) if jobdir.plan_json.exists() else {}
        self.sites = _sites_by_agent(plan)
        planned_units = sum(int(g["units"]) for g in plan.get("rollout", [])) or 1
        self.core = ControllerCore(
            core_config(job, self.task.max_new_tokens, min_units=planned_units),
            prompts=self._prompts,
            predict=lambda specs: self.ranker.predict([s.tokens for s in specs]).tolist(),
        )
        self.inbox: queue.Queue[tuple[str, Any, Any]] = queue.Queue()
        self.peers: dict[str, Peer] = {}
        self.listener: Listener = transport.listen(listen)
        self.t_start = time.monotonic()
        self.t_first: float | None = None
        self.violations = 0
        self.rows: list[dict[str, Any]] = []
        self._clients = itertools.count()
        self._closing = False
        self.metrics = JobMetrics()
        self.metrics_port = self.metrics.serve(job.metrics.port)
        self.weights_published: dict[int, float] = {}
        jobdir.write_json(
            jobdir.controller_json,
            {"address": self.listener.address, "pid": os.getpid(), "metrics_port": self.metrics_port},
        )
        jobdir.event("controller_listening", address=self.listener.address)
        threading.Thread(target=self._accept, name="accept", daemon=True).start()

    def _prompts(self, iteration: int) -> list[PromptSpec]:
        n = self.job.batch.prompts_per_iteration
        return [
            PromptSpec(p.prompt_id, p.tokens, p.target_tokens)
            for p in self.task.prompts(PROMPT_OFFSET + iteration * n, n)
        ]

    # -- the loop -----------------------------------------------------------------------------------
    def run(self) -> int:
        """Run the job to its end; 0 when every iteration was trained, 1 when it failed."""
        no_rollout_since: float | None = None
        try:
            while not self.core.done and not self.core.failed:
                try:
                    what, who, payload = self.inbox.get(timeout=0.5)
                except queue.Empty:
                    pass
                else:
                    self._handle(what, who, payload)
                now = time.monotonic()
                self._gauges(now)
                for p in list(self.peers.values()):
                    if p.role != "client" and p.state == "running" and now - p.last_seen > HEARTBEAT_TIMEOUT_S:
                        self._lose(p.name, f"no heartbeat for {now - p.last_seen:.0f} s")
                if not self.core.started and now - self.t_start > START_WAIT_S:
                    self.jobdir.event("start_with_fewer_units", planned=self.core.cfg.min_units)
                    self._send(self.core.start_now())
                alive = any(u.alive for u in self.core.units.values())
                no_rollout_since = None if alive else (no_rollout_since or now)
                if no_rollout_since is not None and now - no_rollout_since > NO_ROLLOUT_TIMEOUT_S:
                    self.core.failed = f"no rollout agent for {NO_ROLLOUT_TIMEOUT_S:.0f} s"
        finally:
            self._shutdown()
        return 0 if self.core.done else 1

    def _handle(self, what: str, who: Any, payload: Any) -> None:
        if what == "hello":
            self._hello(who, payload)
            return
        peer = self.peers.get(who)
        if peer is None:
            return
        if what == "closed":
            conn, err = payload
            if conn is not peer.conn:  # the end of a connection this agent already replaced
                return
            if peer.state == "running" and peer.role != "client":
                self._lose(who, str(err))
            if peer.role == "client":
                del self.peers[who]
            return
        msg: Message = payload
        peer.last_seen = time.monotonic()
        if msg.kind == "sample":
            s = parse(msg, SampleDone)
            self._send(
                self.core.sample(
                    who,
                    sample_id=s.sample_id,
                    version=s.version,
                    output_tokens=s.num_output_tokens,
                    payload=msg.tensors,
                )
            )
        elif msg.kind == "weights_applied":
            version = int(msg.header["version"])
            self.jobdir.event("weights_applied", agent=who, version=version)
            self._send(self.core.weights_applied(who, version))
            self._weights_applied_metric(version)
        elif msg.kind == "trained":
            self._trained(parse(msg, Trained))
        elif msg.kind in ("heartbeat", "bye"):
            peer.figures = parse(msg, Heartbeat)
            if msg.kind == "bye":
                peer.state = "stopped"
        elif msg.kind == "status":
            self._reply_status(peer, msg)
        else:
            log.warning("controller: unexpected %r from %s", msg.kind, who)

    def _reply_status(self, peer: Peer, request: Message) -> None:
        try:
            peer.conn.reply(request, make("status", self.status()))
        except TransportError as e:  # the asker left; its reader thread reports the close
            log.info("controller: status reply to %s failed: %s", peer.name, e)

    def _hello(self, conn: Connection, h: Hello) -> None:
        name = h.name if h.role != "client" else f"client-{next(self._clients)}"
        if name in self.peers and self.peers[name].state == "running":
            log.warning("controller: %s joined twice; dropping the old connection", name)
            self._lose(name, "replaced")
        self.peers[name] = Peer(
            name, h.role, conn, time.monotonic(), Heartbeat(name=name, state="running", version=h.version)
        )
        threading.Thread(target=self._read, args=(name, conn), name=f"read-{name}", daemon=True).start()
        if h.role == "client":
            return
        self.jobdir.event("agent_joined", agent=name, role=h.role, version=h.version, pid=h.pid)
        self._send(self.core.join(name, role=h.role, version=h.version, address=h.address))

    def _gauges(self, now: float) -> None:
        m = self.metrics
        m.queue_depth.set(len(self.core.ledger.in_state(State.QUEUED, iteration=self.core.trainer_version)))
        for p in self.peers.values():
            if p.role == "client":
                continue
            labels = (p.role, p.name, self.sites.get(p.name, ""))
            m.agent_up.labels(*labels).set(1 if p.state == "running" else 0)
            m.agent_heartbeat_age_seconds.labels(*labels).set(now - p.last_seen)
        units: dict[str, int] = {}
        for u in self.core.units.values():
            if u.alive:
                site = self.sites.get(u.name, "")
                units[site] = units.get(site, 0) + 1
        for site, n in units.items():
            m.rollout_units.labels(site).set(n)

    def _weights_applied_metric(self, version: int) -> None:
        """A version counts as delivered when the last live rollout unit applied it."""
        published = self.weights_published.get(version)
        if published is None:
            return
        units = [u for u in self.core.units.values() if u.alive]
        if all(u.version >= version for u in units):
            self.metrics.weight_transfer_seconds.observe(time.monotonic() - published)
            del self.weights_published[version]

    def _lose(self, name: str, why: str) -> None:
        peer = self.peers[name]
        peer.state = "lost"
        peer.conn.close()
        before = self.core.ledger.requeued
        self._send(self.core.lost(name))
        self.jobdir.event("agent_lost", agent=name, reason=why, requeued=self.core.ledger.requeued - before)
        log.warning("controller: %s lost (%s); %d samples re-queued", name, why, self.core.ledger.requeued - before)

    def _send(self, outs: list[Out]) -> None:
        if self.t_first is None and any(o.kind == "generate" for o in outs):
            self.t_first = time.monotonic()
        for o in outs:
            name = self.core.trainer.name if o.to == "trainer" and self.core.trainer else o.to
            peer = self.peers.get(name)
            if peer is None or peer.state != "running":
                continue
            tensors = [t for pair in o.payload for t in pair] if o.kind == "samples" else []
            try:
                peer.conn.send(make(o.kind, o.header, tensors))
            except TransportError as e:
                self._lose(name, f"send failed: {e}")

    def _trained(self, t: Trained) -> None:
        outs = self.core.trained(
            iteration=t.iteration,
            version=t.version,
            sample_ids=t.sample_ids,
            stats={"reward_mean": t.reward_mean, "train_s": t.train_s, "loss": t.loss},
        )
        self.violations += t.staleness_violations
        trainer = self.peers.get(self.core.trainer.name if self.core.trainer else "")
        if trainer is not None:
            trainer.figures.busy_s, trainer.figures.version = t.busy_s, t.version
        row = self._metrics_row(t)
        self.rows.append(row)
        self._refit_ranker(t.iteration)
        self.jobdir.append(self.jobdir.metrics, row)
        every = self.job.checkpoint.every_iterations
        if t.version == self.job.iterations or (every and t.version % every == 0):
            d = self.jobdir.checkpoint(t.version)
            d.mkdir(parents=True, exist_ok=True)
            self.jobdir.write_json(d / "ledger.json", self.core.ledger.to_json())
        self._send(outs)
        m = self.metrics
        m.iteration.set(t.iteration)
        m.generation_seconds.set(row["t_gen_s"])
        m.training_seconds.set(row["t_train_s"])
        m.imbalance_seconds.set(row["delta_s"])
        m.samples_per_second.set(row["samples_per_s"])
        m.tokens_per_second.set(row["tokens_per_s"])
        m.reward_mean.set(t.reward_mean)
        m.weight_version.set(t.version)
        m.samples_total.labels("trained").inc(len(t.sample_ids))
        for gap, n in self.core.stats[t.iteration].staleness.items():
            for _ in range(n):
                m.staleness_versions.observe(gap)
        self.weights_published[t.version] = time.monotonic()
        self.jobdir.event("trained", iteration=t.iteration, version=t.version)

    def _metrics_row(self, t: Trained) -> dict[str, Any]:
        st = self.core.stats[t.iteration]
        prev = self.core.stats.get(t.iteration - 1)
        start = prev.trained_at if prev is not None and prev.trained_at else (self.t_first or self.t_start)
        period = max((st.trained_at or 0.0) - start, 1e-9)
        t_gen = (st.last_finish or 0.0) - (st.first_dispatch or 0.0)
        return {
            "iteration": t.iteration,
            "reward_mean": round(t.reward_mean, 4),
            "t_gen_s": round(t_gen, 4),
            "t_train_s": round(t.train_s, 4),
            "delta_s": round(t_gen - t.train_s, 4),
            "samples_per_s": round(st.samples / period, 2),
            "tokens_per_s": round(st.output_tokens / period, 1),
            "weight_version": t.version,
            "staleness": {str(k): v for k, v in sorted(st.staleness.items())},
            "loss": round(t.loss, 5),
            "period_s": round(period, 4),
            "wall_s": round((st.trained_at or 0.0) - self.t_start, 3),
        }

    def _refit_ranker(self, iteration: int) -> None:
        """Online refit on what the policy actually generated; records the ranker's recall on it."""
        by_prompt: dict[str, list[int]] = {}
        for e in self.core.ledger.iteration_entries(iteration):
            by_prompt.setdefault(e.prompt_id, []).append(e.output_tokens)
        pids = list(by_prompt)
        lengths = [sum(v) / len(v) for v in by_prompt.values()]
        preds = [self.core.pred_len[p] for p in pids]
        if len(pids) >= 5:
            self.rows[-1]["ranker_recall_20"] = round(recall_at(preds, lengths, 0.2), 3)
        self.ranker.update([self.core.prompts[p].tokens for p in pids], lengths)

    # -- status and summary -------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        last = self.rows[-1] if self.rows else {}
        agents = []
        for p in self.peers.values():
            if p.role == "client":
                continue
            agents.append(
                {
                    "name": p.name,
                    "role": p.role,
                    "state": p.state,
                    "version": p.figures.version,
                    "heartbeat_age_s": round(now - p.last_seen, 2),
                    "busy_s": round(p.figures.busy_s, 2),
                    "inflight": self.core.ledger.inflight(p.name) if p.role == "rollout" else 0,
                }
            )
        counts = self.core.ledger.counts()
        return {
            "job": self.job.name,
            "mode": self.job.pipeline.mode,
            "eta": self.job.pipeline.eta,
            "state": "done" if self.core.done else "failed" if self.core.failed else "running",
            "iteration": self.core.trainer_version,
            "iterations": self.job.iterations,
            "weight_version": self.core.trainer_version,
            "reward": last.get("reward_mean"),
            "t_gen_s": last.get("t_gen_s"),
            "t_train_s": last.get("t_train_s"),
            "delta_s": last.get("delta_s"),
            "samples_per_s": last.get("samples_per_s"),
            "tokens_per_s": last.get("tokens_per_s"),
            "queue_depth": len(self.core.ledger.in_state(State.QUEUED, iteration=self.core.trainer_version)),
            "staleness_violations": self.violations,
            "elapsed_s": round(now - self.t_start, 2),
            "metrics_port": self.metrics_port,
            "ledger": {
                "prompts": counts.prompts,
                "trained": counts.trained,
                "requeued": counts.requeued,
                "duplicated": counts.duplicated,
            },
            "agents": agents,
        }

    def summary(self) -> dict[str, Any]:
        rows = self.rows
        k = max(1, min(20, len(rows) // 10)) if rows else 0  # reward_first/last: mean of the first/last 10 %
        end = self.core.stats[rows[-1]["iteration"]].trained_at if rows else None
        span = (end - (self.t_first or self.t_start)) if end else 0.0
        samples = sum(self.core.stats[r["iteration"]].samples for r in rows)
        tokens = sum(self.core.stats[r["iteration"]].output_tokens for r in rows)
        counts = self.core.ledger.counts(completed_iterations=self.core.trainer_version)
        staleness: dict[str, int] = {}
        for r in rows:
            for key, n in r["staleness"].items():
                staleness[key] = staleness.get(key, 0) + n
        busy = {p.name: (p.role, p.figures.busy_s) for p in self.peers.values() if p.role != "client"}
        roll = [b for role, b in busy.values() if role == "rollout"]
        train = [b for role, b in busy.values() if role == "trainer"]

        def bubble(xs: list[float]) -> float | None:
            return round(max(0.0, 1 - (sum(xs) / len(xs)) / span), 4) if xs and span > 0 else None

        def mean(key: str) -> float | None:
            return round(sum(r[key] for r in rows) / len(rows), 4) if rows else None

        return {
            "job": self.job.name,
            "mode": self.job.pipeline.mode,
            "eta": self.job.pipeline.eta,
            "state": "done" if self.core.done else f"failed: {self.core.failed}" if self.core.failed else "stopped",
            "iterations": len(rows),
            "iterations_planned": self.job.iterations,
            "reward_first": round(sum(r["reward_mean"] for r in rows[:k]) / k, 4) if rows else None,
            "reward_last": round(sum(r["reward_mean"] for r in rows[-k:]) / k, 4) if rows else None,
            "reward_window": k,
            "reward_curve": [r["reward_mean"] for r in rows],
            "samples_per_s": round(samples / span, 2) if span > 0 else None,
            "tokens_per_s": round(tokens / span, 1) if span > 0 else None,
            "run_s": round(span, 3),
            "t_gen_s": mean("t_gen_s"),
            "t_train_s": mean("t_train_s"),
            "delta_s": mean("delta_s"),
            "bubble_fraction": {"rollout": bubble(roll), "trainer": bubble(train)},
            "staleness": staleness,
            "staleness_violations": self.violations,
            "ledger": {
                "prompts": counts.prompts,
                "trained": counts.trained,
                "requeued": counts.requeued,
                "lost": counts.lost,
                "duplicated": counts.duplicated,
                "refused": counts.refused,
                "samples": counts.samples,
                "trained_samples": counts.trained_samples,
            },
            "agents": {n: {"role": r, "busy_s": round(b, 3)} for n, (r, b) in busy.items()},
            "job_dir": str(self.jobdir.path),
        }

    def _shutdown(self) -> None:
        self._closing = True
        for p in self.peers.values():
            if p.state == "running" and p.role != "client":
                try:
                    p.conn.send(make("stop"))
                except TransportError:
                    p.state = "lost"
        deadline = time.monotonic() + BYE_WAIT_S
        while time.monotonic() < deadline and any(
            p.state == "running" and p.role != "client" for p in self.peers.values()
        ):
            try:
                what, who, payload = self.inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            peer = self.peers.get(who) if isinstance(who, str) else None
            if peer is None:
                continue
            if what == "closed":
                peer.state = "stopped" if peer.state == "running" else peer.state
            elif payload.kind in ("heartbeat", "bye"):
                peer.figures = parse(payload, Heartbeat)
                if payload.kind == "bye":
                    peer.state = "stopped"
            elif payload.kind == "status":
                self._reply_status(peer, payload)
        summary = self.summary()
        self.jobdir.write_json(self.jobdir.summary_json, summary)
        self.jobdir.event("job_end", state=summary["state"], iterations=summary["iterations"])
        for p in self.peers.values():
            p.conn.close()
        self.listener.close()

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
        while True:
            try:
                self.inbox.put(("msg", name, conn.recv()))
            except TransportError as e:
                self.inbox.put(("closed", name, (conn, e)))
                return


def _sites_by_agent(plan: dict[str, Any]) -> dict[str, str]:
    """Agent name → site, in the order the launcher starts them (see run.JobRun.start)."""
    out: dict[str, str] = {}
    trainer = plan.get("trainer", {})
    for rank in range(int(trainer.get("ranks", 1))):
        out[f"trainer-{rank}"] = str(trainer.get("site", ""))
    n = 0
    for group in plan.get("rollout", []):
        for _ in range(int(group["units"])):
            out[f"rollout-{n}"] = str(group["site"])
            n += 1
    return out
