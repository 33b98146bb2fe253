"""Scaling the rollout side of a running job: where each agent runs and how many more units fit,
`rlctl scale ±N` requests, the rebalance rule's scale-out, starting units in the background, scale events.

    scale +N / rebalance adds one ──▶ free slots per rollout site ──▶ pick sites ──▶ spawn thread
         spawn thread: Spawner.add_rollout (SSH / sbatch: seconds) ──▶ post("spawned", name, error)
    "spawned" from the controller's inbox ──▶ spawned(): scale event "out" (or scale_failed)
    the new unit's first sample ──▶ sampled(): first_sample event; the rule measures afresh
    a unit lost ──▶ replace(): tick() starts one on its site (≤ REPLACE_ATTEMPTS, backoff) ──▶ unit_replaced
        a replacement lost before its first sample ──▶ replacement_lost: a failed attempt of the same chain
        (a unit that crashes as it starts is not replaced without end)
    `replaced` goes into each controller checkpoint; a resumed run continues it (restore())
    the units per site (unit_counts()) go into it too; a resumed run, once the plan's units joined, starts
         those the checkpoint's run had beyond them ──▶ scale event "out", reason "resume"
         and drains those beyond a site's count it had (a `scale −N`) ──▶ scale event "in", reason "resume"
    scale −N ──▶ core.drain(the newest units) ──▶ scale event "in" (the controller sends the drain)
    a unit expected UNJOINED_CHECK_S without joining (the plan's, or one asked for) ──▶ its site asked, in a thread,
         whether it still runs ──▶ post("not_joining") ──▶ not_joining(): one that exited holds no slot
         (`unit_exited_before_joining`); the plan's is replaced, one asked for is a failed start (`scale --wait`)
    a replacement not joined within `join_bound_s` though its site says it runs ──▶ stopped, in a thread
         ──▶ post("unjoined_stopped") ──▶ replacement_not_joined: a failed attempt of its chain (one log line)
    a unit asked for (`rlctl scale`, the rebalance rule, a resume) not joined within it ──▶ stopped the same way
         ──▶ scale_failed: a failed start (`scale --wait` told); its slot is free again
         (one that joined as it was stopped, and whose stop failed, runs in the job: no failure)

The controller owns the inbox and the sockets; this module only posts to the one and returns the
messages for the other, so every send still happens on the controller's main loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from rlctl.agents import migration
from rlctl.agents.core import ControllerCore
from rlctl.agents.coretypes import Out
from rlctl.agents.rebalance import Reading, RebalanceRule
from rlctl.agents.scalelog import ScaleLog
from rlctl.config.inventory import Site
from rlctl.config.pipeline import Rebalance
from rlctl.errors import RlctlError
from rlctl.launch.backends import read_sites
from rlctl.launch.jobdir import JobDir
from rlctl.launch.layout import rollout_tp
from rlctl.launch.spawn import Spawner
from rlctl.metrics import JobMetrics
from rlctl.textutil import did_you_mean

log = logging.getLogger(__name__)

V = TypeVar("V")
Post = Callable[[tuple[str, Any, Any]], None]  # the controller's inbox.put


REPLACE_ATTEMPTS = 3
REPLACE_BACKOFF_S = 5.0  # before the 2nd attempt; doubled before each next one
# a resumed run starts the units the checkpoint's run had beyond the plan once the plan's units joined, or after
# this long (the plan's units not joined by then still count as started: `_restore_units`)
RESTORE_WAIT_S = 120.0
# a unit expected this long that has not joined (the plan's since the controller started, one asked for since it
# was): its site is asked whether it still runs, at most this often (a unit queued in SLURM, or loading a large
# model, still runs and keeps its slot; one that exited frees it)
UNJOINED_CHECK_S = 60.0
# a replacement that has not joined this long though its site says it still runs (a load hung on a lock or a mount, a
# node that never comes up) holds its slot no longer: it is stopped and counted a failed attempt of its chain. The
# bound is JOIN_BOUND_FACTOR × the longest a unit of this run took to join (the job's load time as measured), at
# least JOIN_BOUND_MIN_S (a unit queued in SLURM, or loading a large model, joins well within it)
JOIN_BOUND_MIN_S = 1800.0
JOIN_BOUND_FACTOR = 4.0
# a unit whose site cannot say whether its scheduler still queues it (squeue failing, agents.jsonl unreadable) is
# taken as its site last said (queued when it never said) this long from when its site first could not say: then as
# started, so that its join bound runs (a unit that hung loading is not kept for good); as long as the shortest bound
SILENT_QUEUE_S = JOIN_BOUND_MIN_S
UNJOINED_STOP_GRACE_S = 10.0
# the latest units asked for whose first sample or failed start is kept (`first_sample_s`, `failed_starts`): what
# `rlctl scale --wait` reads of the units it added, every 0.5 s, from the status reply, long before this many more
# units asked for sampled or failed; a run whose units come and go for weeks keeps these, not one per unit it had
STARTS_KEPT = 1024
# the latest lost units given up on kept by name, with why (status `resilience`: every one counted, the note names the
# latest GAVE_UP_NAMED)
GAVE_UP_KEPT = 16
# the units gone for good (lost, drained, failed to start) whose site `placement.sites` still holds, the latest started:
# the controller lists a gone unit (status, its metrics row, its gauges removed by their site label) until the metrics
# row after it went (`ControllerAgent._prune`), long before this many more units started
GONE_SITES_KEPT = 1024
GAVE_UP_NAMED = 3


@dataclass
class Replacement:
    lost: str
    site: str
    due: float  # time.monotonic() of the next attempt
    attempts: int = 0
    unit: str | None = None  # the unit started for the current attempt
    started: float = 0.0  # when the current attempt began (its join bound counts from `Scaler.join_since`)
    error: str | None = None  # why the current attempt failed to start
    why: str | None = None  # why the last attempt failed (status)
    stopping: bool = False  # the current attempt's unit, not joined within the bound, is being stopped


@dataclass
class Placement:
    """Where the job's agents run: the launch plan, the sites' specs and agent name → site (the plan's, and the units
    the Scaler starts: those gone for good leave it, beyond the latest GONE_SITES_KEPT: `Scaler._forget_sites`)."""

    plan: dict[str, Any]
    site_specs: dict[str, Site]
    sites: dict[str, str]

    @classmethod
    def read(cls, jobdir: JobDir) -> Placement:
        plan = jobdir.read_json(jobdir.plan_json) if jobdir.plan_json.exists() else {}
        return cls(plan, read_sites(jobdir.path), _sites_by_agent(plan))

    @property
    def planned_units(self) -> int:
        return sum(int(g["units"]) for g in self.plan.get("rollout", [])) or 1

    @property
    def rollout_sites(self) -> list[str]:
        return [g["site"] for g in self.plan.get("rollout", [])]

    @property
    def dc_links(self) -> list[list[str]] | None:
        """The inter-datacenter links of the job's sites (pairs of datacenters), None when the plan names no
        links (a job written before links were recorded, or one datacenter): every pair counts as linked."""
        dcs = {n: s.datacenter for n, s in self.site_specs.items()}
        pairs = {
            frozenset((dcs[a], dcs[b]))
            for a, b in self.plan.get("links", [])
            if a in dcs and b in dcs and dcs[a] != dcs[b]
        }
        return sorted(sorted(p) for p in pairs) or None

    def decode_cost(self, agent: str) -> migration.Cost | None:
        """The planner's decode cost of the agent's site (plan.json's `planner.allocation`), None when the plan
        does not price it (a site the planner gave no rollout, a plan without a planner)."""
        site = self.sites.get(agent, "")
        rows = self.plan.get("planner", {}).get("allocation", [])
        row = next((a for a in rows if a.get("role") == "rollout" and a.get("site") == site), None)
        return migration.Cost.from_plan(row.get("decode")) if row is not None else None

    def datacenter(self, agent: str) -> str:
        site = self.site_specs.get(self.sites.get(agent, ""))
        return site.datacenter if site is not None else ""

    def free_slots(self, units: list[str]) -> dict[str, int]:
        """Rollout units each rollout site can still start next to `units` (live or pending) and the
        trainer: GPUs left / the site's tp per unit."""
        used = dict.fromkeys(self.site_specs, 0)
        trainer = self.plan.get("trainer", {})
        if trainer.get("site") in used:
            used[trainer["site"]] += int(trainer.get("ranks", 1))
        for site in (self.sites.get(n, "") for n in units):
            if site in used:
                used[site] += rollout_tp(self.plan, site)
        return {
            s: (self.site_specs[s].total_gpus - used[s]) // rollout_tp(self.plan, s)
            for s in self.rollout_sites
            if s in self.site_specs
        }


class Scaler:
    """The controller's scaling state: units asked for, the rebalance rule's last reading, scale events."""

    def __init__(
        self,
        jobdir: JobDir,
        cfg: Rebalance,
        *,
        core: ControllerCore,
        placement: Placement,
        metrics: JobMetrics,
        post: Post,
    ) -> None:
        self.jobdir, self.cfg, self.core, self.placement = jobdir, cfg, core, placement
        self.metrics, self.post = metrics, post
        specs = placement.site_specs
        self.spawner = Spawner(jobdir, specs, job=jobdir.id) if specs else None
        self.rule = RebalanceRule(cfg)
        self.reading: Reading | None = None
        self.spawn_requested: dict[str, float] = {}  # agent → when its start was asked for
        # unit asked for → seconds from the request to its first sample; one whose start failed → the error (`scale
        # --wait`): the latest `starts_kept` of each (`_keep`)
        self.first_sample_s: dict[str, float] = {}
        self.failed_starts: dict[str, str] = {}
        self.starts_kept = STARTS_KEPT
        self.gone_sites_kept = GONE_SITES_KEPT
        self._scale_log = ScaleLog()  # the latest listed, every one counted
        self._next_replica: int | None = None
        self.replacing: dict[str, Replacement] = {}  # lost unit → its replacement's progress
        # replacements that joined, over every run of the job (restore()), less those lost before their first sample
        self.replaced = 0
        self.unproven: dict[str, Replacement] = {}  # a replacement that joined → its chain, until its first sample
        # lost units not replaced after every attempt: counted, the latest `gave_up_kept` kept by name (and why their
        # last attempt failed, `gave_up_why`)
        self.gave_up: list[str] = []
        self.gave_up_total = 0
        self.gave_up_kept = GAVE_UP_KEPT
        # site → units given up on there whose place no unit asked for since took (`unit_counts`), and the unit asked
        # for → the site whose given-up place it takes (given back if its start fails; kept until it stands or is lost)
        self._unfilled: dict[str, int] = {}
        self._filling: dict[str, str] = {}
        # a resumed run: the units per site its checkpoint's run had, to start again (restore()), and since when
        self.restoring: dict[str, int] | None = None
        self.restored_at = 0.0
        self.gave_up_why: dict[str, str] = {}
        self.t0 = time.monotonic()  # the plan's units are expected from here
        # units that exited before they joined: they hold no slot. A unit asked for leaves it with its request
        # (`_unrequest`), so that a run whose units come and go for weeks holds the plan's and those asked for now
        self.never_joined: set[str] = set()
        self._unjoined_at = -UNJOINED_CHECK_S  # when the sites were last asked about units not joined
        self._asking = False  # a thread asks them now
        # unit asked for → whether its scheduler last said it queues it (`_still_queued`), and since when its site
        # cannot say so (both gone with its request: `_unrequest`)
        self._queue_said: dict[str, bool] = {}
        self._queue_silent_since: dict[str, float] = {}
        # the longest a unit of this run took to join (the plan's from t0; a replacement's from its attempt's start):
        # what `join_bound_s` measures the job's load time by; the plan's units already measured
        self.join_max_s = 0.0
        self._timed: set[str] = set()
        # units asked for (replacements too) stopped for not joining within the bound → whether their site stopped
        # them yet (False: stopping, or its stop failed: it may join still). One is kept until it is lost (`replace`)
        # or, stopped before it joined, its request ends (`_unrequest`): no unit of it is left to tell
        self.abandoned: dict[str, bool] = {}
        # a unit asked for (a replacement's too) → since when its join bound counts: its start returned (`spawned`),
        # its scheduler's queue last seen holding it. One whose start has not returned (its site being staged) has none
        self.join_since: dict[str, float] = {}

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
        if not name.startswith("rollout-") or name not in _sites_by_agent(self.placement.plan):  # (a plan's: its
            self.never_joined.discard(name)  # slot stays free, `_planned_unjoined`)
        return self.spawn_requested.pop(name, None)

    def pending_units(self) -> list[str]:
        """Units asked for that have not joined yet."""
        return [n for n in self.spawn_requested if not self.core.known(n)]

    def _planned_unjoined(self) -> list[str]:
        """The plan's rollout units that have not joined (the launcher starts them), less those that exited."""
        return [
            n
            for n in _sites_by_agent(self.placement.plan)
            if n.startswith("rollout-") and not self.core.known(n) and n not in self.never_joined
        ]

    def free_slots(self) -> dict[str, int]:
        """Rollout units each rollout site can still start for this job: beside its live units, those asked for and
        the plan's that have not joined yet (the launcher starts them: a scale before they joined took their slots),
        unless their site said they exited (`not_joining`)."""
        return self.placement.free_slots(
            [u.name for u in self.core.units.values() if u.alive] + self.pending_units() + self._planned_unjoined()
        )

    def _ask_unjoined(self, now: float) -> None:
        """Units expected for UNJOINED_CHECK_S that have not joined: their sites are asked in a thread (an SSH or
        squeue call takes seconds) whether each still runs, at most every UNJOINED_CHECK_S; the answer comes back
        through the inbox (`not_joining`). A replacement too, from its attempt's start: one still loading its model
        or queued holds its slot (a fixed deadline counted it failed and started another beside it, on its GPUs)."""
        spawner = self.spawner
        if spawner is None or self._asking or now - self._unjoined_at < UNJOINED_CHECK_S:
            return
        chains = {r.unit: r.started for r in self.replacing.values() if r.unit is not None and r.error is None}
        expected = (
            {n: self.t0 for n in self._planned_unjoined()}
            | {n: self.spawn_requested[n] for n in self.pending_units()}
            | {n: since for n, since in chains.items() if not self.core.known(n)}
        )
        names = sorted(n for n, since in expected.items() if now - since >= UNJOINED_CHECK_S)
        if not names:
            return
        self._unjoined_at, self._asking = now, True

        asked = set(self.pending_units())

        def run() -> None:
            try:
                gone = spawner.exited(names)
            except Exception as e:  # noqa: BLE001 - asked again later: the inbox's answer resets `_asking` (a
                # thread that ended unanswered, on a damaged agents.jsonl or a site's odd answer, left it set for good)
                log.warning("controller: cannot tell whether %s still run: %s", ", ".join(names), e)
                gone = []
            # a unit asked for (a replacement too) its scheduler still queues: its join bound counts from when it leaves
            # the queue. Never raises (None: its site cannot say), so those said gone are handled whatever it answers
            queued = spawner.queued([n for n in names if (n in chains or n in asked) and n not in gone])
            self.post(("not_joining", "", (gone, queued)))

        threading.Thread(target=run, name="ask-unjoined", daemon=True).start()

    def not_joining(self, gone: list[str], *, now: float, queued: Mapping[str, bool | None] | None = None) -> None:
        """Units whose sites said they exited before they joined: they hold no slot; the plan's is replaced (as a
        unit lost), a replacement's is a failed attempt of its chain, one asked for (`rlctl scale`, the rebalance
        rule, a resume) is a failed start. A unit asked for (a replacement too) its scheduler still queues (`queued`:
        unit → True, False, None where its site cannot say; `_still_queued`) is not loading yet: its join bound (a
        replacement's attempt's clock too) starts again, so a busy cluster's queue does not count against it."""
        self._asking = False
        for name, said in (queued or {}).items():
            # (one no longer asked for, its request ended as its sites were asked, keeps nothing: `_unrequest`)
            if name in self.spawn_requested and self._still_queued(name, said, now) and name not in self.core.units:
                self.join_since[name] = now
                for r in self.replacing.values():
                    if r.unit == name and not r.stopping:
                        r.started = now
        planned = set(self._planned_unjoined())
        for name in gone:
            # one that joined meanwhile (its loss is core's), or whose start failed meanwhile (`spawned` said so)
            if (
                self.core.known(name)
                or name in self.never_joined
                or name in self.abandoned  # stopped for not joining: `unjoined_stopped` counts it, saying why
                or not (name in planned or name in self.spawn_requested)
            ):
                continue
            self.never_joined.add(name)
            site = self.placement.sites.get(name)
            self.jobdir.event("unit_exited_before_joining", agent=name, site=site)
            log.warning("controller: %s (site %s) exited before it joined (its log says why)", name, site)
            chain = next((r for r in self.replacing.values() if r.unit == name and r.error is None), None)
            if chain is not None:  # `tick` counts it: back off and try again, or give up
                chain.error = "exited before it joined (its log says why)"
            elif name in self.spawn_requested:
                self._failed_start(name, "exited before it joined (its log says why)")
            else:
                self.replace(name, now=now)

    def _still_queued(self, name: str, said: bool | None, now: float) -> bool:
        """Whether `name` waits in its scheduler's queue, its site having said `said` now: one whose site cannot say
        (None) is as its site last said, queued when it never said, for SILENT_QUEUE_S from when its site first could
        not say (its join bound waits), and then started, said once (`queue_unanswered`), so its bound runs. One
        layer, versus a spawner's and this scaler's each bounding its own silence (a silent site's unit kept queued
        up to twice as long; or, never said queued, not waited for at all when asking the sites raised)."""
        if said is not None:
            self._queue_silent_since.pop(name, None)
            self._queue_said[name] = said
            return said
        silent_s = now - self._queue_silent_since.setdefault(name, now)
        if silent_s <= SILENT_QUEUE_S:
            return self._queue_said.get(name, True)
        if self._queue_said.get(name, True):  # said once
            self._queue_said[name] = False
            site = self.placement.sites.get(name)
            log.warning("controller: site %s has not said whether %s is queued for %.0f s: taken as started, its join "
                        "bound runs", site, name, silent_s)  # fmt: skip
            self.jobdir.event("queue_unanswered", agent=name, site=site, silent_s=round(silent_s))
        return False

    # -- requests -----------------------------------------------------------------------------------
    def scale(self, delta: int, site: str | None, *, reason: str) -> tuple[dict[str, Any], list[Out]]:
        """Add (delta > 0: started in the background) or drain and remove (delta < 0) rollout units;
        the reply and the drain messages to send."""
        rollout_sites = self.placement.rollout_sites
        if site is not None and site not in rollout_sites:
            known = f"{', '.join(rollout_sites)}{did_you_mean(site, rollout_sites)}"
            return {"error": f"site {site!r} runs no rollout units of this job; rollout sites: {known}"}, []
        if delta > 0:
            return self._add(delta, site, reason=reason), []
        return self._remove(-delta, site, reason=reason)

    def _add(self, n: int, site: str | None, *, reason: str, partial: bool = False) -> dict[str, Any]:
        """Start `n` rollout units (on `site`, else the rollout sites in order): {"adding": names, "sites": sites},
        or {"error": why} and none started when fewer fit; `partial`: start those that fit, and say why the others
        did not ("error" beside "adding")."""
        if self.spawner is None:
            return {"error": "this controller has no launch backends (no sites.json in the job directory)"}
        rollout_sites = self.placement.rollout_sites
        free = self.free_slots()
        cap = self.cfg.max_rollout_units
        room = None if cap is None else cap - len(self.core.live_units) - len(self.pending_units())
        targets: list[str] = []
        candidates = [site] if site is not None else rollout_sites
        for _ in range(n):
            pick = next((s for s in candidates if free.get(s, 0) > 0), None)
            if pick is None or (room is not None and room <= 0):
                break
            free[pick] -= 1
            room = None if room is None else room - 1
            targets.append(pick)
        short: dict[str, Any] = {}
        if len(targets) < n:
            if room is not None and room <= 0:  # the cap, whatever the slots
                units = len(self.core.live_units) + len(self.pending_units()) + len(targets)
                short = {"error": f"only {len(targets)} of {n} units fit: {self._cap_reached(units)}"}
            else:
                where = site or ", ".join(rollout_sites)
                slots = ", ".join(f"{s} {k}" for s, k in self.free_slots().items() if s in candidates)
                short = {"error": f"only {len(targets)} of {n} units fit on {where}: free slots {slots or 'none'}"}
            if not partial:
                return short
        names = [self._spawn(t, reason) for t in targets]
        return {"adding": names, "sites": targets, **short}

    def _cap_reached(self, units: int) -> str | None:
        """Why the job's cap (`rebalance.max_rollout_units`, which `rlctl scale` obeys too) allows no unit beyond
        `units` (live and starting), None while it allows one."""
        cap = self.cfg.max_rollout_units
        if cap is None or units < cap:
            return None
        return f"rebalance.max_rollout_units is {cap} and the job has {units} unit(s), live and starting"

    def _remove(self, n: int, site: str | None, *, reason: str) -> tuple[dict[str, Any], list[Out]]:
        sites = self.placement.sites
        units = [u for u in self.core.live_units if site is None or sites.get(u.name) == site]
        total, here = len(self.core.live_units), len(units)
        most = min(here, total - 1)  # at least one unit stays in the job
        if n > most:  # one line: what the job (and the site) runs, and how many may go
            on, there = (f" on {site}", f", {here} on {site}") if site else ("", "")
            valid = f"at most {most} can be removed" if most > 0 else "none can be removed"
            # the site's count holds it back when another site keeps a unit (the floor then cannot bind)
            why = " there" if here < total else " (at least one unit must stay in the job)"
            runs = f"the job runs {total} in dispatch{there}"
            return {"error": f"cannot remove {n} rollout unit(s){on}: {runs}; {valid}{why}"}, []
        victims = sorted(units, key=lambda u: _ordinal(u.name), reverse=True)[:n]  # the newest first
        outs: list[Out] = []
        for u in victims:
            outs += self.core.drain(u.name)
            self._scale_event("in", u.name, sites.get(u.name, ""), reason)
        return {"removing": [u.name for u in victims]}, outs

    def rebalance(self, row: dict[str, Any], *, stopping: bool = False) -> None:
        """StreamRL §4.2 after each trained iteration: δ ≥ δ' and a free slot → one more rollout unit
        (see rebalance.py: at η > 0 it reads the period and the trainer's wait, else the stage times). Adds
        the rule's reading to the iteration's metrics `row`. `stopping`: the job stops, no unit is started."""
        units = len(self.core.live_units) + len(self.pending_units())
        free = self.free_slots() if self.spawner is not None else {}
        blocked = "the job is stopping" if stopping else self._cap_reached(units)
        if blocked is None and not any(n > 0 for n in free.values()):
            blocked = "no free GPU slot on a rollout site"
        if self.core.cfg.eta > 0:  # async: iterations overlap, δ is the trainer's wait (rebalance.py)
            t_gen, t_train = row["period_s"], row["period_s"] - row["trainer_wait_s"]
        else:
            t_gen, t_train = row["t_gen_s"], row["t_train_s"]
        r = self.rule.observe(
            row["iteration"],
            t_gen_s=t_gen,
            t_train_s=t_train,
            units=units,
            blocked=blocked,
            evaluating=bool(row.get("evaluating")),
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
            out = self._add(1, None, reason="rebalance")
            if "error" in out:
                self.jobdir.event("scale_failed", reason="rebalance", error=out["error"])

    # -- self-healing -------------------------------------------------------------------------------
    def replace(self, lost: str, *, now: float) -> None:
        """A rollout unit stopped heartbeating (its in-flight samples are already requeued): start another on
        its site, up to REPLACE_ATTEMPTS times with backoff; `tick` does the work. A replacement lost before its
        first sample is a failed attempt of the chain that started it, not a new loss: a unit that crashes right
        after joining (a bad setting, a broken node) is restarted REPLACE_ATTEMPTS times, not without end."""
        if self.abandoned.pop(lost, None) is not None:  # stopped for not joining in time (it joined as it was
            return  # stopped): counted already
        self._filling.pop(lost, None)  # the place is its replacement's now (`unit_counts`), or given back if that fails
        if self._unrequest(lost) is not None:  # asked for (a scale, the rule): `scale --wait` is told
            why = "lost before its first sample (its log says why); a replacement is started"
            _keep(self.failed_starts, lost, why, kept=self.starts_kept)
        chain = self.unproven.pop(lost, None)
        if chain is not None:
            self.replaced -= 1  # it did not stand
            self.replacing[chain.lost] = chain
            why = f"{lost} was lost before its first sample"
            self.jobdir.event(
                "replacement_lost", lost=chain.lost, by=lost, site=chain.site, attempts=chain.attempts, error=why
            )
            self._failed(chain, why, now)
            return
        site = self.placement.sites.get(lost)
        if self.spawner is None or site is None or lost in self.replacing:
            return
        self.replacing[lost] = Replacement(lost, site, due=now)

    def tick(self, now: float) -> list[Out]:
        """From the controller's loop: start replacements that are due; count a replacement that failed to
        start or exited before it joined (`not_joining`) as a failed attempt (then back off, or give up), and stop one
        not joined within `join_bound_s` (`unjoined_stopped` counts it); in a resumed run, start again the units its
        checkpoint's run had beyond the plan, and drain those beyond the ones it had (`restore`). The drain messages
        to send."""
        outs = self._restore_units(now) if self.restoring is not None else []
        for name in _sites_by_agent(self.placement.plan):
            if name.startswith("rollout-") and name not in self._timed and self.core.known(name):
                self._timed.add(name)
                self.join_max_s = max(self.join_max_s, now - self.t0)
        self._ask_unjoined(now)
        for r in list(self.replacing.values()):
            if r.error is not None:
                self._failed(r, r.error, now)
            elif r.stopping:
                continue
            elif r.unit is not None and self.core.known(r.unit):
                self.join_max_s = max(self.join_max_s, now - r.started)
                self.replaced += 1
                self.jobdir.event("unit_replaced", lost=r.lost, by=r.unit, site=r.site, attempts=r.attempts)
                del self.replacing[r.lost]
                if r.unit in self.spawn_requested:  # no sample yet (sampled() drops it at the first)
                    self.unproven[r.unit] = r
            elif r.unit is None and now >= r.due and self.free_slots().get(r.site, 0) > 0:
                r.attempts += 1
                r.started = now
                r.unit = self._spawn(r.site, "replace")
        chains = {r.unit: r for r in self.replacing.values() if r.unit is not None}
        for name in self.pending_units():  # asked for (a scale, the rule, a resume, a replacement), its site saying it
            # runs; not one whose start has not returned (no `join_since`: a site staged first, the model copied, is
            # no unit that hangs — stopping it stopped nothing, not recorded yet, and it started after its failed
            # start or attempt was counted), nor one being stopped
            since = self.join_since.get(name)
            if since is None or name in self.abandoned or now - since < self.join_bound_s():
                continue
            if name in chains:  # `unjoined_stopped` counts its failed attempt
                chains[name].stopping = True
            self._stop_unjoined_unit(name)
        return outs

    def join_bound_s(self) -> float:
        """How long a replacement may take to join: JOIN_BOUND_FACTOR × the longest a unit of this run took, at
        least JOIN_BOUND_MIN_S."""
        return max(JOIN_BOUND_MIN_S, JOIN_BOUND_FACTOR * self.join_max_s)

    def _stop_unjoined_unit(self, name: str) -> None:
        """Stop `name` (a replacement, or a unit a scale or the rebalance rule asked for), not joined within the bound
        though its site says it runs, in a thread (an SSH or scancel call takes seconds); `unjoined_stopped` counts
        the failed attempt or start once it is stopped (its slot held until then)."""
        spawner = self.spawner
        assert spawner is not None
        self.abandoned[name] = False
        why = f"{name} did not join within {self.join_bound_s():.0f} s though its site said it ran (its log says why)"

        def run() -> None:
            try:
                spawner.stop(name, grace_s=UNJOINED_STOP_GRACE_S)
                result = (why + "; stopped", True)
            except Exception as e:  # noqa: BLE001 - the attempt or start failed either way; its slot may stay taken
                result = (f"{why}; stopping it failed: {e}", False)
            self.post(("unjoined_stopped", name, result))

        threading.Thread(target=run, name=f"stop-{name}", daemon=True).start()

    def unjoined_stopped(self, name: str, result: tuple[str, bool]) -> None:
        """The thread that stopped `name` (a replacement, or a unit asked for, not joined within the bound) finished,
        saying why and whether its site stopped it: a failed attempt of its chain (`tick` backs off, or gives up), or
        a failed start (`scale --wait` is told). One that joined as it was stopped, and that its site could not stop,
        runs in the job: it joined (a replacement counts replaced), versus a failed start said of a running unit."""
        why, stopped = result
        if name in self.abandoned:
            self.abandoned[name] = stopped
        chain = next((r for r in self.replacing.values() if r.unit == name and r.stopping), None)
        if not stopped and self.core.known(name):
            self.abandoned.pop(name, None)  # a unit of the job's like any other: replaced if lost
            if chain is not None:
                chain.stopping = False  # `tick` counts it replaced
            log.warning("controller: %s joined as it was stopped for not joining, and stays: %s", name, why)
            return
        if chain is not None:  # (its one log line is `_failed`'s)
            self.jobdir.event(
                "replacement_not_joined", lost=chain.lost, by=name, site=chain.site, attempts=chain.attempts, error=why
            )
            chain.error = why
        else:  # a unit asked for (`_stop_unjoined_unit` stops no other): a failed start, also when it joined, and
            # maybe produced its first sample (`sampled` dropped its request then), as it was being stopped — said so
            self._unrequest(name)
            if self.core.known(name):
                why += " (it joined as it was being stopped)"
                self.first_sample_s.pop(name, None)  # (`scale --wait` reads the failed start, not a unit that stands)
            self._failed_start(name, why)
            site = self.placement.sites.get(name)
            self.jobdir.event("scale_failed", agent=name, site=site, error=why)
            log.warning("controller: %s on %s: %s", name, site, why)

    def _failed_start(self, name: str, why: str) -> None:
        """`name`, a unit asked for, did not start (`scale --wait` is told `why`); a given-up unit's place it was to
        take is open again (`unit_counts`)."""
        self._unrequest(name)
        _keep(self.failed_starts, name, why, kept=self.starts_kept)
        site = self._filling.pop(name, None)
        if site is not None:
            self._unfilled[site] += 1

    def _failed(self, r: Replacement, why: str, now: float) -> None:
        self._unrequest(r.unit or "")
        r.why, r.stopping = why, False
        if r.attempts >= REPLACE_ATTEMPTS:
            del self.replacing[r.lost]
            self.gave_up_total += 1
            self.gave_up = [*self.gave_up, r.lost][-self.gave_up_kept :]
            self._unfilled[r.site] = self._unfilled.get(r.site, 0) + 1
            _keep(self.gave_up_why, r.lost, why, kept=self.gave_up_kept)
            self.jobdir.event("replace_gave_up", lost=r.lost, site=r.site, attempts=r.attempts, error=why)
            log.warning("controller: gave up replacing %s on %s after %d attempts: %s", r.lost, r.site, r.attempts, why)
            return
        r.unit, r.error, r.due = None, None, now + REPLACE_BACKOFF_S * 2 ** (r.attempts - 1)
        log.warning("controller: replacing %s failed (%s); next attempt in %.0f s", r.lost, why, r.due - now)

    def restore(self, *, replaced: int, units: dict[str, int] | None = None, now: float | None = None) -> None:
        """A resumed run: the count of replaced units its checkpoint holds (status `resilience.replaced`
        continues from it), and its rollout units per site (`unit_counts`; None in a checkpoint written before
        they were kept): those beyond the plan's, which `rlctl scale` or the rebalance rule added, are started
        again once the plan's units joined (`tick`); a site that had fewer than the plan's (`scale -N`) gets that
        count back then, its newest units drained (the launcher starts every planned unit)."""
        self.replaced = replaced
        self.restoring = units
        self.restored_at = time.monotonic() if now is None else now

    def unit_counts(self) -> dict[str, int]:
        """Rollout units per rollout site that the job runs, is starting or is replacing, or gave up replacing (those
        draining left out): what each checkpoint keeps, for a resumed run to start the same (`restore`)."""
        counts = dict.fromkeys(self.placement.rollout_sites, 0)
        names = [u.name for u in self.core.units.values() if u.alive and not u.draining] + self.pending_units()
        sites = [self.placement.sites.get(n) for n in names]
        sites += [r.site for r in self.replacing.values() if r.unit is None]  # (its start counts, once asked)
        for site in sites:
            if site is not None:
                counts[site] = counts.get(site, 0) + 1
        # a unit given up on is a loss, not a scale-in: a resume that counted it out drained a healthy unit; but not
        # one whose place a unit asked for since took (a resume brought one more unit than the job had)
        for site, n in self._unfilled.items():
            counts[site] = counts.get(site, 0) + n
        return counts

    def _restore_units(self, now: float) -> list[Out]:
        """Start the units the checkpoint's run had beyond this run's on each site, as a scale-out (reason
        "resume"), once the plan's units joined (or RESTORE_WAIT_S went by): those that fit; those that do not are
        said (`scale_failed`), and the run goes on with those it has. A site the checkpoint's run had scaled in
        (`scale -N`: deliberate) is scaled in again, as a scale-in (reason "resume"); before, it came back with the
        plan's count, unsaid. The drain messages to send."""
        if self.core.num_joined < self.placement.planned_units and now - self.restored_at < RESTORE_WAIT_S:
            return []
        want, self.restoring = self.restoring or {}, None
        outs: list[Out] = []
        have = self.unit_counts()
        planned: dict[str, int] = {}
        for g in self.placement.plan.get("rollout", []):
            planned[g["site"]] = planned.get(g["site"], 0) + int(g["units"])
        for site, n in sorted(want.items()):
            # the launcher starts every planned unit (one lost is replaced, and counted): past RESTORE_WAIT_S those
            # not joined yet (queued in SLURM, loading a large model) are still the plan's, not missing
            missing = n - max(have.get(site, 0), planned.get(site, 0))
            if missing < 0 and site in self.placement.rollout_sites:
                outs += self._restore_scale_in(site, n)
            if missing <= 0 or site not in self.placement.rollout_sites:
                continue
            out = self._add(missing, site, reason="resume", partial=True)  # those that fit, not none
            if out.get("adding"):
                log.info("controller: starting %s on %s again: the resumed checkpoint's run had %d unit(s) there",
                         ", ".join(out["adding"]), site, n)  # fmt: skip
            if "error" in out:
                left = missing - len(out.get("adding", []))
                self.jobdir.event("scale_failed", reason="resume", site=site, units=left, error=out["error"])
                log.warning("controller: could not start again %d of the %d unit(s) on %s the run had: %s", left,
                            missing, site, out["error"])  # fmt: skip
        return outs

    def _restore_scale_in(self, site: str, n: int) -> list[Out]:
        """Drain the units of `site` beyond the `n` the checkpoint's run had there (its live ones: one not joined yet
        is the plan's, and stays); the drain messages."""
        live = [u for u in self.core.live_units if self.placement.sites.get(u.name) == site]
        extra = min(len(live), len(live) + len(self._planned_unjoined_on(site)) - n)
        if extra <= 0:
            return []
        reply, outs = self._remove(extra, site, reason="resume")
        if "error" in reply:
            self.jobdir.event("scale_failed", reason="resume", site=site, units=-extra, error=reply["error"])
            log.warning("controller: could not scale %s in again to the %d unit(s) the run had: %s", site, n,
                        reply["error"])  # fmt: skip
        else:
            log.info("controller: draining %s on %s again: the resumed checkpoint's run had %d unit(s) there",
                     ", ".join(reply["removing"]), site, n)  # fmt: skip
        return outs

    def _planned_unjoined_on(self, site: str) -> list[str]:
        return [n for n in self._planned_unjoined() if self.placement.sites.get(n) == site]

    def resilience(self) -> dict[str, Any]:
        """For status: replacements done, under way, given up (the latest by name, and counted), and what that means
        for the job: a note of one line, however many units the job gave up on (it named every one, with why)."""
        note = None
        if self.gave_up:
            n, latest = self.gave_up_total, self.gave_up[-GAVE_UP_NAMED:]
            last = latest[-1]
            note = (
                f"running with fewer rollout units: {n} unit{'s' if n != 1 else ''} given up on (latest: "
                f"{', '.join(latest)}); {last}'s last attempt: {self.gave_up_why[last]}"
            )
        elif self.replacing:
            note = "replacing " + ", ".join(
                f"{n} (last attempt: {r.why})" if r.why else n for n, r in self.replacing.items()
            )
        return {
            "replaced": self.replaced,
            "replacing": sorted(self.replacing),
            "gave_up": self.gave_up,
            "gave_up_total": self.gave_up_total,
            "note": note,
        }

    # -- units starting -----------------------------------------------------------------------------
    def _spawn(self, site: str, reason: str) -> str:
        """Start one rollout unit on `site` from a thread (SSH / sbatch may take seconds); its name."""
        spawner = self.spawner
        assert spawner is not None
        if self._next_replica is None:
            self._next_replica = spawner.first_free_replica()
        replica, self._next_replica = self._next_replica, self._next_replica + 1
        name = f"rollout-{replica}"
        self.placement.sites[name] = site
        self.spawn_requested[name] = time.monotonic()
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
        sites, planned = self.placement.sites, _sites_by_agent(self.placement.plan)
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
            self.join_since.setdefault(name, max(time.monotonic(), chain.started if chain is not None else 0.0))
        self._scale_event("out", name, site, reason)

    def sampled(self, name: str) -> None:
        """`name` produced a sample: if it is a unit asked for, record how long it took to be useful."""
        t0 = self._unrequest(name)
        if t0 is None:
            return
        self.unproven.pop(name, None)  # a replacement that stands
        if name not in self.abandoned:  # (one being stopped as it sampled is a failed start still: `unjoined_stopped`)
            self._filling.pop(name, None)  # it took the given-up place for good
        seconds = round(time.monotonic() - t0, 3)
        _keep(self.first_sample_s, name, seconds, kept=self.starts_kept)
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

    def close(self) -> None:
        if self.spawner is not None:
            self.spawner.close()


def _keep(latest: dict[str, V], name: str, value: V, *, kept: int) -> None:
    """`latest[name] = value`, the newest, and the oldest entries dropped beyond `kept`."""
    latest.pop(name, None)
    latest[name] = value
    while len(latest) > kept:
        del latest[next(iter(latest))]


def _sites_by_agent(plan: dict[str, Any]) -> dict[str, str]:
    """Agent name → site, in the order the launcher starts them (see rlctl.ops.runstart.RunStart.start)."""
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


def _ordinal(name: str) -> tuple[int, str]:
    """A unit's place in the order units were started (`rollout-N`); a name of another form (a unit started by
    hand) sorts before them, by name."""
    _, _, n = name.rpartition("-")
    return (int(n), name) if n.isdigit() else (-1, name)
