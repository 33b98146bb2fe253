"""`migration.plan`: who gives how much to whom."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from rlctl.agents.migration import Cost, Load, plan, split_pays
from rlctl.config import load_job
from rlctl.planner.plan import make_plan


def test_waiting_requests_go_to_free_rows_and_an_idle_unit_takes_half_of_a_busy_one():
    loads = [Load("a", 3, 10), Load("b", 3, 2), Load("c", 3, 0)]
    # c (idle) first takes as many of a's 6 waiting requests as fit (4); a is then busy with that move
    assert plan(loads, {}, batch=4) == [("a", "c", 4)]
    assert plan([Load("a", 3, 5), Load("b", 3, 0)], {}, batch=8) == [("a", "b", 2)]  # the long tail: half
    assert plan([Load("a", 3, 1), Load("b", 3, 0)], {}, batch=8) == []  # one request: nothing to share


def test_pending_moves_count_as_done_and_leave_both_units_alone():
    loads = [Load("a", 3, 10), Load("b", 3, 0), Load("c", 3, 0)]
    assert plan(loads, {"a": ("b", 4)}, batch=4) == []  # c may take from neither a nor b while a → b is pending
    loads = [Load("a", 3, 10), Load("b", 3, 0), Load("c", 3, 8), Load("d", 3, 0)]
    assert plan(loads, {"a": ("b", 4)}, batch=4) == [("c", "d", 4)]


def test_no_work_goes_to_a_unit_on_older_weights():
    assert plan([Load("a", 3, 10), Load("b", 2, 0)], {}, batch=4) == []
    assert plan([Load("a", 2, 10), Load("b", 3, 0)], {}, batch=4) == [("a", "b", 4)]


def cost(step_at_1: float, per_row: float, *, prefill: float = 1e-4, max_batch: int = 64) -> Cost:
    """A decode step of `step_at_1` s at batch 1, growing by `per_row` s per row (the planner's PTL(BS) shape)."""
    return Cost(tuple(step_at_1 + per_row * (b - 1) for b in range(1, max_batch + 1)), prefill)


def test_a_tail_is_split_only_where_the_cost_model_says_it_pays():
    flat = cost(0.020, 0.00001)  # memory-bound: 8 rows cost hardly more than 4
    steep = cost(0.002, 0.002)  # compute-bound: each row adds a step's worth
    # 8 running requests, 100 steps left each, 300 tokens each to prefill again
    for c, moves in ((flat, []), (steep, [("a", "b", 4)])):
        loads = [Load("a", 3, 8, c, 100.0, 300.0), Load("b", 3, 0, c, None, 0.0)]
        assert plan(loads, {}, batch=16) == moves, c
    # a few steps left: the prefill is not paid back even where a step grows with the batch
    assert plan([Load("a", 3, 8, steep, 1.0, 300.0), Load("b", 3, 0, steep)], {}, batch=16) == []
    # no estimate of the steps left (nothing finished yet) or no cost (a site the plan does not price): counts
    assert plan([Load("a", 3, 8, flat, None, 300.0), Load("b", 3, 0, flat)], {}, batch=16) == [("a", "b", 4)]
    assert plan([Load("a", 3, 8, None, 100.0, 300.0), Load("b", 3, 0, flat)], {}, batch=16) == [("a", "b", 4)]


def test_waiting_requests_move_whatever_the_cost():
    flat = cost(0.020, 0.00001)
    loads = [Load("a", 3, 20, flat, 100.0, 300.0), Load("b", 3, 0, flat, None, 0.0)]
    assert plan(loads, {}, batch=16) == [("a", "b", 4)]  # the 4 beyond a's batch wait: they go


def test_split_pays_weighs_steps_saved_against_the_prefill():
    c = cost(0.002, 0.002, prefill=1e-3)
    d, r = Load("a", 3, 8, c, 10.0, 100.0), Load("b", 3, 0, c)
    # saved per step: ptl(8) − max(ptl(4), ptl(4)) = 0.016 − 0.008 = 0.008 s; × 10 steps = 0.08 s
    # prefill: 4 requests × 100 tokens × 1e-3 s = 0.4 s: does not pay; at 100 steps (0.8 s) it does
    assert not split_pays(d, r, 8, 4)
    assert split_pays(Load("a", 3, 8, c, 100.0, 100.0), r, 8, 4)


def test_the_plan_carries_each_rollout_sites_decode_cost() -> None:
    plan = make_plan(load_job(Path(__file__).resolve().parents[3] / "jobs" / "demo.yaml"))
    rows = [a for a in plan["allocation"] if a["role"] == "rollout"]
    c = Cost.from_plan(rows[0]["decode"])
    assert c is not None and len(c.ptl_s) == rows[0]["max_batch"] and c.prefill_s_per_token > 0
    assert all(a <= b for a, b in zip(c.ptl_s, c.ptl_s[1:], strict=False))  # a larger batch never steps faster


def test_a_donor_is_measured_only_where_its_work_may_be_split_with_an_idle_unit():
    """`measure` gives a load its running requests' figures (reading each request it runs): asked of the donor an idle
    unit would split with, once, and the moves are those of loads that had them all along."""
    steep = cost(0.002, 0.002)
    figures = {"a": (100.0, 300.0), "c": (1.0, 300.0)}  # a's split pays, c's does not (a few steps left)
    asked: list[str] = []

    def measure(load: Load) -> Load:
        asked.append(load.name)
        return replace(load, remaining_steps=figures[load.name][0], tokens_per_request=figures[load.name][1])

    counts = [Load("a", 3, 8, steep), Load("b", 3, 0, steep), Load("c", 3, 6, steep), Load("d", 3, 5, steep)]
    whole = [replace(u, remaining_steps=figures.get(u.name, (None, 0.0))[0]) for u in counts]
    whole = [replace(u, tokens_per_request=figures.get(u.name, (None, 0.0))[1]) for u in whole]
    assert plan(counts, {}, batch=16, measure=measure) == plan(whole, {}, batch=16) == [("a", "b", 4)]
    assert asked == ["a"]  # b is the one idle unit, a the donor it splits with: c and d are never read
    asked.clear()
    assert plan([Load("a", 3, 8, steep), Load("b", 3, 2, steep)], {}, batch=16, measure=measure) == []
    assert asked == []  # no unit idle: nothing to split, nothing read


def _plan_scanning_all(loads: list[Load], pending: dict[str, tuple[str, int]], *, batch: int) -> list:
    """`plan` as it was, looking for a donor for every receiver (units² a look): what it must still answer."""
    held = {u.name: u.held for u in loads}
    for donor, (to, n) in pending.items():
        if donor in held and to in held:
            held[donor], held[to] = held[donor] - n, held[to] + n
    busy = set(pending) | {to for to, _ in pending.values()}
    moves = []
    for r in sorted(loads, key=lambda u: held[u.name]):
        room = batch - held[r.name]
        donors = [d for d in loads if d.name != r.name and d.name not in busy and d.version <= r.version]
        d = max(donors, key=lambda u: held[u.name], default=None)
        if room <= 0 or d is None:
            continue
        if held[d.name] > batch:
            n = min(held[d.name] - batch, room)
        elif held[r.name] == 0 and held[d.name] >= 2:
            n = held[d.name] // 2
            if not split_pays(d, r, held[d.name], n):
                continue
        else:
            continue
        busy.add(d.name)
        held[d.name], held[r.name] = held[d.name] - n, held[r.name] + n
        moves.append((d.name, r.name, n))
    return moves


@pytest.mark.parametrize("seed", range(300))
def test_a_busy_receiver_looks_for_no_donor_when_no_unit_holds_more_than_its_batch_and_the_moves_stay(seed: int):
    rng = random.Random(seed)
    batch = rng.choice([1, 2, 4, 8])
    costs = [None, cost(0.020, 0.00001), cost(0.002, 0.002)]
    loads = []
    for i in range(rng.randint(1, 9)):  # idle, busy and past their batch; priced or not; a tail's steps known or not
        held, steps = rng.choice([0, 0, 1, rng.randint(0, 2 * batch + 2)]), rng.choice([None, rng.uniform(0, 200)])
        loads.append(Load(f"u{i}", rng.randint(0, 2), held, rng.choice(costs), steps, rng.uniform(0, 400)))
    names = [u.name for u in loads]
    pending = {}
    for _ in range(rng.randint(0, 2)):
        d, to = rng.sample(names, 2) if len(names) > 1 else (names[0], names[0])
        pending[d] = (to, rng.randint(1, batch + 1))
    assert plan(loads, pending, batch=batch) == _plan_scanning_all(loads, pending, batch=batch)
