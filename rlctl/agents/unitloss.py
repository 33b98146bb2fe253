"""Rollout units lost, silent or drained: what they held goes back to the queue, and what it cost is bounded.

A unit's reports of its running generations (`partial`, `reported`) say how much of each output is kept and how fast
it generates; when the unit goes (`_interrupted`) each generation lost at most what it made since. A prompt on
several lost units becomes a suspect and then is quarantined (`_blame`, `_quarantine`); a unit gone for good leaves
no per-unit state behind (`_forget_unit`).
"""

from __future__ import annotations

import math
from collections import deque

from rlctl.agents.coretypes import RATE_REPORTS, Out
from rlctl.agents.delivery import Delivery


class UnitLoss(Delivery):
    """Units' reports, and what a unit lost, silent or drained leaves behind (a layer of `ControllerCore`)."""

    def partial(
        self,
        name: str,
        *,
        sample_id: str,
        start: int,
        tokens: list[int],
        logprobs: list[float],
        versions: list[int],
        made_s: float = 0.0,
        heard_s: float | None = None,
    ) -> bool:
        """A unit's report of a running sample's output from index `start` on; kept (True) only while the sample
        is dispatched to that unit (a late report of a lost unit is ignored) and the store takes it. `made_s`: the
        unit's clock when it took the report (0: the arrival stands in for it); `heard_s`: when it arrived (this
        clock; default now)."""
        if self.ledger.dispatched_to(sample_id, name) is None:
            return False
        now = self.clock() if heard_s is None else heard_s
        made = made_s or now
        last = self._made_at.get(sample_id)
        if last is not None and made > last and tokens:  # between two reports: a rate of generating, not waiting
            self._rates.setdefault(name, deque(maxlen=RATE_REPORTS)).append(len(tokens) / (made - last))
        self._made_at[sample_id] = made
        self._unit_reported_at[name] = now
        if not self.ledger.partials.extend(sample_id, start, tokens, logprobs, versions):
            self._gapped.add(sample_id)  # its output since its last kept report is not here
            return False
        self._heard_at[sample_id] = now
        self._reported_by[sample_id] = name
        return True

    def reported(self, name: str, *, free_rows: int | None) -> None:
        """Unit `name`'s report (its parts went to `partial`) said its engine had `free_rows` rows free (None:
        not known): at most that many of the generations it holds may have started after it (`_interrupted`). The
        late report of a unit gone for good (still in the inbox as it was lost) is not kept: nothing reads it, and
        `_forget_unit` has run (it was kept for the rest of the run)."""
        if name not in self.units:
            return
        if free_rows is None:
            self._admit_cap.pop(name, None)
        else:
            self._admit_cap[name] = free_rows

    def _forget_unit(self, name: str) -> None:
        """A rollout unit is gone for good (lost, or stopped after a drain): what was kept per unit for it goes, its
        `Unit` too, so that a job whose units are replaced for weeks holds only its live units' and walks only them
        (`live_units`, `_members`: each dispatch); its name stays in `left` (`known`)."""
        del self.units[name]
        self.left.add(name)
        self.left_ungauged.add(name)
        # (a drained unit retired before its answer to a `withdraw` came: the move asked of it held its receiver
        # busy for good, `migration.plan`, which then neither took nor gave work again)
        for per_unit in (self._rates, self._unit_reported_at, self._admit_cap, self.unit_costs, self.withdrawing):
            per_unit.pop(name, None)
        self._held_tokens_at.pop(name, None)
        for sid in [sid for sid, (unit, _) in self._held.items() if unit == name]:
            del self._held[sid]

    def _blame(self, name: str, sample_ids: list[str], *, evaluating: bool = False) -> None:
        """Unit `name` was lost holding `sample_ids`: every prompt among them counts one more loss. A prompt that
        crashes or hangs the engine (an input that trips a kernel, a tokenizer edge case, a generation that never
        ends) would otherwise take down each unit it is sent to, for ever; an innocent one shares some losses with it
        by chance. So a prompt at `quarantine_after` losses is a suspect: it runs alone on a unit (`_isolate`), and a
        suspect whose unit is lost while holding nothing else is quarantined — its group is set aside and a new
        prompt's takes its place. A suspect that completes is cleared (`_complete`). A unit that was only silent
        (`unreachable`: its link, its node) blames nothing: its samples went back to the queue before it was lost.
        A unit that was `evaluating` held the held-out prompts too: nothing on it was alone (the controller asks no
        unit that runs a suspect to evaluate, and stops the evaluation when it keeps losing units: evaluation.py)."""
        after = self.cfg.quarantine_after
        groups = sorted({self.ledger.entries[sid].prompt_id for sid in sample_ids})
        if not after or not groups:
            return
        crashes = self.ledger.crashes
        for group in groups:
            crashes[group] = n = crashes.get(group, 0) + 1
            if n < after:
                continue
            record = {"prompt": group, "losses": n, "unit": name, "with": len(groups) - 1 + int(evaluating)}
            if len(groups) == 1 and not evaluating:
                self._quarantine(group)
                self.quarantines.append({**record, "action": "quarantined"})
            elif n == after:
                self.quarantines.append({**record, "action": "suspect"})

    def _quarantine(self, group: str) -> None:
        """Set `group` aside (`Ledger.quarantine`) and draw a new prompt for its round in its place, as dynamic
        sampling does for a dropped group (sharing its count of drawn prompts: `ledger.refills`)."""
        entries = self.ledger.group(group)
        self._forget(entries)
        for e in entries:
            self._heard_at.pop(e.sample_id, None)
        self.buffers.release(group)
        r = entries[0].iteration  # its round: a group gets an iteration of its own only once it occupies a buffer
        self.ledger.quarantine(group)
        if self._refill is None:
            self.failed = f"prompt {group} crashed the rollout units that ran it, and no prompt can take its place"
            return
        drawn = self.ledger.refills.get(r, 0)
        spec = self._register([self._refill(r, drawn)])[0]
        self.ledger.refills[r] = drawn + 1
        self.ledger.add_prompt(iteration=r, prompt_id=spec.prompt_id, num_samples=self.cfg.samples_per_prompt)

    def _interrupted(self, name: str, sample_ids: list[str], *, at: float | None = None, closed: bool = False) -> None:
        """Count the generations the unit held, `sample_ids` (`TrajectoryStore.interrupt`): each kept its reported
        output, and lost at most what it generated after it was last accounted for — a unit's report carries every
        running generation's new tokens, so that is after the later of the unit's last report and the sample's own
        last kept report or dispatch (its own only, once the store refused one of its reports) until `at` (when the
        loss was heard: default now) — at the fastest per-sample rate the unit's reports showed (all it had left
        when no rate is known). Times are arrivals on this clock, so the bound holds but for the jitter of the
        network's delay between the last report and the loss.

        Units that report after every `report_steps` decode steps, whose connection ended in order (`closed`: every
        report they wrote arrived), lost at most that many tokens of each generation whose reports were all kept:
        a step adds one token to a generation (rlctl's engines decode one token per step), and fewer steps than
        that ran after the last report. Of the generations no report of this unit showed, at most its admission
        cap (`reported`: the rows free at its last report, plus each freed since) started after that report;
        the others were still waiting in its queue and lost nothing. Which ones started is not known, so the
        cap is charged to the first of them."""
        now = self.clock() if at is None else at
        rate = max(self._rates.pop(name, ()), default=0.0)
        unit_t = self._unit_reported_at.pop(name, float("-inf"))
        cap = self._admit_cap.pop(name, None)
        for sid in sample_ids:
            own = self._heard_at.pop(sid, now)
            gapped = sid in self._gapped
            self._gapped.discard(sid)
            since = now - (own if gapped else max(unit_t, own))
            kept = len(self.ledger.partials.parts.get(sid, ()))
            most = max(self.cfg.max_new_tokens - kept, 0)
            if rate:
                most = min(most, math.ceil(rate * max(since, 0.0) - 1e-9))  # a bound: whole tokens, up
            if closed and self.cfg.report_steps and not gapped:
                most = min(most, self.cfg.report_steps)
                if cap is not None and self._reported_by.get(sid) != name:  # not started here, or one of `cap`
                    most, cap = (most, cap - 1) if cap > 0 else (0, 0)
            self.ledger.partials.interrupt(sid, lost_at_most=most)
            self._made_at.pop(sid, None)
            self._reported_by.pop(sid, None)

    def _still_held(self, name: str) -> None:
        """Unit `name`'s samples are about to be queued again while the unit may go on running them: a dispatch of
        one back to it answers for the version its generation there began with (`_held`), not the unit's now."""
        for e in self.ledger.running(name):
            assert e.dispatch_version is not None
            held = self._held.get(e.sample_id)
            version = e.dispatch_version if held is None or held[0] != name else min(held[1], e.dispatch_version)
            self._held[e.sample_id] = (name, version)

    def _retire_drained(self) -> list[Out]:
        out = []
        for u in list(self.units.values()):
            if u.alive and u.draining and self.ledger.inflight(u.name) == 0:
                u.alive = False
                self._forget_unit(u.name)
                self.told_to_stop.add(u.name)
                out += [Out(u.name, "stop", {}), self._members()]
        return out
