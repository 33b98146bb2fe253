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
    run = EngineRun(engine)
    for g in groups:
        run.add(g)
    run.run_until(None)
    return [np.array(f, dtype=float) for f in run.finish]


def same_engine(a: EngineSpec, b: EngineSpec) -> bool:
    """Whether two specs price a run alike (`EngineSpec` holds an array: no `==`)."""
    return a is b or (
        (a.ptl_s is b.ptl_s or np.array_equal(a.ptl_s, b.ptl_s))
        and (a.batch_cap, a.prefill_s, a.admit_fixed_s, a.compact_fraction, a.barrier)
        == (b.batch_cap, b.prefill_s, b.admit_fixed_s, b.compact_fraction, b.barrier)
    )


class EngineRun:
    """`run_groups` that can stop once a group is done and take later groups as their releases become known.

    The job simulator knows iteration i + η + 1's release only once iteration i is trained; that release comes
    after i's last request is done, so the run up to then is the same with or without that group, and the run
    goes on from where it stopped instead of again from the start (which made a job's simulation quadratic in its
    iterations). `add` refuses (returns False) a group it could not have held all along: released before the
    time the run stopped at (+ EPS_S), or before an earlier group's release; the caller then starts a new run.

    Event to event in plain Python numbers (the planner runs it hundreds of times a plan: numpy scalars and
    per-event scans of every group cost more than the events); the same sums in the same order as the engine
    loop it mirrors (`tests/unit/planner/test_planner_engine.py`)."""

    def __init__(self, engine: EngineSpec) -> None:
        self.engine = engine
        self.ptl = np.asarray(engine.ptl_s, dtype=float).tolist()  # plain floats, the same values
        self.cap = max(1, min(engine.batch_cap, len(self.ptl) - 1))
        self.release: list[float] = []
        self.lengths: list[list[int]] = []
        self.size: list[int] = []
        self.finish: list[list[float]] = []
        self.nxt: list[int] = []  # next request to admit, per group
        self.running: list[int] = []  # running requests, per group
        # a running group holds later groups back (the barrier) when it is larger than one batch, or always
        self.bars: list[bool] = []
        self.waiting: list[int] = []  # groups not all admitted, oldest first
        self.heap: list[tuple[int, int, int]] = []  # (step it ends at, group, request)
        self.started = False
        self.t = 0.0
        self.step = self.rows = 0

    def add(self, group: Group) -> bool:
        release = float(group.release_s)
        if self.started and (release <= self.t + EPS_S or (self.release and release < max(self.release))):
            return False
        lengths = np.asarray(group.lengths)
        ls = (lengths if lengths.dtype == np.int64 else lengths.astype(np.int64)).tolist()
        n, barrier = len(ls), self.engine.barrier
        self.release.append(release)
        self.lengths.append(ls)
        self.size.append(n)
        self.finish.append([0.0] * n)
        self.nxt.append(0)
        self.running.append(0)
        self.bars.append(barrier == "always" or (barrier == "auto" and n > self.cap))
        if n:
            self.waiting.append(len(self.size) - 1)
        return True

    def run_until(self, target: int | None) -> list[float]:
        """Run until group `target` is done (None: every group) and return its finish times."""
        engine, ptl, cap = self.engine, self.ptl, self.cap
        prefill_s, admit_fixed_s = engine.prefill_s, engine.admit_fixed_s
        compact_fraction = engine.compact_fraction
        lazy = compact_fraction is not None
        release, size, finish = self.release, self.size, self.finish
        nxt, running, bars, waiting, heap = self.nxt, self.running, self.bars, self.waiting, self.heap
        barred = any(bars)
        if not self.started:
            self.started = True
            self.t = min((release[g] for g in waiting), default=0.0)
        if not lazy and not barred:
            return self._run_plain(target)
        t, step, rows = self.t, self.step, self.rows

        def floor() -> int | None:
            """The earliest group with a running request, if it holds later groups back."""
            if barred:
                for g, n in enumerate(running):
                    if n:
                        return g if bars[g] else None
            return None

        def admissible() -> bool:
            """The engine's waiting queue has a released request at its head that the barrier lets in."""
            for h in waiting:
                if release[h] <= t + EPS_S:
                    f = floor()
                    return f is None or h <= f
            return False

        while True:
            if target is not None and nxt[target] == size[target] and not running[target]:
                break
            admitted = self._admit(t, step, floor()) if admissible() else 0
            if admitted:
                t += admit_fixed_s + admitted * prefill_s
            if not heap:
                if not waiting:
                    break  # every group done: a later `add` goes on from here
                t, rows = max(t, min(release[g] for g in waiting)), 0  # idle until the next release
                continue
            rows = max(rows, len(heap)) if lazy else len(heap)  # admissions reuse free rows
            if lazy and rows - len(heap) >= (compact_fraction or 0.0) * rows and not admissible():
                t += ptl[rows]  # the queue just drained: the engine compacts after this step (its finished gone)
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
            if end > step and waiting and len(heap) < cap:
                f = floor()
                first = min((release[g] for g in waiting if f is None or g <= f), default=None)
                if first is not None:
                    until = max(1, math.ceil((first - EPS_S - t) / ptl[rows]))  # the first boundary at or after it
                    if until < end - step:
                        t += until * ptl[rows]
                        step += until
                        continue
            t += (end - step) * ptl[rows]
            step = end
            while heap and heap[0][0] == end:
                _, g, k = heapq.heappop(heap)
                finish[g][k] = t
                running[g] -= 1
            # after the step, like the engine: drop all rows if all are free; compact if nothing can be admitted
            if not heap or (lazy and rows - len(heap) >= (compact_fraction or 0.0) * rows and not admissible()):
                rows = len(heap)
        self.t, self.step, self.rows = t, step, rows
        return finish[target] if target is not None else []

    def _admit(self, t: float, step: int, floor: int | None) -> int:
        """Admit the released requests of the waiting groups, oldest first, into the free rows at `step` (time `t`),
        none of a group past `floor` (the group whose running requests hold later ones back); how many."""
        release, lengths, size, nxt, running = self.release, self.lengths, self.size, self.nxt, self.running
        heap, cap, waiting = self.heap, self.cap, self.waiting
        admitted = 0
        for g in list(waiting):
            if (floor is not None and g > floor) or len(heap) >= cap:
                break
            if release[g] > t + EPS_S:
                continue
            ls, k = lengths[g], nxt[g]
            take = min(size[g] - k, cap - len(heap))
            for i in range(k, k + take):
                heapq.heappush(heap, (step + ls[i], g, i))
            running[g] += take
            nxt[g] = k + take
            admitted += take
            if nxt[g] == size[g]:
                waiting.remove(g)
        return admitted

    def _run_plain(self, target: int | None) -> list[float]:
        """`run_until` without lazy compaction or a group barrier (vLLM's engine): the same loop with what those
        add left out (no barrier: any released request may be admitted; no compaction: rows = running)."""
        ptl, cap, push, pop = self.ptl, self.cap, heapq.heappush, heapq.heappop
        prefill_s, admit_fixed_s = self.engine.prefill_s, self.engine.admit_fixed_s
        release, lengths, size, finish = self.release, self.lengths, self.size, self.finish
        nxt, running, waiting, heap = self.nxt, self.running, self.waiting, self.heap
        t, step = self.t, self.step
        while True:
            if target is not None and nxt[target] == size[target] and not running[target]:
                break
            admitted = 0
            free = cap - len(heap)
            if waiting and free > 0:  # released requests, oldest group first, into the free rows
                g = waiting[0]
                k = nxt[g]
                if size[g] - k > free and release[g] <= t + EPS_S:  # the oldest fills them all, and some still wait
                    ls = lengths[g]
                    for i in range(k, k + free):
                        push(heap, (step + ls[i], g, i))
                    running[g] += free
                    nxt[g] = k + free
                    admitted = free
                    free = 0
                if free:
                    admitted += self._admit(t, step, None)
            if admitted:
                t += admit_fixed_s + admitted * prefill_s
            if len(heap) == cap and waiting and release[waiting[0]] <= t + EPS_S:
                # every row busy and the oldest waiting group released: each completion's rows go to it (the loop
                # below without its checks) until it has no more than they free, or `target` is done
                g0, pc, replace = waiting[0], ptl[cap], heapq.heapreplace
                ls, n0 = lengths[g0], size[g0]
                while True:
                    head = heap[0]
                    end = head[0]
                    t += (end - step) * pc
                    step = end
                    # one request ends alone (neither child of the heap's root ends then), g0 has more than one
                    # left and `target` is not done by it: its row goes to g0's next, one heap operation for both
                    k = nxt[g0]
                    if (
                        n0 - k > 1
                        and (cap < 2 or heap[1][0] != end)
                        and (cap < 3 or heap[2][0] != end)
                        and not (head[1] == target and running[target] == 1 and nxt[target] == size[target])
                    ):
                        _, g, i = head
                        finish[g][i] = t
                        running[g] -= 1
                        replace(heap, (step + ls[k], g0, k))
                        running[g0] += 1
                        nxt[g0] = k + 1
                        t += admit_fixed_s + 1 * prefill_s
                        continue
                    c = 0
                    while heap and heap[0][0] == end:
                        _, g, k = pop(heap)
                        finish[g][k] = t
                        running[g] -= 1
                        c += 1
                    k = nxt[g0]
                    if n0 - k <= c or (target is not None and nxt[target] == size[target] and not running[target]):
                        break
                    for i in range(k, k + c):
                        push(heap, (step + ls[i], g0, i))
                    running[g0] += c
                    nxt[g0] = k + c
                    t += admit_fixed_s + c * prefill_s
                continue
            if not heap:
                if not waiting:
                    break
                t = max(t, min(release[g] for g in waiting))  # idle until the next release
                continue
            rows = len(heap)
            end = heap[0][0]
            if end > step and waiting and rows < cap:  # a release before the next completion: stop there
                first = min(release[g] for g in waiting)
                until = max(1, math.ceil((first - EPS_S - t) / ptl[rows]))
                if until < end - step:
                    t += until * ptl[rows]
                    step += until
                    continue
            t += (end - step) * ptl[rows]
            step = end
            while heap and heap[0][0] == end:
                _, g, k = pop(heap)
                finish[g][k] = t
                running[g] -= 1
        self.t, self.step, self.rows = t, step, len(heap)
        return finish[target] if target is not None else []
