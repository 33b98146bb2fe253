"""Dispatch of a batch of prompts to rollout DP units: LPT order, balanced assignment, Algorithm 2.

These are pure functions shared by the planner, the simulator and the runtime controller:

    lpt_order(pred)              indices, longest predicted first (admission order inside a unit)
    assign_balanced(tokens, n)   LPT across n units by predicted tokens (Graham's 4/3 rule)
    skew_split(pred, ...)        StreamRL Algorithm 2: how many units get the long-tail samples

Algorithm 2 evaluates every split N_l + N_r = N with Eq. 2,
`Latency = PTL(BS) × L_avg × ⌈M / BS⌉`, BS = min(M, KV bound at L_avg), and keeps the best.
N_l = 0 (no dedicated long-tail unit: everything balanced by predicted tokens) is always a
candidate, because on small-batch hardware the dedicated unit can become the bottleneck (DESIGN §10).
`rule="sum"` adds the two groups' latencies as the paper writes it; `rule="max"` takes the makespan.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

Rule = Literal["sum", "max"]
LengthEstimate = Literal["quantile", "mean"]


def lpt_order(pred_lengths: Sequence[float]) -> list[int]:
    """Indices in descending predicted length; ties keep the original (ascending index) order."""
    if len(pred_lengths) > 64:  # numpy's stable sort of the negated values: the same order, without a key per item
        return np.argsort(-np.asarray(pred_lengths, dtype=float), kind="stable").tolist()
    values = [float(x) for x in pred_lengths]  # plain floats: comparing numpy scalars dominates the sort
    return sorted(range(len(values)), key=values.__getitem__, reverse=True)  # stable: ties keep index order


def assign_balanced(
    pred_tokens: Sequence[float], num_units: int, *, loads: Sequence[float] | None = None
) -> list[list[int]]:
    """LPT across units: longest first, each to the least-loaded unit (lowest index on ties); `loads`: the
    work each unit already holds (default none).

    Each unit's list is in LPT order, so it is also the admission order inside the unit.
    """
    if num_units < 1:
        raise ValueError(f"num_units must be ≥ 1, got {num_units}")
    if loads is not None and len(loads) != num_units:
        raise ValueError(f"{len(loads)} loads for {num_units} units")
    units: list[list[int]] = [[] for _ in range(num_units)]
    heap = [(0.0 if loads is None else float(loads[u]), u) for u in range(num_units)]
    heapq.heapify(heap)
    tokens = [float(x) for x in pred_tokens]
    for i in lpt_order(tokens):
        load, u = heap[0]  # the least loaded (distinct units: the same one whatever the heap's layout)
        units[u].append(i)
        heapq.heapreplace(heap, (load + tokens[i], u))
    return units


def eq2_latency_s(
    num_prompts: int,
    avg_len: float,
    num_units: int,
    *,
    ptl_s: Callable[[int], float],
    max_batch: Callable[[float], int],
) -> float:
    """Eq. 2 for one group spread evenly over `num_units`: PTL(BS) × L_avg × ⌈M / BS⌉ (M per unit)."""
    if num_prompts == 0:
        return 0.0
    if num_units == 0:
        return math.inf
    m = math.ceil(num_prompts / num_units)
    bs = max(1, min(m, max_batch(avg_len)))
    return ptl_s(bs) * avg_len * math.ceil(m / bs)


@dataclass(frozen=True)
class SkewSplit:
    """Result of Algorithm 2. `long_ids`/`regular_ids` index the input; batches are per unit."""

    num_long: int
    num_regular: int
    long_ids: list[int]
    regular_ids: list[int]
    long_len: float
    regular_len: float
    long_batch: int
    regular_batch: int
    latency_s: float
    rule: Rule
    candidates: list[tuple[int, float]] = field(default_factory=list)  # (N_l, estimated seconds)


def skew_split(
    pred_lengths: Sequence[float],
    *,
    num_units: int,
    ptl_s: Callable[[int], float],
    max_batch: Callable[[float], int],
    alpha: float = 0.2,
    rule: Rule = "max",
    length_estimate: LengthEstimate = "quantile",
    length_dist: Sequence[float] | None = None,
) -> SkewSplit:
    """Algorithm 2: split `num_units` into N_l long-tail and N_r regular units (N_l = 0 allowed).

    `length_estimate="quantile"` uses the paper's L_α = P90(D), L_r = P50(D) (D = `length_dist`,
    default the predictions) in Eq. 2. `"mean"` uses each group's mean predicted length (its token
    mass: what a small-batch long-tail unit must carry at its lower throughput) and bounds each
    group below by its critical path, PTL(BS) × the longest predicted length in it — Eq. 2 alone
    cannot see that the longest sample decodes at the batch's PTL whatever the average is.
    """
    if num_units < 1:
        raise ValueError(f"num_units must be ≥ 1, got {num_units}")
    n = len(pred_lengths)
    order = lpt_order(pred_lengths)
    n_long = round(alpha * n)
    long_ids, regular_ids = order[:n_long], order[n_long:]
    pred = np.asarray(pred_lengths, dtype=float)
    if length_estimate == "quantile":
        dist = np.asarray(length_dist if length_dist is not None else pred, dtype=float)
        l_long = float(np.percentile(dist, 90)) if dist.size else 0.0
        l_reg = float(np.percentile(dist, 50)) if dist.size else 0.0
    else:
        l_long = float(pred[long_ids].mean()) if long_ids else 0.0
        l_reg = float(pred[regular_ids].mean()) if regular_ids else 0.0
    # N_l = 0: one group of every prompt, with the mixture of the two length estimates.
    l_mix = (len(long_ids) * l_long + len(regular_ids) * l_reg) / n if n else 0.0
    crit = length_estimate == "mean"
    top_all = float(pred.max()) if crit and n else 0.0
    top_reg = float(pred[regular_ids].max()) if crit and regular_ids else 0.0

    def group_s(count: int, length: float, units: int, longest: float) -> float:
        t = eq2_latency_s(count, length, units, ptl_s=ptl_s, max_batch=max_batch)
        if crit and count and units and math.isfinite(t):
            m = math.ceil(count / units)
            t = max(t, ptl_s(max(1, min(m, max_batch(length)))) * longest)
        return t

    best_nl = 0
    best = group_s(n, l_mix, num_units, top_all)
    candidates = [(0, best)]
    for nl in range(1, num_units + 1):
        nr = num_units - nl
        t_long = group_s(len(long_ids), l_long, nl, top_all)
        t_reg = group_s(len(regular_ids), l_reg, nr, top_reg)
        total = t_long + t_reg if rule == "sum" else max(t_long, t_reg)
        candidates.append((nl, total))
        if total < best:
            best, best_nl = total, nl
    if best_nl == 0:
        m = math.ceil(n / num_units) if n else 0
        bs = max(1, min(m, max_batch(l_mix)))
        return SkewSplit(0, num_units, [], order, l_long, l_reg, 0, bs, best, rule, candidates)
    nr = num_units - best_nl
    m_long = math.ceil(len(long_ids) / best_nl) if long_ids else 0
    m_reg = math.ceil(len(regular_ids) / nr) if nr and regular_ids else 0
    return SkewSplit(
        best_nl,
        nr,
        long_ids,
        regular_ids,
        l_long,
        l_reg,
        max(1, min(m_long, max_batch(l_long))),
        max(1, min(m_reg, max_batch(l_reg))) if nr else 0,
        best,
        rule,
        candidates,
    )


def dispatch_skew(pred_lengths: Sequence[float], split: SkewSplit) -> list[list[int]]:
    """Per-unit sample lists for a split: long-tail units first, each group balanced by predicted tokens."""
    pred = list(pred_lengths)
    if split.num_long == 0:
        return assign_balanced(pred, split.num_regular)
    units: list[list[int]] = []
    for ids, count in ((split.long_ids, split.num_long), (split.regular_ids, split.num_regular)):
        if count == 0:
            continue
        for unit in assign_balanced([pred[i] for i in ids], count):
            units.append([ids[j] for j in unit])
    return units


def fixed_split(
    pred_lengths: Sequence[float],
    *,
    num_units: int,
    num_long: int,
    alpha: float = 0.2,
    long_batch: int,
    regular_batch: int,
) -> SkewSplit:
    """A split with a given N_l (e.g. the paper's split taken literally), without the Eq. 2 search."""
    if not 0 <= num_long < num_units:
        raise ValueError(f"num_long must be in [0, {num_units - 1}], got {num_long}")
    order = lpt_order(pred_lengths)
    n_long = round(alpha * len(order)) if num_long else 0
    return SkewSplit(
        num_long,
        num_units - num_long,
        order[:n_long],
        order[n_long:],
        0.0,
        0.0,
        long_batch if num_long else 0,
        regular_batch,
        math.nan,
        "max",
    )
