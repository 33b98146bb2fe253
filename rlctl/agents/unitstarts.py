"""The units the Scaler asks for: their starts in the background, the slots they and the plan's units not joined
yet hold, their first samples and failed starts (what `rlctl scale --wait` reads), the given-up places they take,
and the scale events. The Scaler's base layer (`healing.Healer` replaces lost units on it, `scaling.Scaler` takes the
requests); it holds the state the layers share.

    a unit asked for ──▶ _spawn(): spawn thread: Spawner.add_rollout (SSH / sbatch: seconds) ──▶ post("spawned", ...)
    "spawned" from the controller's inbox ──▶ spawned(): scale event "out" (or scale_failed: `_failed_start`)
    the new unit's first sample ──▶ sampled(): first_sample event; the rule measures afresh
    a unit no longer asked for (it sampled, or its start failed) ──▶ _unrequest(): its request and join bound gone

The controller owns the inbox and the sockets; this module only posts to the one, so every send still happens on the
controller's main loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rlctl.agents.books import ScaleLog, keep
from rlctl.agents.core import ControllerCore
from rlctl.agents.placement import Placement, sites_by_agent
from rlctl.agents.rebalance import Reading, RebalanceRule
from rlctl.config.pipeline import Rebalance
from rlctl.errors import RlctlError
from rlctl.launch.jobdir import JobDir
from rlctl.launch.spawn import Spawner
from rlctl.metrics import JobMetrics

log = logging.getLogger(__name__)

Post = Callable[[tuple[str, Any, Any]], None]  # the controller's inbox.put


# the latest units asked for whose first sample or failed start is kept (`first_sample_s`, `failed_starts`): what
# `rlctl scale --wait` reads of the units it added, every 0.5 s, from the status reply, long before this many more
# units asked for sampled or failed; a run whose units come and go for weeks keeps these, not one per unit it had
STARTS_KEPT = 1024
# the units gone for good (lost, drained, failed to start) whose site `placement.sites` still holds, the latest started:
# the controller lists a gone unit (status, its metrics row, its gauges removed by their site label) until the metrics
# row after it went (`ControllerAgent._prune`), long before this many more units started
GONE_SITES_KEPT = 1024


@dataclass
class Replacement:
    lost: str
    site: str
    due: float  # the scaler's clock at the next attempt
    attempts: int = 0
    unit: str | None = None  # the unit started for the current attempt
    started: float = 0.0  # when the current attempt began (its join bound counts from `Scaler.join_since`)
    error: str | None = None  # why the current attempt failed to start
    why: str | None = None  # why the last attempt failed (status)
    stopping: bool = False  # the current attempt's unit, not joined within the bound, is being stopped


class UnitStarts:
    """The Scaler's base layer: the units asked for, from their request to their first sample or failed start, the
    slots they hold, and the scale events."""

    def __init__(
        self,
        jobdir: JobDir,
        cfg: Rebalance,
        *,
        core: ControllerCore,
        placement: Placement,
        metrics: JobMetrics,
        post: Post,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock`: the controller loop's (the `now` of `tick`), which the times it reads itself are on too (when a
        unit was asked for, its start returned, its first sample came) — a test that ticks on its own clock gives it
        one, or a spawn thread run late on a loaded machine moved the unit's join bound by as much."""
        self.jobdir, self.cfg, self.core, self.placement = jobdir, cfg, core, placement
        self.metrics, self.post, self.clock = metrics, post, clock
        specs = placement.site_specs
        self.spawner = Spawner(jobdir, specs, job=jobdir.id) if specs else None
        self.rule = RebalanceRule(cfg)
        self.reading: Reading | None = None
        self.spawn_requested: dict[str, float] = {}  # agent → when its start was asked for
        # unit asked for → seconds from the request to its first sample; one whose start failed → the error (`scale
        # --wait`): the latest `starts_kept` of each (`keep`)
        self.first_sample_s: dict[str, float] = {}
        self.failed_starts: dict[str, str] = {}
        self.starts_kept = STARTS_KEPT
        self.gone_sites_kept = GONE_SITES_KEPT
        self._scale_log = ScaleLog()  # the latest listed, every one counted
        self._next_replica: int | None = None
        self.replacing: dict[str, Replacement] = {}  # lost unit → its replacement's progress
        self.unproven: dict[str, Replacement] = {}  # a replacement that joined → its chain, until its first sample
        # site → units given up on there whose place no unit asked for since took (`unit_counts`), and the unit asked
        # for → the site whose given-up place it takes (given back if its start fails; kept until it stands or is lost)
        self._unfilled: dict[str, int] = {}
        self._filling: dict[str, str] = {}
        # units that exited before they joined: they hold no slot. A unit asked for leaves it with its request
        # (`_unrequest`), so that a run whose units come and go for weeks holds the plan's and those asked for now
        self.never_joined: set[str] = set()
        # unit asked for → whether its scheduler last said it queues it (`_still_queued`), and since when its site
        # cannot say so (both gone with its request: `_unrequest`)
        self._queue_said: dict[str, bool] = {}
        self._queue_silent_since: dict[str, float] = {}
        # units asked for (replacements too) stopped for not joining within the bound → whether their site stopped
        # them yet (False: stopping, or its stop failed: it may join still). One is kept until it is lost (`replace`)
        # or, stopped before it joined, its request ends (`_unrequest`): no unit of it is left to tell
        self.abandoned: dict[str, bool] = {}
        # a unit asked for (a replacement's too) → since when its join bound counts: its start returned (`spawned`),
        # its scheduler's queue last seen holding it. One whose start has not returned (its site being staged) has none
        self.join_since: dict[str, float] = {}
        # the plan's units are told from units not joined yet by their names in `core.left` for the whole run
        # (`_planned_unjoined`: one of them let go was asked about, then replaced as a unit that never joined)
        core.left.pin(n for n in sites_by_agent(placement.plan) if n.startswith("rollout-"))
        self._init_layer()

    def _init_layer(self) -> None:
        """Each layer above this one (`healing.Healer`, `scaling.Scaler`) sets its own state here, after calling its
        base's, so that the layers share this constructor (its arguments declared and stored once)."""

    @property
    def scale_log(self) -> ScaleLog:
        """The scale events of this run, and of the job's history a resumed run continues."""
        return self._scale_log

    @scale_log.setter
    def scale_log(self, events: Iterable[dict[str, Any]]) -> None:
        """A resumed run's: the scale events of the job's history it continues (`ControllerAgent`), the latest listed
        and every one counted, versus all of them kept."""
        self._scale_log = ScaleLog(events)

    def _unrequest(self, name: str) -> float | None:
        """`name` is no unit asked for any more (it sampled, or its start failed): when it was asked for, and its join
        bound's start gone with it (it was kept for the rest of the run)."""
        self.join_since.pop(name, None)
        self._queue_said.pop(name, None)
        self._queue_silent_since.pop(name, None)
        if self.abandoned.get(name) and not self.core.known(name):
            del self.abandoned[name]
        if not name.startswith("rollout-") or name not in sites_by_agent(self.placement.plan):  # (a plan's: its
            self.never_joined.discard(name)  # slot stays free, `_planned_unjoined`)
        return self.spawn_requested.pop(name, None)

    def _unrequest_gone(self) -> None:
        """Units asked for that are gone for good with their request still open — retired by a drain (a scale-in
        drains the newest) or lost while draining, before their first sample; a lost one is `replace`d, which ends
        it — are no units asked for any more: their request, join bound and chain go, versus kept for the rest of the
        run and, once the core no longer keeps their names (`LeftBook`), asked for again (counted in each
        checkpoint's units, a slot held, stopped as units that never joined). A scan from `tick` of the units asked
        for and not sampled yet (a few), so that it runs after `_lose` called `replace` (which ends a lost unit's
        request itself: its failed start, its chain's failed attempt), versus a call from the core as a unit goes."""
        for name in [n for n in self.spawn_requested if n in self.core.left]:
            self._unrequest(name)
            self.unproven.pop(name, None)
            self._filling.pop(name, None)  # drained: the place it took is no loss to count (a scale-in's)

    def pending_units(self) -> list[str]:
        """Units asked for that have not joined yet."""
        return [n for n in self.spawn_requested if not self.core.known(n)]

    def awaits(self, name: str) -> bool:
        """Whether rollout unit `name` is one the job waits for: asked for, or the plan's, and not joined yet (its
        first hello may have been lost with its link: its next says `again`)."""
        return name in self.pending_units() or name in self._planned_unjoined()

    def _planned_unjoined(self) -> list[str]:
        """The plan's rollout units that have not joined (the launcher starts them), less those that exited."""
        return [
            n
            for n in sites_by_agent(self.placement.plan)
            if n.startswith("rollout-") and not self.core.known(n) and n not in self.never_joined
        ]

    def free_slots(self) -> dict[str, int]:
        """Rollout units each rollout site can still start for this job: beside its live units, those asked for and
        the plan's that have not joined yet (the launcher starts them: a scale before they joined took their slots),
        unless their site said they exited (`not_joining`)."""
        return self.placement.free_slots(self.slot_holders())

    def slot_holders(self) -> list[str]:
        """The units that hold a rollout slot (`free_slots`)."""
        return [u.name for u in self.core.units.values() if u.alive] + self.pending_units() + self._planned_unjoined()

    def _spawn(self, site: str, reason: str) -> str:
        """Start one rollout unit on `site` from a thread (SSH / sbatch may take seconds); its name."""
        spawner = self.spawner
        assert spawner is not None
        if self._next_replica is None:
            self._next_replica = spawner.first_free_replica()
        replica, self._next_replica = self._next_replica, self._next_replica + 1
        name = f"rollout-{replica}"
        self.placement.sites[name] = site
        self.spawn_requested[name] = self.clock()
        self._forget_sites()  # (this unit's kept: asked for)
        # it takes a given-up unit's place; not a replacement, nor a resume's (`_restore_units` counted the place in
        # what the site has: taking it too counted it out twice, and a second resume came back a unit short)
        if reason not in ("replace", "resume") and self._unfilled.get(site, 0) > 0:
            self._unfilled[site] -= 1
            self._filling[name] = site

        def run() -> None:
            try:
                spawner.add_rollout(site, replica)
                self.post(("spawned", name, (site, reason, None)))
            except RlctlError as e:
                self.post(("spawned", name, (site, reason, str(e))))

        threading.Thread(target=run, name=f"spawn-{name}", daemon=True).start()
        return name

    def _forget_sites(self) -> None:
        """The units started that are gone for good leave `placement.sites`, the oldest started first, beyond the
        latest `gone_sites_kept` (a run whose units come and go for weeks held the site of every unit it started): not
        one that runs or drains, is asked for, being stopped (it may join still) or a replacement not proven yet."""
        sites, planned = self.placement.sites, sites_by_agent(self.placement.plan)
        chains = {r.unit for r in self.replacing.values()} | set(self.unproven)
        needed = set(self.core.units) | set(self.spawn_requested) | set(self.abandoned) | chains
        gone = [n for n in sites if n not in planned and n not in needed]
        for name in gone[: max(0, len(gone) - self.gone_sites_kept)]:
            del sites[name]

    def spawned(self, name: str, info: tuple[str, str, str | None]) -> None:
        """The spawn thread of `name` finished: (site, reason, error or None)."""
        site, reason, error = info
        if error is not None:
            r = next((r for r in self.replacing.values() if r.unit == name), None)
            if r is not None:
                r.error = error  # tick() counts the failed attempt
            self._failed_start(name, error)
            self.jobdir.event("scale_failed", agent=name, site=site, reason=reason, error=error)
            log.warning("controller: could not add %s on %s: %s", name, site, error)
            return
        if name in self.spawn_requested:  # started: its join bound counts from here (`tick`); a replacement's not
            # before its attempt's start (the loop's clock)
            chain = next((r for r in self.replacing.values() if r.unit == name), None)
            self.join_since.setdefault(name, max(self.clock(), chain.started if chain is not None else 0.0))
        self._scale_event("out", name, site, reason)

    def sampled(self, name: str) -> None:
        """`name` produced a sample: if it is a unit asked for, record how long it took to be useful."""
        t0 = self._unrequest(name)
        if t0 is None:
            return
        self.unproven.pop(name, None)  # a replacement that stands
        if name not in self.abandoned:  # (one being stopped as it sampled is a failed start still: `unjoined_stopped`)
            self._filling.pop(name, None)  # it took the given-up place for good
        seconds = round(self.clock() - t0, 3)
        keep(self.first_sample_s, name, seconds, kept=self.starts_kept)
        self.jobdir.event("first_sample", agent=name, seconds_since_scale=seconds)
        self.rule.changed()  # from now on δ reflects the new unit count
        log.info("controller: %s produced its first sample %.1f s after it was asked for", name, seconds)

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
        self._scale_log.append(ev)
        self.jobdir.event("scale", **ev)
        self.metrics.scale_events.labels(direction, reason).inc()
        self.rule.changed()

    def _failed_start(self, name: str, why: str) -> None:
        """`name`, a unit asked for, did not start (`scale --wait` is told `why`); a given-up unit's place it was to
        take is open again (`unit_counts`)."""
        self._unrequest(name)
        keep(self.failed_starts, name, why, kept=self.starts_kept)
        site = self._filling.pop(name, None)
        if site is not None:
            self._unfilled[site] += 1

    def close(self) -> None:
        if self.spawner is not None:
            self.spawner.close()
