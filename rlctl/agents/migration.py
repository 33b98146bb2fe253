"""Which unit gives how much work to which (StaleFlow's migration strategy, seed 004 §5.3).

    a unit holding more than its batch ──its waiting requests──▶ a unit with free rows (as many as fit)
    a busy unit (≥ 2 in flight)       ──half of its requests───▶ an idle unit (the long tail: running
                                                                   ones resume there from their output),
                                                                   when the planner's cost model says it pays

Waiting requests always move (they would only wait). Running ones move only when the decode steps saved beat
the prefill the receiver redoes: with `Cost` (the planner's decode cost of each unit's site, from plan.json)
and the donor's expected remaining steps S (`Load.remaining_steps`, from the lengths of finished samples),
moving n of h running requests pays when S · (ptl_d(h) − max(ptl_d(h − n), ptl_r(n))) exceeds
prefill_r · (the tokens the n requests hold: prompt + output so far). A decode step whose time hardly depends
on the batch (memory-bound: a GPU well below its compute bound) makes splitting a tail worthless, and nothing
moves; where the step time grows with the batch, the tail is split. Without a cost (a unit the plan does not
price) or an estimate of S (no finished sample yet), the count rule alone decides, as StaleFlow's does.

A receiver takes work only from units whose weights are no newer than its own (whatever it is given, it may
generate), and a unit with a move pending (either way) is left alone. Counts already promised by pending moves are
taken as done. Pure: `ControllerCore.migrate` asks the donors (`withdraw`) and sends on what they give back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Cost:
    """A unit's decode cost as the planner priced its site (plan.json's `decode`, rlctl.planner.costs.DecodeCost)."""

    ptl_s: tuple[float, ...]  # seconds per decode step at batch 1, 2, …, max_batch
    prefill_s_per_token: float

    def ptl(self, bs: int) -> float:
        return self.ptl_s[min(max(bs, 1), len(self.ptl_s)) - 1]

    @staticmethod
    def from_plan(decode: dict[str, Any] | None) -> Cost | None:
        if not decode or not decode.get("ptl_s"):
            return None
        return Cost(tuple(float(x) for x in decode["ptl_s"]), float(decode.get("prefill_s_per_token", 0.0)))


@dataclass(frozen=True)
class Load:
    name: str
    version: int  # the weights it holds
    held: int  # samples dispatched to it and not finished
    cost: Cost | None = None  # its site's decode cost (None: not priced)
    remaining_steps: float | None = None  # decode steps its running samples have left, expected (None: unknown)
    tokens_per_request: float = 0.0  # prompt + output so far of its running samples, on average (the prefill)


def split_pays(donor: Load, receiver: Load, held: int, n: int) -> bool:
    """Whether moving `n` of the donor's `held` running requests to the idle receiver saves more decode time than
    the receiver spends prefilling them (the module docstring); True when either cost or S is unknown."""
    if donor.cost is None or receiver.cost is None or donor.remaining_steps is None:
        return True
    saved = donor.cost.ptl(held) - max(donor.cost.ptl(held - n), receiver.cost.ptl(n))
    return donor.remaining_steps * saved > receiver.cost.prefill_s_per_token * n * donor.tokens_per_request


def plan(
    loads: list[Load],
    pending: dict[str, tuple[str, int]],
    *,
    batch: int,
    measure: Callable[[Load], Load] | None = None,
) -> list[tuple[str, str, int]]:
    """(donor, receiver, how many) moves for units with these loads; `pending`: donor → (receiver, n) moves
    asked for and not answered yet; `batch`: the requests a unit runs at once. `measure`: a load with its running
    requests' figures (`remaining_steps`, `tokens_per_request`), asked of a donor only where a split of its work with an
    idle unit needs them (reading them reads every request it runs), else the loads have them."""
    held = {u.name: u.held for u in loads}
    for donor, (to, n) in pending.items():
        if donor in held and to in held:
            held[donor], held[to] = held[donor] - n, held[to] + n
    busy = set(pending) | {to for to, _ in pending.values()}  # a move each way at a time
    moves = []
    # a receiver takes a donor's waiting requests (the donor holds more than its batch) or, idle, a split of its work;
    # a move lifts no unit past its batch, so with none past it a busy receiver takes nothing and looks for no donor
    # (versus a walk of every unit for each: units² a look, and a look at each of a version's `weights_applied`)
    waiting = any(h > batch for h in held.values())
    for r in sorted(loads, key=lambda u: held[u.name]):
        room = batch - held[r.name]
        if room <= 0 or (held[r.name] and not waiting):
            continue
        donors = [d for d in loads if d.name != r.name and d.name not in busy and d.version <= r.version]
        d = max(donors, key=lambda u: held[u.name], default=None)
        if d is None:
            continue
        if held[d.name] > batch:  # requests wait in its engine while r has free rows
            n = min(held[d.name] - batch, room)
        elif held[r.name] == 0 and held[d.name] >= 2:  # r is idle beside a busy unit
            n = held[d.name] // 2
            if not split_pays(d if measure is None else measure(d), r, held[d.name], n):
                continue
        else:
            continue
        busy.add(d.name)
        held[d.name], held[r.name] = held[d.name] - n, held[r.name] + n
        moves.append((d.name, r.name, n))
    return moves
