"""Which unit gives how much work to which (StaleFlow's migration strategy, seed 004 §5.3, by request counts).

    a unit holding more than its batch ──its waiting requests──▶ a unit with free rows (as many as fit)
    a busy unit (≥ 2 in flight)       ──half of its requests───▶ an idle unit (the long tail: running
                                                                   ones resume there from their output)

A receiver takes work only from units whose weights are no newer than its own (whatever it is given, it may
generate), and a unit with a move pending (either way) is left alone. Counts already promised by pending moves are
taken as done. Pure: `ControllerCore.migrate` asks the donors (`withdraw`) and sends on what they give back.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Load:
    name: str
    version: int  # the weights it holds
    held: int  # samples dispatched to it and not finished


def plan(loads: list[Load], pending: dict[str, tuple[str, int]], *, batch: int) -> list[tuple[str, str, int]]:
    """(donor, receiver, how many) moves for units with these loads; `pending`: donor → (receiver, n) moves
    asked for and not answered yet; `batch`: the requests a unit runs at once."""
    held = {u.name: u.held for u in loads}
    for donor, (to, n) in pending.items():
        if donor in held and to in held:
            held[donor], held[to] = held[donor] - n, held[to] + n
    busy = set(pending) | {to for to, _ in pending.values()}  # a move each way at a time
    moves = []
    for r in sorted(loads, key=lambda u: held[u.name]):
        room = batch - held[r.name]
        donors = [d for d in loads if d.name != r.name and d.name not in busy and d.version <= r.version]
        d = max(donors, key=lambda u: held[u.name], default=None)
        if room <= 0 or d is None:
            continue
        if held[d.name] > batch:  # requests wait in its engine while r has free rows
            n = min(held[d.name] - batch, room)
        elif held[r.name] == 0 and held[d.name] >= 2:  # r is idle beside a busy unit
            n = held[d.name] // 2
        else:
            continue
        busy.add(d.name)
        held[d.name], held[r.name] = held[d.name] - n, held[r.name] + n
        moves.append((d.name, r.name, n))
    return moves
