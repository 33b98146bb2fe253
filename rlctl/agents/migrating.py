"""Migration's trigger: how often the units' loads are compared, and what each unit's load is (`rlctl.agents.migration`
plans the moves; the core's `withdrawn` hands the work given back to its receiver).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
from collections.abc import Callable

from rlctl.agents import migration
from rlctl.agents.coretypes import MIGRATE_COST_SHARE, MIGRATE_EVERY_S, Out
from rlctl.agents.unitloss import UnitLoss


class Migrating(UnitLoss):
    """When and from which loads work moves between units (a layer of `ControllerCore`)."""

    def migrate(self, *, now: bool = False) -> list[Out]:
        """`_migrate`, at most every MIGRATE_EVERY_S, or every MIGRATE_COST_SHARE⁻¹ × the last look's CPU seconds
        when that is longer (a look reads every sample in flight: 34,816 at η 16 with 2,048 samples a round, 15 ms
        of CPU), unless `now` (a unit joined or caught up)."""
        t = self.clock()
        if not now and t - self._looked < self._migrate_every:
            return []
        self._looked = t
        began = self.cpu_clock()
        out = self._migrate()
        self._migrate_every = max(MIGRATE_EVERY_S, (self.cpu_clock() - began) / MIGRATE_COST_SHARE)
        return out

    def _migrate(self) -> list[Out]:
        """Work moves to units with free rows (`rlctl.agents.migration`): each donor is asked to `withdraw` n
        requests and answers with what it took out (`withdrawn`)."""
        if not self.cfg.migrate or not self.started:
            return []
        barred = self.isolating()  # units that run a suspect alone, or empty for one
        # what a unit's running samples hold beyond their count (the steps they have left, their prefill) is read only
        # to split a donor's work with an idle unit (`migration.split_pays`): measured then, for that donor, versus
        # for every unit at every look (each sample in flight read; at 64 units 64 looks a weight version, one at each
        # unit's `weights_applied`)
        loads = [
            migration.Load(u.name, u.version, self.ledger.inflight(u.name), self.unit_costs.get(u.name))
            for u in self.live_units
            if u.name not in barred
        ]
        # built at the first donor measured, once: most looks measure none (sorting the last finished lengths at every
        # look was a fifth of a look's CPU at 64 units, `bench controller-units`)
        residual = functools.cache(self._residual)
        measured: dict[str, migration.Load] = {}

        def measure(load: migration.Load) -> migration.Load:
            if load.name not in measured:
                steps, per_request = self._running_figures(load.name, residual())
                measured[load.name] = dataclasses.replace(load, remaining_steps=steps, tokens_per_request=per_request)
            return measured[load.name]

        out = []
        for donor, to, n in migration.plan(loads, self.withdrawing, batch=self.cfg.unit_batch, measure=measure):
            self.withdrawing[donor] = (to, n)
            out.append(Out(donor, "withdraw", {"count": n}))
        return out

    def _running_figures(self, unit: str, residual: Callable[[int], float] | None) -> tuple[float | None, float]:
        """The decode steps `unit`'s running samples have left, expected, on average (None: none runs, or no sample
        finished yet), and the tokens each holds on average (prompt + output so far: what a receiver prefills)."""
        mine = self.ledger.running(unit)
        parts, prompts = self.ledger.partials.parts, self.prompts
        done = [len(p.tokens) if (p := parts.get(e.sample_id)) is not None else 0 for e in mine]
        steps = sum(residual(n) for n in done) / len(mine) if mine and residual is not None else None
        prefill = sum(len(prompts[e.prompt_id].tokens) for e in mine) + sum(done)
        return steps, prefill / max(len(mine), 1)

    def _residual(self) -> Callable[[int], float] | None:
        """Expected decode steps left for a sample with n output tokens so far: the mean of L − n over the last
        finished lengths L > n (max_new_tokens − n when none is that long); None before any sample finished."""
        if not self.finished_lengths:
            return None
        lengths = sorted(self.finished_lengths)
        tail = list(itertools.accumulate(reversed(lengths)))[::-1]  # tail[i] = sum(lengths[i:])
        cap = self.cfg.max_new_tokens
        known: dict[int, float] = {}  # n → its value: a look asks it for every sample in flight, of few lengths

        def left(n: int) -> float:
            value = known.get(n)
            if value is None:
                i = bisect.bisect_right(lengths, n)
                value = known[n] = tail[i] / (len(lengths) - i) - n if i < len(lengths) else max(cap - n, 1)
            return value

        return left
