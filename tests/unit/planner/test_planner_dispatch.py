"""LPT order, balanced assignment and Algorithm 2 against references and brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.planner import dispatch as dispatch_mod
from rlctl.planner.dispatch import (
    assign_balanced,
    dispatch_skew,
    eq2_latency_s,
    fixed_split,
    lpt_order,
    skew_split,
)


def test_lpt_order_longest_first_ties_by_index() -> None:
    assert lpt_order([3, 9, 1, 9, 4]) == [1, 3, 4, 0, 2]
    assert lpt_order([]) == []


def test_assign_balanced_known_instance() -> None:
    # Graham's example: LPT on 2 machines with jobs 3,3,2,2,2 gives loads 7 / 5 (optimum 6 / 6).
    units = assign_balanced([3, 3, 2, 2, 2], 2)
    assert units == [[0, 2, 4], [1, 3]]
    loads = [sum([3, 3, 2, 2, 2][i] for i in u) for u in units]
    assert loads == [7, 5]


def _reference_lpt(jobs: list[int], m: int) -> list[int]:
    """Textbook LPT: sort descending, give each job to the machine with the least load (lowest index)."""
    loads = [0] * m
    for j in sorted(jobs, reverse=True):
        k = min(range(m), key=lambda i: (loads[i], i))
        loads[k] += j
    return sorted(loads)


@given(st.lists(st.integers(1, 50), min_size=1, max_size=40), st.integers(1, 6))
@settings(max_examples=150, deadline=None)
def test_assign_balanced_matches_reference_lpt(jobs: list[int], m: int) -> None:
    units = assign_balanced(jobs, m)
    assert sorted(i for u in units for i in u) == list(range(len(jobs)))
    assert sorted(sum(jobs[i] for i in u) for u in units) == _reference_lpt(jobs, m)
    for u in units:  # inside each unit: longest first
        assert [jobs[i] for i in u] == sorted((jobs[i] for i in u), reverse=True)


def _ptl(bs: int) -> float:
    return 0.01 + 0.0004 * bs  # flat-then-linear decode like DESIGN §10


def _brute_force(pred: list[float], n_units: int, alpha: float, rule: str, kv: int) -> tuple[int, float]:
    """Independent Algorithm 2: every N_l, Eq. 2 written out, L_α = P90 and L_r = P50 of the predictions."""
    n = len(pred)
    k = round(alpha * n)
    srt = sorted(pred, reverse=True)
    long, reg = srt[:k], srt[k:]
    la, lr = float(np.percentile(pred, 90)), float(np.percentile(pred, 50))

    def lat(m_total: int, length: float, units: int) -> float:
        if m_total == 0:
            return 0.0
        if units == 0:
            return math.inf
        m = math.ceil(m_total / units)
        bs = max(1, min(m, kv))
        return _ptl(bs) * length * math.ceil(m / bs)

    best = (0, lat(n, (len(long) * la + len(reg) * lr) / n, n_units))
    for nl in range(1, n_units + 1):
        a, b = lat(len(long), la, nl), lat(len(reg), lr, n_units - nl)
        t = a + b if rule == "sum" else max(a, b)
        if t < best[1]:
            best = (nl, t)
    return best


@given(
    st.lists(st.integers(1, 20000), min_size=1, max_size=120),
    st.integers(1, 12),
    st.sampled_from(["sum", "max"]),
    st.sampled_from([0.1, 0.2, 0.3]),
    st.integers(1, 64),
)
@settings(max_examples=200, deadline=None)
def test_skew_split_equals_brute_force_eq2(pred: list[int], n_units: int, rule: str, alpha: float, kv: int) -> None:
    sp = skew_split(
        [float(p) for p in pred], num_units=n_units, ptl_s=_ptl, max_batch=lambda _len: kv, alpha=alpha, rule=rule
    )  # type: ignore[arg-type]
    nl, t = _brute_force([float(p) for p in pred], n_units, alpha, rule, kv)
    assert sp.num_long == nl
    assert sp.latency_s == t
    assert sp.num_long + sp.num_regular == n_units
    assert sorted(sp.long_ids + sp.regular_ids) == list(range(len(pred)))


def test_skew_split_chooses_no_split_when_dedicated_unit_is_the_bottleneck() -> None:
    # Two units, heavy tail, a KV bound that forces the long-tail unit into many rounds: N_l = 0 wins.
    pred = [20000.0] * 20 + [1000.0] * 80
    sp = skew_split(pred, num_units=2, ptl_s=_ptl, max_batch=lambda length: 4 if length > 5000 else 64, rule="max")
    assert sp.num_long == 0 and sp.num_regular == 2
    assert dict(sp.candidates)[1] > dict(sp.candidates)[0]


def test_skew_split_uses_dedicated_units_when_they_pay() -> None:
    # Many units, few long samples: isolating them at batch 1..2 beats mixing them into big batches.
    pred = [20000.0] * 4 + [500.0] * 400
    sp = skew_split(
        pred, num_units=8, ptl_s=_ptl, max_batch=lambda _len: 256, alpha=0.01, rule="max", length_estimate="mean"
    )
    assert skew_split(pred, num_units=8, ptl_s=_ptl, max_batch=lambda _len: 256, alpha=0.01).num_long == 0  # P90/P50
    assert sp.num_long >= 1
    units = dispatch_skew(pred, sp)
    assert len(units) == 8
    assert all(pred[i] == 20000.0 for u in units[: sp.num_long] for i in u)


def test_eq2_latency_rounds() -> None:
    assert eq2_latency_s(10, 100.0, 2, ptl_s=lambda b: 1.0, max_batch=lambda _len: 2) == 100.0 * 3
    assert eq2_latency_s(0, 100.0, 0, ptl_s=lambda b: 1.0, max_batch=lambda _len: 2) == 0.0
    assert eq2_latency_s(1, 100.0, 0, ptl_s=lambda b: 1.0, max_batch=lambda _len: 2) == math.inf


def test_fixed_split_takes_top_alpha() -> None:
    sp = fixed_split([1, 5, 3, 9, 7], num_units=3, num_long=1, alpha=0.4, long_batch=2, regular_batch=8)
    assert sp.long_ids == [3, 4] and sp.regular_ids == [1, 2, 0]
    assert (sp.num_long, sp.num_regular, sp.long_batch) == (1, 2, 2)


def test_lpt_order_of_a_planner_batch_is_one_stable_numpy_sort_in_the_same_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Longest first, ties in index order (zeros, −0.0, repeated integers), as Python's stable reverse sort gives;
    past 64 items by numpy's stable argsort of the negated values, versus a Python key call per item."""
    rng = np.random.default_rng(3)
    cases = []
    for n in (65, 100, 1000, 16384):
        for trial in range(20):
            a = rng.integers(0, 50, n).astype(float) if trial % 2 else rng.lognormal(7, 1, n)
            if trial % 3 == 0:
                a[rng.integers(0, n, n // 4)] = 0.0
                a[rng.integers(0, n, 3)] = -0.0
            cases.append((a, sorted(range(n), key=a.tolist().__getitem__, reverse=True)))
    monkeypatch.setattr(dispatch_mod, "sorted", lambda *a, **k: pytest.fail("a Python sort"), raising=False)
    for a, want in cases:
        assert lpt_order(a.tolist()) == want
        assert lpt_order(a) == want
