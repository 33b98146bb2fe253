"""The controller's membership and liveness (`Membership`): an agent's hello (a rollout unit's reconnect, one
counted lost refused), the watch that pings and marks silent agents unreachable and then lost, a rejoin, the job
paused while a site is away, and what a lost agent costs (requeued samples, suspect prompts, unsent tokens).

    running ──silent HEARTBEAT_TIMEOUT_S──▶ unreachable ──any message / a new hello──▶ running (rejoined)
                                                 └──transport.unreachable_timeout_s──▶ lost (replaced)"""

from __future__ import annotations

import contextlib
import logging
import shlex
import socket
import threading
import time

from rlctl.agents import common
from rlctl.agents.books import GoneAgent
from rlctl.agents.controller_base import Peer
from rlctl.agents.controller_weights import WeightBookkeeping
from rlctl.agents.flight import read_flight
from rlctl.agents.messages import Heartbeat, Hello, make
from rlctl.agents.watchdog import HUNG
from rlctl.errors import TransportError
from rlctl.transport import Connection

log = logging.getLogger(__name__)

HEARTBEAT_TIMEOUT_S = 15.0
PING_INTERVAL_S = common.PING_INTERVAL_S
BROKEN_GRACE_S = 5.0  # a peer a send failed on is lost after this, unless its reader heard the end first


class Membership(WeightBookkeeping):
    """Who is in the job, and who went silent or was lost."""

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
        known = old is not None or gone is not None or self.core.known(name)
        if h.again and h.role == "rollout" and not known and not self.scaler.awaits(name):
            # it joined, was counted lost, and its name was let go since (GONE_KEPT, LEFT_KEPT: a mass loss while it
            # kept reconnecting); taken as a new unit it ran beside its replacement and counted twice (`num_joined`).
            # A unit the job still waits for is taken: its first hello was lost with the link it went on
            self._refuse(name, conn)
            return
        if old is not None and old.state in ("running", "unreachable"):
            log.warning("controller: %s joined twice; dropping the old connection", name)
            self._lose(name, "replaced")
        if old is not None:  # its record is replaced, never pruned: its weight nodes' addresses go as a gone one's
            self.book.forget(name)
        # its name is a new agent's (a stopped unit's, a trainer's): listed as that; a lost one before it still counts
        replaced = GoneAgent(old.role, old.state, old.figures.busy_s) if old is not None else None
        self.gone.taken(name, replaced=replaced)
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
            trainer = h.role == "trainer"
            self.book.node(address, agent=f"trainer-{i}" if trainer else name, datacenter=dc, root=trainer, owner=name)
        self.jobdir.event(
            "agent_joined", agent=name, role=h.role, version=h.version, pid=h.pid, datacenter=dc, weights=h.weights
        )
        self._send(
            self.core.join(name, role=h.role, version=h.version, address=h.address, weights=h.weights, datacenter=dc)
        )
        if h.role == "rollout":
            self._holds(name, h.version)
            self._evaluate(name, h.version)

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
