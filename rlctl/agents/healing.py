"""Self-healing of the rollout side: a lost unit replaced on its site (bounded attempts, backoff), the units not
joined asked after (their sites say whether they still run or queue), and a replacement or a unit asked for that does
not join within the job's join bound stopped. The Scaler's second layer, on `unitstarts.UnitStarts`.

    a unit lost ──▶ replace(): heal() starts one on its site (≤ REPLACE_ATTEMPTS, backoff) ──▶ unit_replaced
        a replacement lost before its first sample ──▶ replacement_lost: a failed attempt of the same chain
        (a unit that crashes as it starts is not replaced without end)
    a unit expected UNJOINED_CHECK_S without joining (the plan's, or one asked for) ──▶ its site asked, in a thread,
         whether it still runs ──▶ post("not_joining") ──▶ not_joining(): one that exited holds no slot
         (`unit_exited_before_joining`); the plan's is replaced, one asked for is a failed start (`scale --wait`)
    a replacement not joined within `join_bound_s` though its site says it runs ──▶ stopped, in a thread
         ──▶ post("unjoined_stopped") ──▶ replacement_not_joined: a failed attempt of its chain (one log line)
    a unit asked for (`rlctl scale`, the rebalance rule, a resume) not joined within it ──▶ stopped the same way
         ──▶ scale_failed: a failed start (`scale --wait` told); its slot is free again
         (one that joined as it was stopped, and whose stop failed, runs in the job: no failure)

The controller owns the inbox and the sockets; this module only posts to the one, so every send still happens on the
controller's main loop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from rlctl.agents.books import keep
from rlctl.agents.placement import sites_by_agent
from rlctl.agents.unitstarts import Replacement, UnitStarts

log = logging.getLogger(__name__)


REPLACE_ATTEMPTS = 3
REPLACE_BACKOFF_S = 5.0  # before the 2nd attempt; doubled before each next one
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
# the latest lost units given up on kept by name, with why (status `resilience`: every one counted, the note names the
# latest GAVE_UP_NAMED)
GAVE_UP_KEPT = 16
GAVE_UP_NAMED = 3


class Healer(UnitStarts):
    """The Scaler's self-healing layer: lost units replaced, units not joined asked after, or stopped past the bound."""

    def _init_layer(self) -> None:
        super()._init_layer()
        # replacements that joined, over every run of the job (restore()), less those lost before their first sample
        self.replaced = 0
        # lost units not replaced after every attempt: counted, the latest `gave_up_kept` kept by name (and why their
        # last attempt failed, `gave_up_why`)
        self.gave_up: list[str] = []
        self.gave_up_total = 0
        self.gave_up_kept = GAVE_UP_KEPT
        self.gave_up_why: dict[str, str] = {}
        self.t0 = self.clock()  # the plan's units are expected from here
        self._unjoined_at = -UNJOINED_CHECK_S  # when the sites were last asked about units not joined
        self._asking = False  # a thread asks them now
        # the longest a unit of this run took to join (the plan's from t0; a replacement's from its attempt's start):
        # what `join_bound_s` measures the job's load time by; the plan's units already measured
        self.join_max_s = 0.0
        self._timed: set[str] = set()

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
            keep(self.failed_starts, lost, why, kept=self.starts_kept)
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

    def heal(self, now: float) -> None:
        """From the controller's loop (`Scaler.tick`): start replacements that are due; count a replacement that failed
        to start or exited before it joined (`not_joining`) as a failed attempt (then back off, or give up), and stop
        one not joined within `join_bound_s` (`unjoined_stopped` counts it)."""
        for name in sites_by_agent(self.placement.plan):
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

    def _failed(self, r: Replacement, why: str, now: float) -> None:
        self._unrequest(r.unit or "")
        r.why, r.stopping = why, False
        if r.attempts >= REPLACE_ATTEMPTS:
            del self.replacing[r.lost]
            self.gave_up_total += 1
            self.gave_up = [*self.gave_up, r.lost][-self.gave_up_kept :]
            self._unfilled[r.site] = self._unfilled.get(r.site, 0) + 1
            keep(self.gave_up_why, r.lost, why, kept=self.gave_up_kept)
            self.jobdir.event("replace_gave_up", lost=r.lost, site=r.site, attempts=r.attempts, error=why)
            log.warning("controller: gave up replacing %s on %s after %d attempts: %s", r.lost, r.site, r.attempts, why)
            return
        r.unit, r.error, r.due = None, None, now + REPLACE_BACKOFF_S * 2 ** (r.attempts - 1)
        log.warning("controller: replacing %s failed (%s); next attempt in %.0f s", r.lost, why, r.due - now)

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
