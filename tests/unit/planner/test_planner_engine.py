"""The simulator's engine of several groups released over time: several match a step-by-step engine loop
(admission by group, releases, group barrier, lazy compaction); one group is `run_instance`
(test_planner_sim.py)."""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rlctl.planner import engine as engine_mod
from rlctl.planner import simjob
from rlctl.planner.engine import EPS_S, Barrier, EngineRun, EngineSpec, Group, run_groups
from rlctl.planner.simjob import IterationWork, JobTimeline, UnitShare, learner_train, simulate_job

PTL = np.array([0.0] + [0.01 + 0.001 * b for b in range(1, 65)])


def reference_groups(
    groups: list[tuple[float, list[int]]],
    cap: int,
    prefill_s: float,
    fixed_s: float,
    compact: float | None,
    barrier: str,
) -> list[list[float]]:
    """The embedded engine's loop, one step at a time: admit released requests, oldest group first, into
    free rows unless the earliest running group bars them; decode every row; finish; maybe compact."""
    rows: list[tuple[int, int] | None] = []
    remaining: dict[tuple[int, int], int] = {}
    finish = [[0.0] * len(ls) for _, ls in groups]
    nxt = [0] * len(groups)
    live = [r for r, ls in groups if ls]
    t = min(live, default=0.0)

    def floor() -> int | None:
        g = min((g for g, _ in remaining), default=None)
        if g is None or barrier == "never" or (barrier == "auto" and len(groups[g][1]) <= cap):
            return None
        return g

    def head() -> int | None:
        return next((g for g, (r, ls) in enumerate(groups) if nxt[g] < len(ls) and r <= t + EPS_S), None)

    def admissible() -> bool:
        h, f = head(), floor()
        return h is not None and (f is None or h <= f)

    while any(nxt[g] < len(ls) for g, (_, ls) in enumerate(groups)) or remaining:
        admitted = 0
        if admissible():
            f = floor()
            for g, (r, ls) in enumerate(groups):
                if (f is not None and g > f) or r > t + EPS_S:
                    continue
                while nxt[g] < len(ls) and len(remaining) < cap:
                    key = (g, nxt[g])
                    if None in rows:
                        rows[rows.index(None)] = key
                    else:
                        rows.append(key)
                    remaining[key] = ls[nxt[g]]
                    nxt[g] += 1
                    admitted += 1
        if admitted:
            t += fixed_s + admitted * prefill_s
        if not remaining:
            t = max(t, min(r for g, (r, ls) in enumerate(groups) if nxt[g] < len(ls)))
            rows = []
            continue
        t += PTL[len(rows) if compact is not None else len(remaining)]
        for key in list(remaining):
            remaining[key] -= 1
            if remaining[key] == 0:
                finish[key[0]][key[1]] = t
                del remaining[key]
                rows[rows.index(key)] = None
        free = rows.count(None)
        if compact is None or free == len(rows) or (not admissible() and free >= compact * len(rows)):
            rows = [r for r in rows if r is not None]
    return finish


@given(
    st.lists(
        st.tuples(st.floats(0.0, 0.6), st.lists(st.integers(1, 25), min_size=0, max_size=12)), min_size=1, max_size=4
    ),
    st.integers(1, 8),
    st.sampled_from([0.0, 0.002]),
    st.sampled_from([None, 0.5]),
    st.sampled_from(["auto", "always", "never"]),
)
@settings(max_examples=300, deadline=None)
def test_groups_match_a_step_by_step_engine(
    groups: list[tuple[float, list[int]]], cap: int, prefill: float, compact: float | None, barrier: Barrier
) -> None:
    groups = sorted(groups, key=lambda g: g[0])  # iterations are released in order
    engine = EngineSpec(PTL, cap, prefill_s=prefill, admit_fixed_s=0.001, compact_fraction=compact, barrier=barrier)
    got = run_groups([Group(r, np.array(ls, dtype=np.int64)) for r, ls in groups], engine)
    want = reference_groups(groups, cap, prefill, 0.001, compact, barrier)
    assert [g.tolist() for g in got] == [pytest.approx(w) for w in want]


def test_the_next_group_fills_the_tail_and_slows_it_unless_barred() -> None:
    """Group 0: 4 requests on a batch of 4 (one long); group 1 released while its tail runs."""
    tail = [Group(0.0, np.array([2, 2, 2, 40])), Group(0.05, np.array([10, 10, 10]))]

    def run(barrier: Barrier, groups: list[Group] = tail) -> list[np.ndarray]:
        return run_groups(groups, EngineSpec(PTL, 4, barrier=barrier))

    (alone,) = run("never", tail[:1])
    filled, later = run("never")
    barred_first, barred_later = run("always")
    assert filled[3] > alone[3]  # the tail shares its steps with group 1's rows: each step dearer
    assert barred_first.tolist() == pytest.approx(alone.tolist())  # the barrier: group 1 waits for the last row
    assert barred_later.min() > alone.max() and later.max() < barred_later.max()
    # auto: a group that fits in one batch lets the next one in
    assert [g.tolist() for g in run("auto")] == [filled.tolist(), later.tolist()]


