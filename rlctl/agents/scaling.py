"""Scaling the rollout side of a running job: `rlctl scale ±N` requests, the rebalance rule's scale-out, and a
resumed run's units started (or drained) again. The Scaler's top layer, on `healing.Healer` (lost units replaced)
and `unitstarts.UnitStarts` (units starting in the background, scale events); where each agent runs and how many more
units fit is `placement.Placement`.

    scale +N / rebalance adds one ──▶ free slots per rollout site ──▶ pick sites ──▶ spawn thread (`unitstarts`)
    `replaced` goes into each controller checkpoint; a resumed run continues it (restore())
    the units per site (unit_counts()) go into it too; a resumed run, once the plan's units joined, starts
         those the checkpoint's run had beyond them ──▶ scale event "out", reason "resume"
         and drains those beyond a site's count it had (a `scale −N`) ──▶ scale event "in", reason "resume"
    scale −N ──▶ core.drain(the newest units) ──▶ scale event "in" (the controller sends the drain)

The controller owns the inbox and the sockets; this module only posts to the one and returns the
messages for the other, so every send still happens on the controller's main loop.
"""

from __future__ import annotations

import logging
from typing import Any

from rlctl.agents.coretypes import Out
from rlctl.agents.healing import Healer
from rlctl.textutil import did_you_mean

log = logging.getLogger(__name__)


# a resumed run starts the units the checkpoint's run had beyond the plan once the plan's units joined, or after
# this long (the plan's units not joined by then still count as started: `_restore_units`)
RESTORE_WAIT_S = 120.0


class Scaler(Healer):
    """The controller's scaling state: units asked for, the rebalance rule's last reading, scale events."""

    def _init_layer(self) -> None:
        super()._init_layer()
        # a resumed run: the units per site its checkpoint's run had, to start again (restore()), and since when
        self.restoring: dict[str, int] | None = None
        self.restored_at = 0.0

    def tick(self, now: float) -> list[Out]:
        """From the controller's loop: start replacements that are due; count a replacement that failed to
        start or exited before it joined (`not_joining`) as a failed attempt (then back off, or give up), and stop one
        not joined within `join_bound_s` (`unjoined_stopped` counts it); in a resumed run, start again the units its
        checkpoint's run had beyond the plan, and drain those beyond the ones it had (`restore`). The drain messages
        to send."""
        self._unrequest_gone()
        outs = self._restore_units(now) if self.restoring is not None else []
        self.heal(now)
        return outs

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
                said = f"only {len(targets)} of {n} units fit on {where}: free slots {slots or 'none'}"
                short = {"error": "; ".join([said, *self._held_whole(candidates)])}
            if not partial:
                return short
        names = [self._spawn(t, reason) for t in targets]
        return {"adding": names, "sites": targets, **short}

    def _held_whole(self, sites: list[str]) -> list[str]:
        """Of `sites`, those whose nodes, each SLURM job of the job's taking its own whole (an exclusive SLURM site),
        hold fewer units than its GPUs: why, one each (`Placement.whole_nodes_said`)."""
        holders = self.slot_holders()
        gpus, whole = self.placement.free_slots(holders, whole=False), self.placement.free_slots(holders)
        return [
            self.placement.whole_nodes_said(s, holders, room=whole.get(s, 0))
            for s in sites
            if whole.get(s, 0) < gpus.get(s, 0)
        ]

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

    def restore(self, *, replaced: int, units: dict[str, int] | None = None, now: float | None = None) -> None:
        """A resumed run: the count of replaced units its checkpoint holds (status `resilience.replaced`
        continues from it), and its rollout units per site (`unit_counts`; None in a checkpoint written before
        they were kept): those beyond the plan's, which `rlctl scale` or the rebalance rule added, are started
        again once the plan's units joined (`tick`); a site that had fewer than the plan's (`scale -N`) gets that
        count back then, its newest units drained (the launcher starts every planned unit)."""
        self.replaced = replaced
        self.restoring = units
        self.restored_at = self.clock() if now is None else now

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


def _ordinal(name: str) -> tuple[int, str]:
    """A unit's place in the order units were started (`rollout-N`); a name of another form (a unit started by
    hand) sorts before them, by name."""
    _, _, n = name.rpartition("-")
    return (int(n), name) if n.isdigit() else (-1, name)
