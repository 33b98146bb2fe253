"""Algorithm 1 against independent brute force over the same stage curves (ties included)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.planner import alloc

# small integer times make ties frequent; inf marks infeasible counts (e.g. the model does not fit)
times = st.one_of(st.integers(1, 12).map(float), st.just(math.inf))


def curve(values: list[float]) -> np.ndarray:
    return np.array([math.inf, *values])


def brute_single(gen: np.ndarray, train: np.ndarray, n: int) -> tuple[int, int]:
    best: tuple[float, int, int] | None = None
    for x in range(1, n):
        for y in range(1, n - x + 1):
            key = (max(gen[x], train[y]), x + y, x)
            if best is None or key < best:
                best = key
    assert best is not None
    return best[2], best[1] - best[2]


@given(
    st.integers(2, 14).flatmap(
        lambda n: st.tuples(
            st.just(n), st.lists(times, min_size=n, max_size=n), st.lists(times, min_size=n, max_size=n)
        )
    )
)
@settings(max_examples=200, deadline=None)
def test_single_dc_equals_brute_force(case: tuple[int, list[float], list[float]]) -> None:
    n, g, t = case
    gen, train = curve(g), curve(t)
    x_ref, y_ref = brute_single(gen, train, n)
    if not math.isfinite(max(gen[x_ref], train[y_ref])):
        with pytest.raises(ValueError):
            alloc.single_dc(gen, train, n)
        return
    c = alloc.single_dc(gen, train, n)
    assert (c.x, c.y) == (x_ref, y_ref)


def brute_cross(gen: np.ndarray, train: np.ndarray, m: int, n: int) -> tuple[int, int]:
    t_gen, t_train = gen[m], train[n]
    if t_gen < t_train:
        dist = [abs(gen[k] - t_train) for k in range(1, m + 1)]
        return dist.index(min(dist)) + 1, n  # first minimum = smallest k among ties
    dist = [abs(train[k] - t_gen) for k in range(1, n + 1)]
    return m, dist.index(min(dist)) + 1


finite = st.integers(1, 12).map(float)


def two_curves(*, max_gpus: int) -> st.SearchStrategy[tuple[int, int, list[float], list[float]]]:
    """(m, n, m generation times, n training times) with 1 ≤ m, n ≤ max_gpus."""
    return st.integers(1, max_gpus).flatmap(
        lambda m: st.integers(1, max_gpus).flatmap(
            lambda n: st.tuples(
                st.just(m),
                st.just(n),
                st.lists(finite, min_size=m, max_size=m),
                st.lists(finite, min_size=n, max_size=n),
            )
        )
    )


@given(two_curves(max_gpus=12))
@settings(max_examples=200, deadline=None)
def test_cross_dc_equals_brute_force(case: tuple[int, int, list[float], list[float]]) -> None:
    m, n, g, t = case
    c = alloc.cross_dc(curve(g), curve(t), m, n)
    assert (c.x, c.y) == brute_cross(curve(g), curve(t), m, n)


def test_cross_dc_tie_picks_fewest_gpus_and_may_pick_the_slower_side() -> None:
    gen = curve([10.0, 6.0, 4.0, 3.0])  # rollout faster at full allocation (3 < 5)
    train = curve([9.0, 5.0])
    c = alloc.cross_dc(gen, train, 4, 2)
    # |6 − 5| = |4 − 5| = 1: the smaller k (2 GPUs, 6 s: slower than the trainer) wins the tie
    assert (c.x, c.y, c.t_gen_s) == (2, 2, 6.0)
    f = alloc.fewest_gpus(gen, train, m=4, n=2, reference_s=5.0, epsilon=0.0)
    assert (f.x, f.y) == (3, 2)  # fewest GPUs that keep the full-allocation iteration time


def brute_fewest(gen: np.ndarray, train: np.ndarray, m: int, n: int, bound: float) -> int | None:
    sizes = [x + y for x in range(1, m + 1) for y in range(1, n + 1) if max(gen[x], train[y]) <= bound]
    return min(sizes) if sizes else None


@given(
    two_curves(max_gpus=10),
    st.sampled_from([0.0, 0.05, 0.5]),
)
@settings(max_examples=200, deadline=None)
def test_fewest_gpus_equals_brute_force(case: tuple[int, int, list[float], list[float]], eps: float) -> None:
    m, n, g, t = case
    gen, train = curve(g), curve(t)
    ref = max(gen[m], train[n])
    size = brute_fewest(gen, train, m, n, (1 + eps) * ref)
    c = alloc.fewest_gpus(gen, train, m=m, n=n, reference_s=ref, epsilon=eps)
    assert c.x + c.y == size
    assert c.iteration_s <= (1 + eps) * ref * (1 + 1e-9)


def test_combine_rollout_adds_rates_in_fill_order() -> None:
    a = curve([10.0, 5.0])  # site 0: 2 GPUs
    b = curve([20.0, 10.0, 5.0])  # site 1: 3 GPUs
    fill = alloc.fill_table([a, b], [2, 3], order=[1, 0])
    comb = alloc.combine_rollout([a, b], fill)
    assert comb[1:4].tolist() == [20.0, 10.0, 5.0]
    assert comb[4] == pytest.approx(1 / (1 / 5 + 1 / 10))
    assert comb[5] == pytest.approx(1 / (1 / 5 + 1 / 5))
    assert alloc.split_combined(4, fill) == [1, 3]


def test_searched_sites_split_the_gpus_that_reach_them_as_finishes_soonest() -> None:
    """Filled in order (site 1 first: the cheaper), 2 GPUs are site 1's (10 s) though site 0's two take 5 s. Every
    total gets the split with the largest summed rate (brute force over all splits)."""
    a = curve([10.0, 5.0])
    b = curve([20.0, 10.0, 5.0])
    fill = alloc.fill_table([a, b], [2, 3], order=[1, 0], searched=[0, 1])
    # 4 GPUs: 2 + 2 and 1 + 3 tie (1/5 + 1/10): the fill order's, the cheaper site's 3
    assert [alloc.split_combined(k, fill) for k in range(6)] == [[0, 0], [1, 0], [2, 0], [2, 1], [1, 3], [2, 3]]
    assert alloc.split_combined(2, alloc.fill_table([a, b], [2, 3], order=[1, 0])) == [0, 2]  # unsearched
    rng = np.random.default_rng(3)
    for _ in range(30):
        budgets = [int(g) for g in rng.integers(1, 6, size=3)]
        curves = [curve(sorted(rng.uniform(1, 50, size=b).tolist(), reverse=True)) for b in budgets]
        fill = alloc.fill_table(curves, budgets, order=[2, 0, 1], searched=[0, 1, 2])
        comb = alloc.combine_rollout(curves, fill)
        for k in range(1, sum(budgets) + 1):
            splits = [s for s in itertools.product(*(range(b + 1) for b in budgets)) if sum(s) == k]
            best = max(sum(1 / c[g] for c, g in zip(curves, s, strict=True) if g) for s in splits)
            assert 1 / comb[k] == pytest.approx(best, rel=1e-9), (budgets, k)
            assert sum(alloc.split_combined(k, fill)) == k
    # a fixed site (2) first and a shared one (3) last hold their places: only the searched block is split
    fill = alloc.fill_table([a, b, a, a], [2, 3, 2, 2], order=[2, 1, 0, 3], searched=[1, 0])
    assert [alloc.split_combined(k, fill) for k in (2, 4, 8)] == [[0, 0, 2, 0], [2, 0, 2, 0], [2, 3, 2, 1]]
