"""Migration's trigger: how often the units' loads are compared, and what each unit's load is (`rlctl.agents.migration`
plans the moves; the core's `withdrawn` hands the work given back to its receiver).
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Callable

from rlctl.agents import migration
from rlctl.agents.coretypes import MIGRATE_COST_SHARE, MIGRATE_EVERY_S, Out
from rlctl.agents.ledger import Entry
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
        began = time.thread_time()
        out = self._migrate()
        self._migrate_every = max(MIGRATE_EVERY_S, (time.thread_time() - began) / MIGRATE_COST_SHARE)
        return out

    def _migrate(self) -> list[Out]:
        """Work moves to units with free rows (`rlctl.agents.migration`): each donor is asked to `withdraw` n
        requests and answers with what it took out (`withdrawn`)."""
        if not self.cfg.migrate or not self.started:
            return []
        running: dict[str, list[Entry]] = {}
        for e in self._in_flight():
            running.setdefault(str(e.agent), []).append(e)
        residual = self._residual()
        loads = []
        barred = self.isolating()
        for u in self.live_units:
            if u.name in barred:
                continue  # it runs a suspect alone, or empties for one
            mine = running.get(u.name, [])
            done = [len(self.ledger.partials.parts.get(e.sample_id, ())) for e in mine]
            steps = sum(residual(n) for n in done) / len(mine) if mine and residual is not None else None
            prefill = sum(len(self.prompts[e.prompt_id].tokens) + n for e, n in zip(mine, done, strict=True))
            cost = self.unit_costs.get(u.name)
            loads.append(migration.Load(u.name, u.version, len(mine), cost, steps, prefill / max(len(mine), 1)))
        out = []
        for donor, to, n in migration.plan(loads, self.withdrawing, batch=self.cfg.unit_batch):
            self.withdrawing[donor] = (to, n)
            out.append(Out(donor, "withdraw", {"count": n}))
        return out

    def _residual(self) -> Callable[[int], float] | None:
        """Expected decode steps left for a sample with n output tokens so far: the mean of L − n over the last
        finished lengths L > n (max_new_tokens − n when none is that long); None before any sample finished."""
        if not self.finished_lengths:
            return None
        lengths = sorted(self.finished_lengths)
        tail = list(itertools.accumulate(reversed(lengths)))[::-1]  # tail[i] = sum(lengths[i:])
        cap = self.cfg.max_new_tokens

        def left(n: int) -> float:
            i = bisect.bisect_right(lengths, n)
            return tail[i] / (len(lengths) - i) - n if i < len(lengths) else max(cap - n, 1)

        return left