@given(
    st.lists(st.lists(st.integers(1, 25), min_size=1, max_size=10), min_size=2, max_size=5),
    st.lists(st.floats(0.0, 0.3), min_size=5, max_size=5),
    st.integers(1, 8),
    st.sampled_from([None, 0.5]),
    st.sampled_from(["auto", "always", "never"]),
)
@settings(max_examples=300, deadline=None)
def test_a_run_stopped_at_a_group_goes_on_with_later_groups_as_from_the_start(
    shares: list[list[int]], gaps: list[float], cap: int, compact: float | None, barrier: Barrier
) -> None:
    """The job simulator's use: group i + 1 is known only once group i is done (released after its last
    request), and the run goes on from there; each group's finish times are those of one run of every group
    from the start. A group released before the run stopped is refused (the caller starts again)."""
    engine = EngineSpec(PTL, cap, prefill_s=0.002, admit_fixed_s=0.001, compact_fraction=compact, barrier=barrier)
    run = EngineRun(engine)
    assert run.add(Group(0.0, np.array(shares[0])))
    got, groups = [], [Group(0.0, np.array(shares[0]))]
    for i in range(len(shares)):
        got.append(list(run.run_until(i)))
        if i + 1 < len(shares):
            nxt = Group(max(got[-1]) + gaps[i] + 2 * EPS_S, np.array(shares[i + 1]))
            assert not run.add(Group(max(got[-1]), np.array(shares[i + 1])))  # at the stop: refused
            assert run.add(nxt)
            groups.append(nxt)
    assert got == [f.tolist() for f in run_groups(groups, engine)]  # the same sums: equal, not approximately


class _FromTheStart(EngineRun):
    """The engine run as the job simulator ran it before: every iteration's run again from the first share."""

    def add(self, group: Group) -> bool:
        return not self.started and super().add(group)


class _StepByStep:
    """The same, each run by the step-by-step engine loop above (`reference_groups`, on PTL)."""

    def __init__(self, engine: EngineSpec) -> None:
        assert engine.ptl_s is PTL
        self.engine, self.groups, self.started = engine, [], False

    def add(self, group: Group) -> bool:
        if self.started:
            return False
        self.groups.append((group.release_s, [int(x) for x in group.lengths]))
        return True

    def run_until(self, target: int) -> list[float]:
        self.started = True
        e = self.engine
        return reference_groups(self.groups, e.batch_cap, e.prefill_s, e.admit_fixed_s, e.compact_fraction, e.barrier)[
            target
        ]


