"""One rollout engine serving several groups released over time: the job simulator's rollout unit.

In async mode a unit holds its share of iteration i and, as soon as it has the weights iteration i+1
needs, its share of i+1: the engine admits i+1's requests into the rows i's tail frees, older group
first, unless its group barrier holds them back (`rlctl.engines.embedded`: a group larger than one
batch keeps later groups waiting until its last row is done, `auto`; `always` / `never` force it;
vLLM has none). The later group's rows make every step of the earlier one's tail dearer (PTL grows
with the rows), so the iteration the trainer waits for finishes later than it would alone.

    group g released at r_g ─▶ its requests wait, in their admission order
    each step boundary: admit waiting requests of released groups, oldest group first, into free rows
        (≤ batch_cap running; none past the barrier's group) ─▶ admit_fixed_s + prefill_s per request
    one step = PTL(rows) for every row; a request ends after its length in steps
    rows: the running requests, or with lazy compaction (`compact_fraction`) the cache rows, which keep
        finished requests until nothing can be admitted and that fraction of them is free (DESIGN §10)

Between two events (a completion, a release) the batch is constant, so the simulation jumps from
event to event, like `sim.run_instance`, which is this engine with one group released at 0.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Barrier = Literal["auto", "always", "never"]
EPS_S = 1e-9  # a release this close after a step boundary is in time for it (float sums of PTL)


@dataclass(frozen=True)
class EngineSpec:
    """A rollout unit's engine as `run_groups` prices it."""

    ptl_s: np.ndarray  # index = rows in the batch
    batch_cap: int
    prefill_s: float = 0.0  # per admitted request (its prompt)
    admit_fixed_s: float = 0.0
    compact_fraction: float | None = None
    barrier: Barrier = "never"  # may a later group fill the rows an earlier one's tail frees


@dataclass(frozen=True)
class Group:
    release_s: float  # when its requests reach the engine
    lengths: np.ndarray  # output tokens of its requests, in admission order


def run_groups(groups: Sequence[Group], engine: EngineSpec) -> list[np.ndarray]:
    """Finish time (s) of each request of each group (absolute, on the releases' clock)."""
    ptl_s, batch_cap, barrier = engine.ptl_s, engine.batch_cap, engine.barrier
    prefill_s, admit_fixed_s, compact_fraction = engine.prefill_s, engine.admit_fixed_s, engine.compact_fraction
    cap = max(1, min(batch_cap, len(ptl_s) - 1))
    finish = [np.zeros(len(g.lengths)) for g in groups]
    nxt = [0] * len(groups)  # next request to admit, per group
    running = [0] * len(groups)  # running requests, per group
    heap: list[tuple[int, int, int]] = []  # (step it ends at, group, request)
    pending = [g for g, grp in enumerate(groups) if len(grp.lengths)]
    t = min((groups[g].release_s for g in pending), default=0.0)
    step = rows = 0

    def floor() -> int | None:
        """The earliest group with a running request, if it holds later groups back."""
        g = next((g for g, n in enumerate(running) if n), None)
        if g is None or barrier == "never" or (barrier == "auto" and len(groups[g].lengths) <= cap):
            return None
        return g

    def head() -> int | None:
        """The group whose request is first in the engine's waiting queue (released, not all admitted)."""
        return next(
            (g for g in range(len(groups)) if nxt[g] < len(groups[g].lengths) and groups[g].release_s <= t + EPS_S),
            None,
        )

    def admissible() -> bool:
        h, f = head(), floor()
        return h is not None and (f is None or h <= f)

    while True:
        admitted = 0
        if admissible():
            f = floor()
            for g in range(len(groups) if f is None else f + 1):
                grp = groups[g]
                if grp.release_s > t + EPS_S:
                    continue
                while nxt[g] < len(grp.lengths) and len(heap) < cap:
                    heapq.heappush(heap, (step + int(grp.lengths[nxt[g]]), g, nxt[g]))
                    running[g] += 1
                    nxt[g] += 1
                    admitted += 1
        if admitted:
            t += admit_fixed_s + admitted * prefill_s
        later = [groups[g].release_s for g in range(len(groups)) if nxt[g] < len(groups[g].lengths)]
        if not heap:
            if not later:
                return finish
            t, rows = max(t, min(later)), 0  # idle until the next release
            continue
        rows = len(heap) if compact_fraction is None else max(rows, len(heap))  # admissions reuse free rows
        if compact_fraction is not None and not admissible() and rows - len(heap) >= compact_fraction * rows:
            t += ptl_s[rows]  # the queue just drained: the engine compacts after this step (its finished gone)
            step += 1
            while heap and heap[0][0] == step:
                _, g, k = heapq.heappop(heap)
                finish[g][k] = t
                running[g] -= 1
            rows = len(heap)
            if not heap:
                continue
        end = heap[0][0]
        # the next boundary where a waiting request could be admitted: a free row and a group the barrier lets
        # in, released by then (perhaps already, during this boundary's prefill); else the next completion
        f = floor()
        open_ = [
            groups[g].release_s for g in range(len(groups) if f is None else f + 1) if nxt[g] < len(groups[g].lengths)
        ]
        if end > step and open_ and len(heap) < cap:
            until = max(1, math.ceil((min(open_) - EPS_S - t) / ptl_s[rows]))  # the first boundary at or after it
            if until < end - step:
                t += until * ptl_s[rows]
                step += until
                continue
        t += (end - step) * ptl_s[rows]
        step = end
        while heap and heap[0][0] == end:
            _, g, k = heapq.heappop(heap)
            finish[g][k] = t
            running[g] -= 1
        # after the step, like the engine: drop all rows if all are free; compact if nothing can be admitted
        lazy = compact_fraction is not None
        if not heap or (lazy and not admissible() and rows - len(heap) >= (compact_fraction or 0.0) * rows):
            rows = len(heap)
