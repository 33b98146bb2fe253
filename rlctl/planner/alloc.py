"""Algorithm 1 (StreamRL §4.2): how many GPUs each stage gets, over precomputed stage curves.

A curve is an array `c[g]` = predicted stage seconds on g GPUs (index 0 unused, may be inf).

    single_dc(gen, train, n)       min over x + y ≤ n of max(gen[x], train[y]); ties → fewer GPUs, then fewer x
    cross_dc(gen, train, m, n)     the paper's rule: shrink the faster stage to the k whose time is
                                   closest to the other stage's full-allocation time (ties → smaller k)
    fewest_gpus(...)               fewest GPUs keeping max(gen, train) within (1 + ε) of a reference time
    combine_rollout(curves, ...)   several rollout sites as one curve: fill the most cost-effective first
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Choice:
    x: int  # rollout GPUs
    y: int  # trainer GPUs
    t_gen_s: float
    t_train_s: float

    @property
    def iteration_s(self) -> float:
        return max(self.t_gen_s, self.t_train_s)


def prefix_min(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Running minimum over c[1..g] and the first index reaching it."""
    vals = np.minimum.accumulate(np.where(np.arange(len(c)) == 0, np.inf, c))
    idx = np.zeros(len(c), dtype=int)
    for g in range(1, len(c)):
        idx[g] = g if c[g] < vals[g - 1] else idx[g - 1]
    return vals, idx


def single_dc(gen: np.ndarray, train: np.ndarray, n: int) -> Choice:
    """Exact Algorithm 1 for one shared budget in O(n log n) (prefix minima + binary search)."""
    if n < 2:
        raise ValueError(f"a shared site needs at least 2 GPUs (one per stage), has {n}")
    tmin, targ = prefix_min(np.asarray(train[:n], dtype=float))
    neg = -tmin[1:]  # non-decreasing: for searchsorted
    best: tuple[float, int, int] | None = None
    choice = (0, 0)
    for x in range(1, n):
        g = float(gen[x])
        if not math.isfinite(g):
            continue
        cap = n - x
        if tmin[cap] <= g:  # the fewest trainer GPUs whose time does not exceed g
            y = int(np.searchsorted(neg, -g, side="left")) + 1
            t = g
        else:
            y, t = int(targ[cap]), float(tmin[cap])
        key = (t, x + y, x)
        if best is None or key < best:
            best, choice = key, (x, y)
    if best is None or not math.isfinite(best[0]):
        raise ValueError("no feasible (x, y): every split has an infinite stage time")
    x, y = choice
    return Choice(x, y, float(gen[x]), float(train[y]))


def cross_dc(gen: np.ndarray, train: np.ndarray, m: int, n: int) -> Choice:
    """The paper's cross-datacenter rule (Algorithm 1, second half)."""
    t_gen, t_train = float(gen[m]), float(train[n])
    if t_gen < t_train:
        k = 1 + int(np.argmin(np.abs(np.asarray(gen[1 : m + 1], dtype=float) - t_train)))
        return Choice(k, n, float(gen[k]), t_train)
    k = 1 + int(np.argmin(np.abs(np.asarray(train[1 : n + 1], dtype=float) - t_gen)))
    return Choice(m, k, t_gen, float(train[k]))


def _first_at_most(c: np.ndarray, bound: float, hi: int) -> int | None:
    ok = np.nonzero(np.asarray(c[1 : hi + 1], dtype=float) <= bound)[0]
    return int(ok[0]) + 1 if ok.size else None


def fewest_gpus(
    gen: np.ndarray, train: np.ndarray, *, m: int, n: int, reference_s: float, epsilon: float, shared: bool = False
) -> Choice:
    """Fewest GPUs (x + y) with max(gen[x], train[y]) ≤ (1 + ε)·reference; x ≤ m, y ≤ n (x + y ≤ n if shared)."""
    bound = (1.0 + epsilon) * reference_s * (1 + 1e-12)
    x = _first_at_most(gen, bound, m if not shared else n - 1)
    y = _first_at_most(train, bound, n if not shared else n - 1)
    if x is None or y is None or (shared and x + y > n):
        raise ValueError(f"no allocation within {epsilon:.0%} of {reference_s:.3g} s")
    return Choice(x, y, float(gen[x]), float(train[y]))


def combine_rollout(curves: Sequence[np.ndarray], budgets: Sequence[int], order: Sequence[int]) -> np.ndarray:
    """One curve over k total rollout GPUs: sites filled in `order`; rates (1/T) of sites add up."""
    total = sum(budgets)
    out = np.full(total + 1, np.inf)
    base_rate = 0.0
    k0 = 0
    for s in order:
        c = np.asarray(curves[s][1 : budgets[s] + 1], dtype=float)
        with np.errstate(divide="ignore"):
            rate = base_rate + np.where(np.isfinite(c), 1.0 / c, 0.0)
            out[k0 + 1 : k0 + budgets[s] + 1] = np.where(rate > 0, 1.0 / np.maximum(rate, 1e-300), np.inf)
        base_rate = float(rate[-1]) if len(rate) else base_rate
        k0 += budgets[s]
    return out


def split_combined(k: int, budgets: Sequence[int], order: Sequence[int]) -> list[int]:
    """GPUs per rollout site (in input order) for k GPUs of a `combine_rollout` curve."""
    out = [0] * len(budgets)
    for s in order:
        out[s] = min(k, budgets[s])
        k -= out[s]
    return out