def given_jobs(*, min_rows: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Jobs of 2 to 6 iterations, each of `min_rows` to 12 samples' output lengths, that the tests below share out
    to their units; then the engine's batch cap, the mode, eta, the barrier, the compaction and the train time."""
    return given(
        st.lists(st.lists(st.integers(1, 30), min_size=min_rows, max_size=12), min_size=2, max_size=6),
        st.integers(1, 6),
        st.sampled_from(["sync", "stream", "async"]),
        st.integers(0, 2),
        st.sampled_from(["auto", "always", "never"]),
        st.sampled_from([None, 0.5]),
        st.floats(0.0, 0.5),
    )


def unit_works(shares: list[list[int]], eng: EngineSpec, train_s: float, *, units: int) -> list[IterationWork]:
    """Each iteration's samples (output lengths `shares[i]`) dealt to `units` units in turn, from a unit one further
    each iteration: each unit a part of every iteration that has as many samples as units."""
    works = []
    for i, ls in enumerate(shares):
        unit_of = (np.arange(len(ls)) + i) % units
        mine = {u: np.flatnonzero(unit_of == u) for u in range(units)}
        works.append(
            IterationWork(
                np.zeros(len(ls)),
                np.array(ls, dtype=float) + 3,
                train_s,
                2,
                unit_of=unit_of,
                shares={u: UnitShare(idx, np.array(ls)[idx], eng) for u, idx in mine.items() if len(idx)},
            )
        )
    return works


@given_jobs(min_rows=1)
@settings(max_examples=150, deadline=None)
@example(  # two units' finish times a float rounding apart (CI): the trainer took them as two arrivals
    shares=[[23, 1, 4, 26, 23, 7, 1, 23, 30, 13, 9, 12], [1, 1, 6, 1]],
    cap=3,
    mode="stream",
    eta=1,
    barrier="never",
    compact=None,
    train_s=0.25,
)
def test_the_unit_engines_go_on_from_the_last_iteration_as_if_run_from_the_start(
    shares: list[list[int]], cap: int, mode: str, eta: int, barrier: str, compact: float | None, train_s: float
) -> None:
    """Each unit's engine goes on from where its previous iteration's share was done (later shares are released
    after it) instead of again from the first share: the same timeline, float for float, as the old way; and as
    the old way with the step-by-step engine loop, up to float rounding."""
    eng = EngineSpec(PTL, cap, prefill_s=0.001, compact_fraction=compact, barrier=barrier)  # type: ignore[arg-type]
    works = unit_works(shares, eng, train_s, units=2)
    got = simulate_job(works, mode=mode, weight_sync_s=0.01, eta=eta, drain=min(eta, len(works) - 1))  # type: ignore[arg-type]
    want = {}
    for name, run in (("from_the_start", _FromTheStart), ("step_by_step", _StepByStep)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(simjob, "EngineRun", run)
            want[name] = simulate_job(works, mode=mode, weight_sync_s=0.01, eta=eta, drain=min(eta, len(works) - 1))  # type: ignore[arg-type]
    assert got == want["from_the_start"]  # the same sums
    step = want["step_by_step"]  # one PTL per step: the same up to float rounding
    assert got.train_end_s == pytest.approx(step.train_end_s) and got.gen_end_s == pytest.approx(step.gen_end_s)


def _by_scratch(works: list[IterationWork], *, mode: str, eta: int, drain: int, weight_sync_s: float) -> JobTimeline:
    """`simulate_job` of per-unit shares the way it was first written: each iteration, each unit's engine from the
    start over its shares released by then (`run_groups`), the unit's arrivals set one unit at a time, then the
    learner (no groups, no token budget, nothing at the step: the works below)."""
    ready: list[float] = []
    train_end: list[float] = []
    gen_end: list[float] = []
    unit_gen: list[dict[int, float]] = []

    def release(k: int) -> float:
        return ready[k - 1 - eta] if k - 1 - eta >= 0 else 0.0

    for i, w in enumerate(works[: len(works) - drain]):
        assert w.shares is not None
        arrival = np.empty(len(w.finish_s))
        gens = {}
        for u, share in w.shares.items():
            mine = [k for k in range(min(i + eta, len(works) - 1) + 1) if u in (works[k].shares or {})]
            groups = [Group(release(k), (works[k].shares or {})[u].lengths) for k in mine]
            finish = run_groups(groups, share.engine)[mine.index(i)]
            arrival[share.samples] = finish
            gens[u] = float(finish.max()) - release(i)
        order = np.argsort(arrival, kind="stable")
        s = w.train_s / (float(w.sample_tokens.sum()) or 1.0)
        free = train_end[-1] if train_end else 0.0
        t = learner_train(
            arrival[order], w.sample_tokens[order], w.micro_batch_samples, None, whole=mode == "sync", free=free, s=s
        )
        gen_end.append(float(arrival.max()))
        train_end.append(t)
        ready.append(t + weight_sync_s)
        unit_gen.append(gens)
    return JobTimeline([], gen_end, train_end, ready, unit_gen)


@given_jobs(min_rows=3)
@settings(max_examples=100, deadline=None)
def test_the_job_simulation_is_every_unit_s_engine_run_from_the_start(
    shares: list[list[int]], cap: int, mode: str, eta: int, barrier: str, compact: float | None, train_s: float
) -> None:
    """Three units, each a part of every iteration: the job simulator's timeline (its units' runs going on from
    the last iteration, their arrivals set in one scatter) is, float for float, each unit's run from the start."""
    eng = EngineSpec(PTL, cap, prefill_s=0.001, compact_fraction=compact, barrier=barrier)  # type: ignore[arg-type]
    works = unit_works(shares, eng, train_s, units=3)  # (3 samples or more each: every unit has a share)
    kw = {"mode": mode, "eta": eta, "drain": min(eta, len(works) - 1), "weight_sync_s": 0.01}
    got = simulate_job(works, **kw)  # type: ignore[arg-type]
    want = _by_scratch(works, **kw)  # type: ignore[arg-type]
    assert (got.gen_end_s, got.train_end_s, got.unit_gen_s) == (want.gen_end_s, want.train_end_s, want.unit_gen_s)


def test_a_completion_alone_at_its_step_hands_its_row_on_in_one_heap_operation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row busy and requests waiting: a request that ends alone gives its row to the next one by one heap
    replace, versus a pop and a push (400 heap operations for 200 requests); the same times (the tests above)."""
    calls: list[str] = []
    for name in ("heappush", "heappop", "heapreplace"):
        real = getattr(heapq, name)
        monkeypatch.setattr(engine_mod.heapq, name, lambda *a, _f=real, _n=name: (calls.append(_n), _f(*a))[1])
    lengths = np.arange(1, 201)  # longer and later each: no two requests end at the same step
    (finish,) = run_groups([Group(0.0, lengths)], EngineSpec(PTL, 4, prefill_s=0.001))
    assert np.all(np.diff(finish) > 0)
    assert len(calls) <= 200 + 2 * 4
