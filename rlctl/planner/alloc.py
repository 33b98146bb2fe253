"""Algorithm 1 (StreamRL §4.2): how many GPUs each stage gets, over precomputed stage curves.

A curve is an array `c[g]` = predicted stage seconds on g GPUs (index 0 unused, may be inf).

    single_dc(gen, train, n)       min over x + y ≤ n of max(gen[x], train[y]); ties → fewer GPUs, then fewer x
    cross_dc(gen, train, m, n)     the paper's rule: shrink the faster stage to the k whose time is
                                   closest to the other stage's full-allocation time (ties → smaller k)
    fewest_gpus(...)               fewest GPUs keeping max(gen, train) within (1 + ε) of a reference time
    fill_table(curves, ...)        GPUs per rollout site for every total: fixed sites, then the `auto` ones split as
                                   finishes soonest (`best_split`, a DP on the curves' rates), a shared site last
    combine_rollout(curves, table) several rollout sites as one curve: their rates add up
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
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


def fill_table(
    curves: Sequence[np.ndarray], budgets: Sequence[int], order: Sequence[int], *, searched: Collection[int] = ()
) -> np.ndarray:
    """GPUs per rollout site (columns, in input order) for every total k = 0 … Σ budgets (rows): the sites filled
    in `order`, each whole before the next, except that the sites of `searched` (consecutive in `order`: the `auto`
    sites of a job) split the GPUs that reach them as `best_split` says, the split that finishes their share soonest."""
    assert not searched or len(searched) == 1 or _consecutive(order, searched)
    table = np.zeros((sum(budgets) + 1, len(budgets)), dtype=int)
    k0, done = 0, False
    for s in order:
        if s in searched and len(searched) > 1:
            if done:
                continue
            block = [i for i in order if i in searched]
            size = sum(budgets[i] for i in block)
            table[k0 : k0 + size + 1, block] = best_split([curves[i] for i in block], [budgets[i] for i in block])
            table[k0 + size + 1 :, block] = [budgets[i] for i in block]
            k0, done = k0 + size, True
            continue
        table[k0 : k0 + budgets[s] + 1, s] = np.arange(budgets[s] + 1)
        table[k0 + budgets[s] + 1 :, s] = budgets[s]
        k0 += budgets[s]
    return table


def best_split(curves: Sequence[np.ndarray], budgets: Sequence[int]) -> np.ndarray:
    """For every k = 0 … Σ budgets, the GPUs per site (row k) that maximise the sites' summed rate Σ 1/T_s(k_s) over
    Σ k_s = k, k_s ≤ budget_s: the combined curve's own model (`combine_rollout`), so its time at k is the least any
    split gives. Exact, by dynamic programming over the sites (O(k · budget) each); where it gains nothing over
    filling the sites in the given order (within 1e-9), that fill: cheaper sites come first (`search.fill_order`)."""
    rates = [_rate(np.asarray(c[: b + 1], dtype=float)) for c, b in zip(curves, budgets, strict=True)]
    best = rates[0].copy()  # best summed rate of the sites so far at k GPUs
    picks: list[np.ndarray] = []  # GPUs of site i (i ≥ 1) at each k of the best so far
    for r, b in zip(rates[1:], budgets[1:], strict=True):
        new = np.full(len(best) + b, -np.inf)
        pick = np.zeros(len(new), dtype=int)
        for j in range(b + 1):
            cand = best + r[j]
            seg = new[j : j + len(best)]
            better = cand > seg * (1 + 1e-12) + 1e-300  # ties keep the fewer GPUs on later sites
            seg[better] = cand[better]
            pick[j : j + len(best)][better] = j
        picks.append(pick)
        best = new
    total = sum(budgets)
    split = np.zeros((total + 1, len(budgets)), dtype=int)
    ks = np.arange(total + 1)
    for i in range(len(budgets) - 1, 0, -1):
        taken = picks[i - 1][ks]
        split[:, i] = taken
        ks = ks - taken
    split[:, 0] = ks
    prefix = _prefix(budgets, total)
    gain = _summed(rates, split) > _summed(rates, prefix) * (1 + 1e-9)
    return np.where(gain[:, None], split, prefix)


def _rate(c: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        r = np.where(np.isfinite(c) & (c > 0), 1.0 / np.where(c > 0, c, 1.0), 0.0)
    r[0] = 0.0
    return r


def _prefix(budgets: Sequence[int], total: int) -> np.ndarray:
    out = np.zeros((total + 1, len(budgets)), dtype=int)
    ks = np.arange(total + 1)
    for i, b in enumerate(budgets):
        out[:, i] = np.minimum(ks, b)
        ks = ks - out[:, i]
    return out


def _summed(rates: Sequence[np.ndarray], split: np.ndarray) -> np.ndarray:
    return np.sum([r[split[:, i]] for i, r in enumerate(rates)], axis=0)


def _consecutive(order: Sequence[int], chosen: Collection[int]) -> bool:
    at = [i for i, s in enumerate(order) if s in chosen]
    return at == list(range(at[0], at[0] + len(at)))


def combine_rollout(curves: Sequence[np.ndarray], table: np.ndarray) -> np.ndarray:
    """One curve over k total rollout GPUs, split per site as row k of `table` (`fill_table`); rates (1/T) of
    sites add up."""
    rate = np.zeros(len(table))
    for s, c in enumerate(curves):
        c = np.asarray(c, dtype=float)
        with np.errstate(divide="ignore"):
            t = c[table[:, s]]
            rate += np.where(np.isfinite(t) & (table[:, s] > 0), 1.0 / np.where(t > 0, t, 1.0), 0.0)
    with np.errstate(divide="ignore"):
        out = np.where(rate > 0, 1.0 / np.maximum(rate, 1e-300), np.inf)
    out[0] = np.inf
    return out


def split_combined(k: int, table: np.ndarray) -> list[int]:
    """GPUs per rollout site (in input order) for k GPUs of a `combine_rollout` curve."""
    return [int(g) for g in table[k]]
