"""`search_min` and `search_first`: the searches of the `simulated` allocation rule, on functions with known
answers."""

from __future__ import annotations

from collections import Counter

from rlctl.planner.search import search_first, search_min


def _counted(f):  # type: ignore[no-untyped-def]
    calls: Counter[int] = Counter()

    def g(x: int) -> float:
        calls[x] += 1
        return float(f(x))

    return g, calls


def test_a_unimodal_function_s_minimum_is_found_with_few_evaluations_each_once() -> None:
    xs = list(range(1, 128))
    for m in (1, 2, 37, 64, 100, 127):
        f, calls = _counted(lambda x, m=m: (x - m) ** 2)
        assert search_min(f, xs, grid=9) == m
        assert max(calls.values()) == 1 and len(calls) <= 9 + 2 * 7  # grid, then two halvings a round


def test_ties_go_to_the_fewer_rollout_gpus() -> None:
    assert search_min(lambda x: 5.0, [3, 4, 5, 6], grid=9) == 3
    # a tie within float rounding is a tie (a trainer-bound async iteration, the same beside 2 or 9 rollout GPUs)
    noisy = {2: 41.64567477256537, 9: 41.645674772565364}
    assert search_min(lambda x: noisy.get(x, 41.64567477256537), list(range(1, 13)), grid=9) == 1
    assert search_min(lambda x: noisy.get(x, 55.0), list(range(1, 13)), grid=12) == 2
    assert search_min(lambda x: min(abs(x - 10), 4), list(range(1, 40)), grid=5) == 10


def test_a_seed_off_the_grid_is_evaluated_and_its_neighbourhood_searched() -> None:
    xs = list(range(1, 101))
    dip = {41: 2.0, 42: 1.0, 43: 2.0}  # a narrow dip the 5-point grid (1, 26, 50, 75, 100) misses
    assert search_min(lambda x: dip.get(x, 10.0 + x), xs, grid=5) == 1
    assert search_min(lambda x: dip.get(x, 10.0 + x), xs, grid=5, seeds=[41]) == 42


def test_uneven_candidates_and_a_short_list() -> None:
    xs = [8, 16, 24, 40, 64, 72, 120]  # feasible counts need not be contiguous
    assert search_min(lambda x: abs(x - 40), xs, grid=9) == 40
    assert search_min(lambda x: abs(x - 70), xs, grid=3) == 72


def test_the_first_count_that_holds_is_found_by_bisection() -> None:
    xs = [1, 2, 4, 8, 16, 24, 32]
    for k in xs:
        ok, calls = _counted(lambda x, k=k: x >= k)
        assert search_first(ok, xs) == k
        assert sum(calls.values()) <= 3  # ⌈log2 7⌉
    assert search_first(lambda x: False, xs) == 32  # the last is taken to hold (the full allocation)
    assert search_first(lambda x: True, [5]) == 5
