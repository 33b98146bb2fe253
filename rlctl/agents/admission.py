"""Dispatch and admission: which queued samples go to which rollout unit, and when.

Each round's queued samples are shared over the units that may generate them (the staleness bound), LPT-balanced
with what each unit holds; a share waits `reserve_s` for a unit catching up on the weights (`_pool`); a sample
goes out only if its group's reservation in the staleness buffers stays feasible (`_give`, `_reservable`). A
suspect prompt (one that was on several lost units) runs alone on a unit (`_isolate`). Rounds whose samples are
all complete and trained retire (`_advance_floor`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rlctl.agents.corestate import CoreState
from rlctl.agents.coretypes import Out, Unit, admission_priority
from rlctl.agents.ledger import COMPLETE, Entry, State
from rlctl.planner.dispatch import assign_balanced


class Admission(CoreState):
    """Dispatch: queued samples to rollout units within the staleness bound (a layer of `ControllerCore`)."""

    def _dispatch(self) -> list[Out]:
        """Each round's queued samples over the units that may generate them, balanced with what each unit
        already holds; the shares of units still catching up on the weights wait for them (`_pool`). A sample
        goes out only if its group's reservation in the staleness buffers stays feasible at that unit's version
        (else it waits for a unit with newer weights)."""
        out: list[Out] = []
        now = self.clock()
        self._advance_floor()
        suspects = self.suspects()
        out += self._isolate(suspects)  # first: a unit it does not keep emptying for takes other work below
        barred = self._barred(suspects)
        for it in range(self.floor, self.created):
            if not self.ledger.queued_count(it):  # (most rounds in flight: all their samples out)
                continue
            queued = [e for e in self.ledger.in_state(State.QUEUED, iteration=it) if e.prompt_id not in suspects]
            units = [
                u
                for u in self.live_units
                if u.name not in barred and self.bound.may_dispatch(iteration=it, unit_version=u.version)
            ]
            if not queued or not units:
                continue
            st = self.stats[it]
            if st.first_dispatch is None:
                st.first_dispatch = now
            ready = {u.name for u in units}
            pool = self._pool(it, units, ready | barred, waited=now - st.first_dispatch)
            for unit, entries in zip(pool, self._assign(queued, pool), strict=True):
                if entries and unit.name in ready:
                    out += self._give(unit, entries, it)
        return out

    def _barred(self, suspects: set[str]) -> set[str]:
        """Units that take no work but a suspect's (`_blame`): those holding one, and those emptying for one."""
        if not suspects:
            self.clearing.clear()
            return set()
        holding = {str(e.agent) for e in self._in_flight() if e.prompt_id in suspects}
        self.clearing -= holding
        return holding | self.clearing

    def _isolate(self, suspects: set[str]) -> list[Out]:
        """Each suspect with samples queued goes, all of them, to a live unit that holds nothing else (no held-out
        evaluation either: `evaluating`). With none empty, the least loaded unit takes no new work until it is
        (`clearing`: the controller pumps meanwhile, as nothing may come from it when it empties by ending an
        evaluation); at most half the live units (one at least) hold or wait for suspects, so the rest of the job goes
        on meanwhile."""
        if not suspects:
            return []
        waiting: dict[str, list[Entry]] = {}
        for it in range(self.floor, self.created):
            for e in self.ledger.in_state(State.QUEUED, iteration=it):
                if e.prompt_id in suspects:
                    waiting.setdefault(e.prompt_id, []).append(e)
        if not waiting:
            self.clearing.clear()
            return []
        running = list(self._in_flight())
        held = Counter(str(e.agent) for e in running)
        started = {e.prompt_id for e in running}
        busy = {str(e.agent) for e in running if e.prompt_id in suspects}
        live = self.live_units
        cap = max(1, len(live) // 2)
        keep: set[str] = set()  # units emptying for a suspect that may go to them now
        out: list[Out] = []
        for group, entries in sorted(waiting.items()):
            if group in started:
                continue  # part of it runs already (alone, or where it was before it became a suspect): the rest waits
            it = entries[0].iteration
            fit = [
                u
                for u in live
                if u.name not in busy
                and self.bound.may_dispatch(iteration=it, unit_version=u.version)
                and self.buffers.may_reserve(group, u.version)
            ]  # none: it waits, holding no unit (a unit emptied for it would idle, and could hold the trainer)
            empty = [u for u in fit if held[u.name] == 0 and not self.evaluating(u.name)]
            if empty:
                unit = min(empty, key=lambda u: (u.name not in self.clearing, u.name))
                sent = self._give(unit, entries, it)
                if sent:
                    busy.add(unit.name)
                    out += sent
                continue
            mine = [u.name for u in fit if u.name in self.clearing and u.name not in keep]
            if mine:
                keep.add(mine[0])
            elif len(busy | keep) < cap and (free := [u for u in fit if u.name not in keep]):
                keep.add(min(free, key=lambda u: (held[u.name], u.name)).name)
        self.clearing = keep - busy
        return out

    def isolating(self) -> set[str]:
        """Units that run a suspect alone or empty for one: nothing else is sent to them."""
        return self._barred(self.suspects())

    def _advance_floor(self) -> None:
        """Past the trained rounds every sample of which is complete, retiring each."""
        while self.floor < self.trainer_version and all(
            e.state in COMPLETE for e in self.ledger.iteration_entries(self.floor)
        ):
            self._retire(self.floor)
            self.floor += 1

    def _retire(self, iteration: int) -> None:
        """A round every group of which is complete leaves the ledger (`Ledger.retire`) and the prompts' specs go:
        the controller holds what may still change, not the job's history, which goes to `on_retire` (the sample
        log)."""
        entries = self.ledger.retire(iteration)
        for e in entries:
            self._held.pop(e.sample_id, None)
        for prompt_id in {e.prompt_id for e in entries}:
            self.prompts.pop(prompt_id, None)
            self.pred_len.pop(prompt_id, None)
            self.aborted.discard(prompt_id)
        if entries and self.on_retire is not None:
            self.on_retire(entries)

    def _give(self, unit: Unit, entries: list[Entry], it: int) -> list[Out]:
        """Dispatch queued samples of round `it` to `unit`: those whose group may reserve at its version; a sample
        with kept output resumes from it."""
        reqs = []
        for e in entries:
            held = self._held.get(e.sample_id)
            oldest = None
            if held is not None and held[0] == unit.name and held[1] < unit.version:
                # it may still run the sample, begun on older weights: its generation answers for those …
                oldest = self._reservable(e, held[1])
            if oldest is None:
                # … unless they are too old for any buffer with room (or it never got the sample: a reconnection):
                # then the unit's, so that it is not kept from the sample for ever; its old generation, if it
                # answers, is as old as it says (`Ledger.finish`), and a group it leaves no room for is generated
                # again (`_complete`)
                oldest = self._reservable(e, unit.version)
            if oldest is None:
                continue
            self.buffers.reserve(e.prompt_id, oldest)
            # the version the sample answers for: the unit's, or its kept output's oldest token's
            self.ledger.dispatch(e.sample_id, agent=unit.name, version=oldest)
            self._heard_at[e.sample_id] = self.clock()
            self._made_at.pop(e.sample_id, None)
            self._gapped.discard(e.sample_id)
            spec = self.prompts[e.prompt_id]
            req = {
                "sample_id": e.sample_id,
                "prompt_tokens": spec.tokens,
                "max_new_tokens": self.cfg.max_new_tokens,
                "priority": admission_priority(it, self.pred_len[e.prompt_id]),
                "iteration": it,
                "attempt": self.ledger.entries[e.sample_id].attempts,
            }
            prefix = self.ledger.partials.resume(e.sample_id)
            if prefix is not None:  # an interrupted generation resumes from its output so far
                req |= {
                    "prefix_tokens": prefix.tokens,
                    "prefix_logprobs": prefix.logprobs,
                    "prefix_versions": prefix.versions,
                }
            reqs.append(req)
        return [Out(unit.name, "generate", {"requests": reqs})] if reqs else []

    def _reservable(self, e: Entry, version: int) -> int | None:
        """The oldest version a dispatch of `e` to a unit at `version` makes its group answer for (the unit's, or
        that of the oldest token of the output it resumes), or None when its group has no room for it. A kept
        output too old for any buffer with room is dropped (its tokens discarded) and the sample starts over."""
        kept = self.ledger.partials.oldest(e.sample_id)
        oldest = version if kept is None else min(version, kept)
        if self.buffers.may_reserve(e.prompt_id, oldest):
            return oldest
        if kept is not None and self.buffers.may_reserve(e.prompt_id, version):
            self.ledger.discarded_tokens += self.ledger.partials.expire(e.sample_id)
            return version
        return None

    def _pool(self, iteration: int, units: list[Unit], ready: set[str], *, waited: float) -> list[Unit]:
        """The units `iteration` is shared over: those that may generate it now, and, for `reserve_s` after its
        first dispatch, the live units that will once they apply the trainer's latest weights (on their way
        through the weight plane). Without the wait, the first unit to apply a version would take the whole
        iteration and the others would sit idle; past it, a unit that is slow to catch up no longer holds the
        iteration back. `units`: those that may generate it now, `ready` their names."""
        latest_will_do = self.bound.may_dispatch(iteration=iteration, unit_version=self.trainer_version)
        if waited >= self.cfg.reserve_s or not latest_will_do:
            return units
        return units + [u for u in self.live_units if u.name not in ready]

    @property
    def reserving(self) -> bool:
        """Does a queued share wait for a unit catching up? (The controller pumps on a timer meanwhile, so the
        share goes to the others when the wait ends even if nothing else happens.) Read at every turn of the
        controller's loop: a round's queued samples are counted by the ledger, versus listed from its entries."""
        now = self.clock()
        for it in range(self.floor, self.created):
            since = self.stats[it].first_dispatch
            waiting = since is not None and now - since < self.cfg.reserve_s
            if waiting and self.ledger.queued_count(it):
                return True
        return False

    def _assign(self, entries: list[Any], units: list[Unit]) -> list[list[Any]]:
        """Balanced with the work each unit holds: skewness-aware, LPT by predicted tokens (prompt + predicted
        output), longest first inside each unit; `random`, a shuffle balanced by sample count."""
        loads = [self._held_tokens(u.name) for u in units]
        if self.cfg.dispatch == "random":
            shuffled = list(entries)
            self._rng.shuffle(shuffled)
            groups = assign_balanced([1.0] * len(shuffled), len(units), loads=loads)
            return [[shuffled[i] for i in sorted(g)] for g in groups]
        groups = assign_balanced([self._tokens(e) for e in entries], len(units), loads=loads)
        return [[entries[i] for i in g] for g in groups]

    def _tokens(self, e: Any) -> float:
        return self.pred_len[e.prompt_id] + len(self.prompts[e.prompt_id].tokens)

    def _held_tokens(self, unit: str) -> float:
        """What `unit` holds, as `_assign` balances it: its samples in flight (`random`), or their tokens (`_tokens`,
        inline), summed again only once they changed (the ledger's `running_stamp`; a sample's prediction and prompt
        stay while it runs): a share is dispatched at each unit's `weights_applied`, and each read every sample in
        flight. Kept as the sum, not a running total: the same float, added in the same order."""
        if self.cfg.dispatch == "random":
            return float(self.ledger.inflight(unit))
        stamp = self.ledger.running_stamp(unit)
        if not stamp:
            self._held_tokens_at.pop(unit, None)
            return 0.0
        kept = self._held_tokens_at.get(unit)
        if kept is not None and kept[0] == stamp:
            return kept[1]
        pred, prompts = self.pred_len, self.prompts
        total = 0.0
        for e in self.ledger.running(unit):
            total += pred[e.prompt_id] + len(prompts[e.prompt_id].tokens)
        self._held_tokens_at[unit] = (stamp, total)
        return total
