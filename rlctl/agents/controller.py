"""The controller process: the I/O shell around `ControllerCore` — connections, heartbeats, status,
metrics and the job directory.

    accept thread ──new connection──▶ reader thread per peer ──(peer, Message)──▶ inbox
    main loop:  event = inbox.get()
                  hello / sample / weights_applied / trained / closed ──▶ core ──▶ send its messages
                  status ──▶ reply with the status view
                  scale ──▶ spawner thread starts / core drains units ──▶ "spawned" back into the inbox
                  shutdown ──▶ leave the loop (graceful stop requested by `rlctl stop`)
                trained ──▶ rebalance rule: δ ≥ δ' and a free slot ──▶ spawn one more rollout unit
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
from rlctl.agents.rebalance import Reading, RebalanceRule
from rlctl.agents.weightbook import WeightBook
from rlctl.config.inventory import Site
from rlctl.config.job import JobFile
from rlctl.errors import RlctlError, TransportError
from rlctl.launch.backends import read_sites
from rlctl.launch.jobdir import JobDir
from rlctl.launch.layout import rollout_tp
from rlctl.launch.spawn import Spawner
from rlctl.metrics import JobMetrics
from rlctl.rl.ranker import LengthRanker, recall_at
from rlctl.rl.source import DigitsSource, task_source
from rlctl.tracking import FanOut, make_trackers, row_to_metrics
from rlctl.transport import Connection, Listener, Message, Transport

log = logging.getLogger(__name__)

HEARTBEAT_TIMEOUT_S = 15.0
NO_ROLLOUT_TIMEOUT_S = 60.0
START_WAIT_S = 90.0  # how long to wait for every planned rollout unit before starting with fewer
BYE_WAIT_S = 5.0
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
        self.jobdir, self.job = jobdir, job
        self.task = task_source(job, jobdir.path, jobdir.init_model)
        self.ranker = LengthRanker()  # hashed token features: any vocabulary; refit online on real lengths
        if isinstance(self.task, DigitsSource):  # the demo's verifier knows lengths: bootstrap on them
            self.ranker.fit(*self.task.bootstrap(RANKER_BOOTSTRAP))
        plan = jobdir.read_json(jobdir.plan_json) if jobdir.plan_json.exists() else {}
        self.plan = plan
        self.sites = _sites_by_agent(plan)
        self.site_specs: dict[str, Site] = read_sites(jobdir.path)
        self.spawner = Spawner(jobdir, self.site_specs, job=jobdir.path.name) if self.site_specs else None
        self.rule = RebalanceRule(job.rebalance)
        self.reading: Reading | None = None
        self.stop_requested = False
        self.spawn_requested: dict[str, float] = {}  # agent → when its start was asked for
        self._next_replica: int | None = None
        self.scale_log: list[dict[str, Any]] = []
        self.book = WeightBook()
        self.done_at: float | None = None  # when the last iteration was trained (the final weight sync starts)
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
        job_config = job.model_dump(mode="json", by_alias=True)
        self.tracker = FanOut(make_trackers(job.tracking, jobdir.path, job.name, job_config))
        jobdir.write_json(
            jobdir.controller_json,
            {"address": self.listener.address, "pid": os.getpid(), "metrics_port": self.metrics_port},
        )
        jobdir.event("controller_listening", address=self.listener.address)
        threading.Thread(target=self._accept, name="accept", daemon=True).start()

    def _prompts(self, iteration: int) -> list[PromptSpec]:
        n = self.job.batch.prompts_per_iteration
        return [
            PromptSpec(p.prompt_id, p.tokens, p.target_tokens or self.task.max_new_tokens)
            for p in self.task.rl_prompts(iteration, n)
        ]

    # -- the loop -----------------------------------------------------------------------------------
    def run(self) -> int:
        """Run the job to its end; 0 when every iteration was trained, 1 when it failed."""
        no_rollout_since: float | None = None
        try:
            while not self.core.failed and not self.stop_requested and not self._finished():
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

    def _finished(self) -> bool:
        """Done once every iteration is trained and every live unit holds the last version (so a job ends
        with its rollout units on the trainer's final weights), or that final sync timed out."""
        if not self.core.done:
            return False
        now = time.monotonic()
        if self.done_at is None:
            self.done_at = now
        behind = [u.name for u in self.core.units.values() if u.alive and u.version < self.core.trainer_version]
        if not behind:
            return True
        if now - self.done_at > self.job.transport.timeout_s:
            log.warning("controller: %s did not get v%d in time", ", ".join(behind), self.core.trainer_version)
            self.jobdir.event("final_weights_timeout", agents=behind, version=self.core.trainer_version)
            return True
        return False

    def _handle(self, what: str, who: Any, payload: Any) -> None:
        if what == "hello":
            self._hello(who, payload)
            return
        if what == "spawned":
            self._spawned(who, payload)
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
            t0 = self.spawn_requested.pop(who, None)
            if t0 is not None:
                seconds = round(time.monotonic() - t0, 3)
                self.jobdir.event("first_sample", agent=who, seconds_since_scale=seconds)
                self.rule.changed()  # from now on δ reflects the new unit count
                log.info("controller: %s produced its first sample %.1f s after it was asked for", who, seconds)
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
            holder = self.book.nodes.get(str(msg.header.get("holder", "")), ("", ""))[0]
            self.jobdir.event(
                "weights_applied",
                agent=who,
                version=version,
                source=holder,
                encoding=msg.header.get("encoding"),
                bytes=msg.header.get("wire_bytes"),
                fetch_s=msg.header.get("fetch_s"),
            )
            self._transfer(who, version, msg.header)
            self._send(self.core.weights_applied(who, version))
        elif msg.kind == "trained":
            self._trained(parse(msg, Trained))
        elif msg.kind in ("heartbeat", "bye"):
            peer.figures = parse(msg, Heartbeat)
            if msg.kind == "bye":
                peer.state = "stopped"
        elif msg.kind == "status":
            self._reply_status(peer, msg)
        elif msg.kind == "scale":
            self._reply(peer, msg, self._scale(int(msg.header["delta"]), msg.header.get("site"), reason="manual"))
        elif msg.kind == "shutdown":
            self.stop_requested = True
            self.jobdir.event("stop_requested", by=peer.name)
            self._reply(peer, msg, {"ok": True})
        else:
            log.warning("controller: unexpected %r from %s", msg.kind, who)

    def _reply_status(self, peer: Peer, request: Message) -> None:
        self._reply(peer, request, self.status())

    def _reply(self, peer: Peer, request: Message, body: dict[str, Any]) -> None:
        try:
            peer.conn.reply(request, make(request.kind, body))
        except TransportError as e:  # the asker left; its reader thread reports the close
            log.info("controller: %s reply to %s failed: %s", request.kind, peer.name, e)

    # -- scaling ------------------------------------------------------------------------------------
    def pending_units(self) -> list[str]:
        """Units asked for that have not joined yet."""
        return [n for n in self.spawn_requested if n not in self.core.units]

    def free_slots(self) -> dict[str, int]:
        """Rollout units each rollout site can still start for this job (GPUs left / the site's tp per unit)."""
        used = dict.fromkeys(self.site_specs, 0)
        trainer = self.plan.get("trainer", {})
        if trainer.get("site") in used:
            used[trainer["site"]] += int(trainer.get("ranks", 1))
        units = [u.name for u in self.core.units.values() if u.alive] + self.pending_units()
        for site in (self.sites.get(n, "") for n in units):
            if site in used:
                used[site] += rollout_tp(self.plan, site)
        rollout_sites = [g["site"] for g in self.plan.get("rollout", [])]
        return {
            s: (self.site_specs[s].total_gpus - used[s]) // rollout_tp(self.plan, s)
            for s in rollout_sites
            if s in self.site_specs
        }

    def _scale(self, delta: int, site: str | None, *, reason: str) -> dict[str, Any]:
        """Add (delta > 0: started in the background) or drain and remove (delta < 0) rollout units."""
        rollout_sites = [g["site"] for g in self.plan.get("rollout", [])]
        if site is not None and site not in rollout_sites:
            return {"error": f"site {site!r} runs no rollout units of this job; rollout sites: {rollout_sites}"}
        if delta > 0:
            if self.spawner is None:
                return {"error": "this controller has no launch backends (no sites.json in the job directory)"}
            free = self.free_slots()
            cap = self.job.rebalance.max_rollout_units
            room = None if cap is None else cap - len(self.core.live_units) - len(self.pending_units())
            targets: list[str] = []
            for _ in range(delta):
                candidates = [site] if site is not None else rollout_sites
                pick = next((s for s in candidates if free.get(s, 0) > 0), None)
                if pick is None or (room is not None and room <= 0):
                    break
                free[pick] -= 1
                room = None if room is None else room - 1
                targets.append(pick)
            if len(targets) < delta:
                where = site or ", ".join(rollout_sites)
                return {
                    "error": f"only {len(targets)} of {delta} units fit: free slots on {where}: {self.free_slots()}"
                }
            names = [self._spawn(t, reason) for t in targets]
            return {"adding": names, "sites": targets}
        units = [u for u in self.core.live_units if site is None or self.sites.get(u.name) == site]
        if -delta > len(units) or -delta >= len(self.core.live_units):
            return {
                "error": f"cannot remove {-delta} of {len(units)} rollout unit(s)"
                f"{' on ' + site if site else ''}: at least one unit must stay in the job"
            }
        victims = sorted(units, key=lambda u: int(u.name.rsplit("-", 1)[1]), reverse=True)[:-delta]
        for u in victims:
            self._send(self.core.drain(u.name))
            self._scale_event("in", u.name, self.sites.get(u.name, ""), reason)
        return {"removing": [u.name for u in victims]}

    def _spawn(self, site: str, reason: str) -> str:
        """Start one rollout unit on `site` from a thread (SSH / sbatch may take seconds); its name."""
        spawner = self.spawner
        assert spawner is not None
        if self._next_replica is None:
            self._next_replica = spawner.first_free_replica()
        replica, self._next_replica = self._next_replica, self._next_replica + 1
        name = f"rollout-{replica}"
        self.sites[name] = site
        self.spawn_requested[name] = time.monotonic()

        def run() -> None:
            try:
                spawner.add_rollout(site, replica)
                self.inbox.put(("spawned", name, (site, reason, None)))
            except RlctlError as e:
                self.inbox.put(("spawned", name, (site, reason, str(e))))

        threading.Thread(target=run, name=f"spawn-{name}", daemon=True).start()
        return name

    def _spawned(self, name: str, info: tuple[str, str, str | None]) -> None:
        site, reason, error = info
        if error is not None:
            self.spawn_requested.pop(name, None)
            self.jobdir.event("scale_failed", agent=name, site=site, reason=reason, error=error)
            log.warning("controller: could not add %s on %s: %s", name, site, error)
            return
        self._scale_event("out", name, site, reason)

    def _scale_event(self, direction: str, name: str, site: str, reason: str) -> None:
        r = self.reading
        ev = {
            "direction": direction,
            "agent": name,
            "site": site,
            "reason": reason,
            "iteration": self.core.trainer_version,
            "delta_s": None if r is None else round(r.delta_s, 4),
            "delta_prime_s": None if r is None else round(r.delta_prime_s, 4),
        }
        self.scale_log.append(ev)
        self.jobdir.event("scale", **ev)
        self.metrics.scale_events.labels(direction, reason).inc()
        self.rule.changed()

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
        dc = self._datacenter(name)
        for i, address in enumerate(h.weight_roots or [h.weights]):  # a trainer's ranks, or the unit itself
            self.book.node(address, agent=name if h.role != "trainer" else f"trainer-{i}", datacenter=dc)
        self.jobdir.event("agent_joined", agent=name, role=h.role, version=h.version, pid=h.pid, datacenter=dc)
        self._send(
            self.core.join(name, role=h.role, version=h.version, address=h.address, weights=h.weights, datacenter=dc)
        )

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

    def _transfer(self, who: str, version: int, header: dict[str, Any]) -> None:
        """One unit applied `version`: book its transfer (bytes, the link it crossed) and whether every
        live unit now has that version (and the ones it skipped)."""
        wire = header.get("wire_bytes")
        wire_bytes = wire if isinstance(wire, int) else 0
        fetch = header.get("fetch_s")
        link = self.book.applied(
            who,
            datacenter=self._datacenter(who),
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
        live = {u.name for u in self.core.units.values() if u.alive}
        for seconds in self.book.reached(who, version, live, time.monotonic()):
            self.metrics.weight_transfer_seconds.observe(seconds)
            self.metrics.weight_last_unit_seconds.set(seconds)

    def _datacenter(self, agent: str) -> str:
        site = self.site_specs.get(self.sites.get(agent, ""))
        return site.datacenter if site is not None else ""

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
        self._rebalance(row)
        self.rows.append(row)
        self._refit_ranker(t.iteration)
        self.jobdir.append(self.jobdir.metrics, row)
        self.tracker.log(t.iteration, row_to_metrics(row))
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
        self.book.published(t.version, time.monotonic())
        self.jobdir.event("trained", iteration=t.iteration, version=t.version)

    def _rebalance(self, row: dict[str, Any]) -> None:
        """StreamRL §4.2: δ ≥ δ' and a free slot → one more rollout unit (see rebalance.py)."""
        units = len(self.core.live_units) + len(self.pending_units())
        free = self.free_slots() if self.spawner is not None else {}
        cap = self.job.rebalance.max_rollout_units
        can_add = any(n > 0 for n in free.values()) and (cap is None or units < cap)
        r = self.rule.observe(
            row["iteration"], t_gen_s=row["t_gen_s"], t_train_s=row["t_train_s"], units=units, can_add=can_add
        )
        self.reading = r
        row["delta_window_s"] = round(r.delta_s, 4)
        row["delta_prime_s"] = round(r.delta_prime_s, 4)
        row["rollout_units"] = units
        self.metrics.rebalance_threshold_seconds.set(r.delta_prime_s)
        if r.add:
            self.rule.changed()
            log.info(
                "controller: δ %.3f s ≥ δ' %.3f s at iteration %d: adding a rollout unit",
                r.delta_s,
                r.delta_prime_s,
                r.iteration,
            )
            out = self._scale(1, None, reason="rebalance")
            if "error" in out:
                self.jobdir.event("scale_failed", reason="rebalance", error=out["error"])

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
            "kl": round(t.kl, 6),
            "reward_failures": t.reward_failures,
            "period_s": round(period, 4),
            "wall_s": round((st.trained_at or 0.0) - self.t_start, 3),
            "t": round(time.time(), 3),
            "agents": {
                p.name: {
                    "role": p.role,
                    "site": self.sites.get(p.name, ""),
                    "busy_s": round(p.figures.busy_s, 3),
                    "state": p.state,
                }
                for p in self.peers.values()
                if p.role != "client"
            },
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
                    "site": self.sites.get(p.name, ""),
                    "heartbeat_age_s": round(now - p.last_seen, 2),
                    "busy_s": round(p.figures.busy_s, 2),
                    "inflight": self.core.ledger.inflight(p.name) if p.role == "rollout" else 0,
                    "draining": bool(
                        p.role == "rollout" and p.name in self.core.units and self.core.units[p.name].draining
                    ),
                }
            )
        counts = self.core.ledger.counts()
        staleness: dict[str, int] = {}
        for row in self.rows:
            for key, n in row["staleness"].items():
                staleness[key] = staleness.get(key, 0) + n
        last_trained = self.core.stats.get(self.core.trainer_version - 1)
        r = self.reading
        state = "done" if self.core.done else "failed" if self.core.failed else "running"
        return {
            "job": self.job.name,
            "mode": self.job.pipeline.mode,
            "eta": self.job.pipeline.eta,
            "state": "stopping" if self.stop_requested and state == "running" else state,
            "iteration": self.core.trainer_version,
            "iterations": self.job.iterations,
            "weight_version": self.core.trainer_version,
            "reward": last.get("reward_mean"),
            "t_gen_s": last.get("t_gen_s"),
            "t_train_s": last.get("t_train_s"),
            "delta_s": last.get("delta_s"),
            "delta_window_s": None if r is None else round(r.delta_s, 4),
            "delta_prime_s": None if r is None else round(r.delta_prime_s, 4),
            "rebalance": {"auto": self.job.rebalance.auto, "why": None if r is None else r.why},
            "rollout_units": len(self.core.live_units),
            "free_slots": self.free_slots(),
            "scale_events": self.scale_log[-10:],
            "staleness": staleness,
            "weights": self._weights_view(),
            "figures_age_s": None
            if last_trained is None or last_trained.trained_at is None
            else round(now - last_trained.trained_at, 2),
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

    def _weights_view(self) -> dict[str, Any]:
        """The newest version, how many live units have it, and per recent version: transfers, bytes,
        encodings, bytes and copies per inter-DC link, seconds until the last unit had it."""
        return {
            "version": self.core.trainer_version,
            "units_at_version": sum(1 for u in self.core.live_units if u.version >= self.core.trainer_version),
            "sync": self.job.weight_sync.mode,
            "inter_dc_total": {k: dict(v) for k, v in self.book.totals.items()},
            "versions": self.book.view(),
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
            "scale_events": self.scale_log,
            "weights": self._weights_view(),
            "reward_failures": rows[-1]["reward_failures"] if rows else 0,
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
        self.tracker.close()
        for p in self.peers.values():
            p.conn.close()
        self.listener.close()
        if self.spawner is not None:
            self.spawner.close()

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
    """Agent name → site, in the order the launcher starts them (see rlctl.launch.run.JobRun.start)."""
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
