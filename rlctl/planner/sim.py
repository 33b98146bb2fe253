"""Discrete-event simulation of one generation stage: rollout instances with continuous batching.

One instance (a DP unit) runs at most `batch_cap` sequences; every decode step takes PTL(active)
seconds and advances each active sequence by one token; a finished sequence frees its slot at
once and the next queued sample is admitted (its prefill stalls the step, chunked-prefill style).
Between two completions the batch is constant, so the simulation jumps from completion to
completion: O(M log BS) per instance. Instances are independent once the batch is dispatched.

    dispatch policy ──▶ per-unit queues (admission order: LPT by prediction, or FIFO)
                              │
    unit 0: [slots ≤ BS] ─ step ─ step ─ … ─▶ finish times (streamed to the trainer)
    unit 1: …
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from rlctl.planner.costs import DecodeCost
from rlctl.planner.dispatch import (
    Rule,
    SkewSplit,
    assign_balanced,
    dispatch_skew,
    fixed_split,
    lpt_order,
    skew_split,
)

Policy = Literal["random", "skew_aware", "oracle", "balanced"]
Estimate = Literal["quantile", "mean", "simulate"]  # Alg. 2 cost model: Eq. 2 (P90/P50, group means) or simulator


def run_instance(
    lengths: Sequence[int] | np.ndarray,
    *,
    ptl_s: np.ndarray,
    batch_cap: int,
    prefill_s: float = 0.0,
    admit_fixed_s: float = 0.0,
    compact_fraction: float | None = None,
) -> np.ndarray:
    """Finish time (s) of each sample, admitted in the given order with continuous batching.

    A step with admissions pays `admit_fixed_s` + `prefill_s` per admitted sample. A step costs
    PTL(rows): with `compact_fraction=None` rows = running sequences (finished ones leave at once,
    as in vLLM); otherwise finished rows stay in the batch until nothing waits and at least that
    fraction of the rows is free (the embedded engine's lazy compaction, DESIGN §10).
    """
    n = len(lengths)
    finish = np.zeros(n)
    if n == 0:
        return finish
    cap = max(1, min(batch_cap, len(ptl_s) - 1))
    if n <= 8 and n <= batch_cap and compact_fraction is None:  # the same closed form, without numpy overhead
        order_small = sorted(range(n), key=lambda i: int(lengths[i]))
        t, prev = admit_fixed_s + n * prefill_s, 0
        for k, i in enumerate(order_small):
            cur = int(lengths[i])
            t += (cur - prev) * float(ptl_s[n - k])
            finish[i] = t
            prev = cur
        return finish
    if n <= cap and compact_fraction is None:  # everyone admitted at once: closed form over sorted lengths
        order = np.argsort(lengths, kind="stable")
        srt = np.asarray(lengths, dtype=float)[order]
        steps = np.diff(np.concatenate(([0.0], srt)))
        active = n - np.arange(n)  # sequences alive during each segment
        finish[order] = admit_fixed_s + n * prefill_s + np.cumsum(steps * ptl_s[active])
        return finish
    lens_a = np.asarray(lengths).astype(np.int64)
    if compact_fraction is None and n > 64 and int(lens_a.min()) >= 1:  # fewer: numpy's overhead costs more
        return _run_full(lens_a, ptl_s=np.asarray(ptl_s, dtype=float), cap=cap, admit_s=(admit_fixed_s, prefill_s))
    # event to event in plain Python numbers (numpy scalars cost more than the events); the same sums in order
    ptl = [float(x) for x in ptl_s]
    lens = lens_a.tolist()
    out = [0.0] * n
    heap: list[tuple[int, int]] = []
    t, step, nxt, rows = 0.0, 0, 0, 0
    while True:
        admitted = 0
        while nxt < n and len(heap) < cap:
            heapq.heappush(heap, (step + lens[nxt], nxt))
            nxt += 1
            admitted += 1
        if admitted:
            t += admit_fixed_s + admitted * prefill_s
        if not heap:
            return np.array(out, dtype=float)
        rows = len(heap) if compact_fraction is None else max(rows, len(heap))  # admissions reuse free rows
        end = heap[0][0]
        if compact_fraction is not None and nxt >= n and rows - len(heap) >= compact_fraction * rows:
            # the queue just drained: the engine compacts after this first step (what finishes in it gone
            # first), not at the next completion
            t += ptl[rows]
            step += 1
            while heap and heap[0][0] == step:
                out[heapq.heappop(heap)[1]] = t
            rows = len(heap)
            if not heap:
                continue
        t += (end - step) * ptl[rows]
        step = end
        while heap and heap[0][0] == end:
            out[heapq.heappop(heap)[1]] = t
        # after the step, like the engine: drop all rows if all are free; compact if nothing waits
        if not heap or (compact_fraction is not None and nxt >= n and rows - len(heap) >= compact_fraction * rows):
            rows = len(heap)


def _run_full(lens: np.ndarray, *, ptl_s: np.ndarray, cap: int, admit_s: tuple[float, float]) -> np.ndarray:
    """`run_instance` without compaction, more samples than rows, every length ≥ 1: the event loop's sums, in its
    order, without its per-request heap of tuples and Python floats.

    The steps alone are list scheduling: the first `cap` samples start at step 0 and sample i ≥ cap at the
    step the earliest running one ends (one int heap). Every event (a step where samples end) then adds
    (end − previous) × PTL(rows) and, if it admits a samples, admit_fixed_s + a × prefill_s; those terms in
    event order, summed left to right by `np.cumsum` (sequential, as the loop's `t +=`), give the same times."""
    admit_fixed_s, prefill_s = admit_s
    n = len(lens)
    ls = lens.tolist()
    heap = ls[:cap]
    heapq.heapify(heap)
    starts = [0] * n
    replace_min = heapq.heapreplace
    for i in range(cap, n):
        s = heap[0]
        starts[i] = s
        replace_min(heap, s + ls[i])
    start = np.array(starts, dtype=np.int64)
    end = start + lens
    events, of_event = np.unique(end, return_inverse=True)  # the steps where samples end, ascending
    # rows during the segment before event j: started at or before the previous event (starts ascend: each is the
    # heap's minimum, which only grows), not ended by then
    prev = np.concatenate(([0], events[:-1]))
    rows = np.searchsorted(start, prev, side="right") - np.searchsorted(np.sort(end), prev, side="right")
    admitted = np.bincount(np.searchsorted(events, start[cap:]), minlength=len(events))
    terms = np.empty(2 * len(events) + 1)
    terms[0] = admit_fixed_s + cap * prefill_s
    terms[1::2] = (events - prev) * ptl_s[rows]
    terms[2::2] = np.where(admitted > 0, admit_fixed_s + admitted * prefill_s, 0.0)
    t = np.cumsum(terms)
    return t[1::2][of_event]


@dataclass(frozen=True)
class Unit:
    """One rollout DP unit: where it lives and what its decode costs."""

    site: str
    cost: DecodeCost


@dataclass
class GenResult:
    finish_s: np.ndarray  # per sample, seconds after the batch was dispatched
    unit_of: np.ndarray  # per sample, index of the unit that generated it
    unit_busy_s: np.ndarray  # per unit, time of its last completion
    num_long_units: int
    splits: dict[str, tuple[int, int]] = field(default_factory=dict)  # site → (N_l, long-tail batch) used
    queues: dict[int, tuple[list[int], int]] = field(default_factory=dict)  # unit → (samples in admission order, cap)

    @property
    def makespan_s(self) -> float:
        return float(self.finish_s.max()) if self.finish_s.size else 0.0


def run_with(
    cost: DecodeCost, lengths: Sequence[int] | np.ndarray, *, batch_cap: int, prompt_tokens: int
) -> np.ndarray:
    """`run_instance` with a unit's measured engine figures: PTL, prefill, admission cost, compaction."""
    return run_instance(
        lengths,
        ptl_s=cost.ptl_s,
        batch_cap=batch_cap,
        prefill_s=prompt_tokens * cost.prefill_s_per_token,
        admit_fixed_s=cost.admit_fixed_s,
        compact_fraction=cost.compact_fraction,
    )


def _proportional_counts(weights: np.ndarray, n: int) -> np.ndarray:
    raw = weights / weights.sum() * n
    counts = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - counts), kind="stable")[: n - counts.sum()]:
        counts[i] += 1
    return counts


@dataclass(frozen=True)
class DispatchConfig:
    """How a batch is spread over units; `force_long_units` bypasses Algorithm 2's search."""

    policy: Policy = "skew_aware"
    alpha: float = 0.2
    rule: Rule = "max"
    force_long_units: int | None = None
    force_long_batch: int | None = None
    length_estimate: Estimate = "simulate"


def simulate_generation(
    lengths: np.ndarray,
    pred: np.ndarray,
    units: Sequence[Unit],
    dispatch: DispatchConfig,
    *,
    prompt_tokens: int = 0,
    rng: np.random.Generator | None = None,
    keep_splits: dict[str, tuple[int, int]] | None = None,
) -> GenResult:
    """Generate one batch on `units`. Sites with different GPUs get samples in proportion to their speed.

    - random: shuffled, equal counts per unit, FIFO inside a unit, full batch cap;
    - balanced: LPT across units by predicted tokens, LPT inside (Algorithm 2 forced to N_l = 0);
    - skew_aware: Algorithm 2 on the predictions per site, LPT inside each unit;
    - oracle: skew_aware with the true lengths as predictions.
    `keep_splits` (site → (N_l, long-tail batch), e.g. `GenResult.splits` of an earlier batch) skips
    Algorithm 2 and reuses a split, as a controller that re-plans only now and then would.
    """
    rng = rng or np.random.default_rng(0)
    policy = dispatch.policy
    n = len(lengths)
    if policy == "oracle":
        pred = lengths.astype(float)
    finish = np.zeros(n)
    unit_of = np.zeros(n, dtype=int)
    busy = np.zeros(len(units))
    num_long = 0
    used: dict[str, tuple[int, int]] = {}
    queues: dict[int, tuple[list[int], int]] = {}
    # group units by site: one decode cost per site; split samples across sites by throughput
    sites: dict[str, list[int]] = {}
    for u, unit in enumerate(units):
        sites.setdefault(unit.site, []).append(u)
    speed = np.array(
        [
            len(us) * units[us[0]].cost.max_batch / units[us[0]].cost.ptl(units[us[0]].cost.max_batch)
            for us in sites.values()
        ]
    )
    order = lpt_order(pred.tolist()) if policy != "random" else list(rng.permutation(n))
    counts = _proportional_counts(speed, n)
    # deal samples round-robin by weight so every site gets a share of long and short ones
    site_ids: list[list[int]] = [[] for _ in sites]
    if len(sites) == 1:
        site_ids[0] = [int(i) for i in order]
    else:  # plain floats: a numpy add and argmax per sample cost more than the dealing
        share = [float(c) / max(n, 1) for c in counts]
        credit = [0.0] * len(sites)
        for i in order:
            for k, add in enumerate(share):
                credit[k] += add
            s = max(range(len(credit)), key=credit.__getitem__)  # the first of equals, as argmax
            site_ids[s].append(int(i))
            credit[s] -= 1.0
    for (site, us), ids in zip(sites.items(), site_ids, strict=True):
        cost = units[us[0]].cost
        if not ids:
            continue
        sub_pred = pred[ids]
        caps = [cost.max_batch] * len(us)
        if policy == "random":
            groups = [list(range(j, len(ids), len(us))) for j in range(len(us))]
        elif policy == "balanced":
            groups = assign_balanced(sub_pred.tolist(), len(us))
        else:
            # D for Algorithm 2: the length distribution (known from recent iterations; here this batch's)
            if keep_splits is not None and site in keep_splits:
                nl, bl = keep_splits[site]
                split = fixed_split(
                    sub_pred.tolist(),
                    num_units=len(us),
                    num_long=nl,
                    alpha=dispatch.alpha,
                    long_batch=bl,
                    regular_batch=cost.max_batch,
                )
            else:
                split = site_split(
                    sub_pred, cost, len(us), dispatch, prompt_tokens=prompt_tokens, length_dist=lengths[ids]
                )
            used[site] = (split.num_long, split.long_batch)
            groups = dispatch_skew(sub_pred.tolist(), split)
            caps = [split.long_batch] * split.num_long + [cost.max_batch] * split.num_regular
            num_long += split.num_long
        for u, grp, cap in zip(us, groups, caps, strict=True):
            if not grp:
                continue
            idx = [ids[j] for j in grp]
            if policy != "random":
                idx = [idx[j] for j in lpt_order(pred[idx].tolist())]
            f = run_with(cost, lengths[idx], batch_cap=cap, prompt_tokens=prompt_tokens)
            finish[idx] = f
            queues[u] = (idx, cap)
            unit_of[idx] = u
            busy[u] = f.max() if len(f) else 0.0
    return GenResult(finish, unit_of, busy, num_long, used, queues)


def _kv_bound(cost: DecodeCost, prompt_tokens: int) -> Callable[[float], int]:
    return lambda length: cost.batch_bound(prompt_tokens + length)


def site_split(
    pred: np.ndarray,
    cost: DecodeCost,
    num_units: int,
    dispatch: DispatchConfig,
    *,
    prompt_tokens: int,
    length_dist: np.ndarray | None = None,
) -> SkewSplit:
    """Algorithm 2 for one site's units: forced, Eq. 2 based, or chosen by simulating the candidates."""
    bound = _kv_bound(cost, prompt_tokens)
    if dispatch.force_long_units is not None:
        return fixed_split(
            pred.tolist(),
            num_units=num_units,
            num_long=dispatch.force_long_units,
            alpha=dispatch.alpha,
            long_batch=dispatch.force_long_batch or cost.max_batch,
            regular_batch=cost.max_batch,
        )
    if dispatch.length_estimate != "simulate":
        return skew_split(
            pred.tolist(),
            num_units=num_units,
            ptl_s=cost.ptl,
            max_batch=bound,
            alpha=dispatch.alpha,
            rule=dispatch.rule,
            length_estimate=dispatch.length_estimate,
        )
    return split_by_simulation(
        pred, cost, num_units, alpha=dispatch.alpha, prompt_tokens=prompt_tokens, length_dist=length_dist
    )


def split_by_simulation(
    pred: np.ndarray,
    cost: DecodeCost,
    num_units: int,
    *,
    alpha: float,
    prompt_tokens: int,
    length_dist: np.ndarray | None = None,
    max_candidates: int = 12,
) -> SkewSplit:
    """Algorithm 2 with the simulator as the cost model: simulate each N_l on rank-mapped lengths.

    The ranker is trusted for the order only (StreamRL §5.2): sample k-th in predicted order gets
    the k-th longest length of the distribution D (`length_dist`, e.g. recent iterations' lengths;
    default: the predictions themselves).

    Eq. 2 prices a group by PTL(BS) × L_avg × rounds; it cannot see that continuous batching
    shrinks the batch as short samples finish, nor that one long sample sets a unit's makespan.
    Simulating the candidate splits (at most `max_candidates`, geometrically spaced) sees both.
    Ties keep fewer long-tail units; with no more samples than units no split can help (N_l = 0).
    """
    n = len(pred)
    if n <= num_units or num_units < 2:
        return fixed_split(
            pred.tolist(), num_units=num_units, num_long=0, alpha=alpha, long_batch=0, regular_batch=cost.max_batch
        )
    if num_units <= max_candidates:
        cands = list(range(num_units))
    else:
        cands = sorted({0, *np.unique(np.geomspace(1, num_units - 1, max_candidates - 1).round().astype(int))})
    dist = np.sort(np.asarray(length_dist if length_dist is not None else pred, dtype=float))[::-1]
    dist = dist[np.minimum((np.arange(n) * len(dist)) // n, len(dist) - 1)]  # n quantiles of D, descending
    ints = np.empty(n, dtype=np.int64)
    ints[lpt_order(pred.tolist())] = np.maximum(np.rint(dist), 1).astype(np.int64)
    n_long = round(alpha * n)
    long_len = float(dist[:n_long].mean()) if n_long else 0.0
    best: tuple[float, SkewSplit] | None = None
    tried = []
    for nl in cands:
        bs_long = max(1, min(-(-n_long // nl), cost.batch_bound(prompt_tokens + long_len))) if nl else 0
        split = fixed_split(
            pred.tolist(),
            num_units=num_units,
            num_long=int(nl),
            alpha=alpha,
            long_batch=bs_long,
            regular_batch=cost.max_batch,
        )
        t = simulate_split(ints, pred, cost, split, prompt_tokens=prompt_tokens)
        tried.append((int(nl), t))
        if best is None or t < best[0]:
            best = (t, split)
    assert best is not None
    return replace(best[1], latency_s=best[0], candidates=tried)


def simulate_split(
    lengths: np.ndarray, pred: np.ndarray, cost: DecodeCost, split: SkewSplit, *, prompt_tokens: int
) -> float:
    """Makespan of one site's identical units under a given split (LPT by prediction inside each unit)."""
    groups = dispatch_skew(pred.tolist(), split)
    caps = [split.long_batch] * split.num_long + [cost.max_batch] * split.num_regular
    return max(
        (
            float(run_with(cost, lengths[g], batch_cap=c, prompt_tokens=prompt_tokens).max())
            for g, c in zip(groups, caps, strict=True)
            if g
        ),
        default=0.0,
    )


class GenEstimator:
    """Fast P_gen for Algorithm 1: the slowest instance of N identical ones, simulated once per M.

    With balanced (LPT) dispatch every instance gets one sample from each stratum of N consecutive
    lengths (sorted descending); the slowest gets the longest of each. We simulate that
    representative instance with continuous batching and LPT order, cached by M = ⌈B / N⌉.
    """

    def __init__(self, lengths_desc: np.ndarray, cost: DecodeCost, *, prompt_tokens: int) -> None:
        self.lengths = np.asarray(lengths_desc, dtype=float)
        self.cost = cost
        self.prompt_tokens = prompt_tokens
        self._cache: dict[int, float] = {}

    def time_s(self, num_units: int) -> float:
        b = len(self.lengths)
        m = -(-b // max(num_units, 1))
        if m not in self._cache:
            pick = self.lengths[np.floor(np.arange(m) * (b / m)).astype(int)]
            f = run_with(
                self.cost, pick.astype(np.int64), batch_cap=self.cost.max_batch, prompt_tokens=self.prompt_tokens
            )
            self._cache[m] = float(f.max())
        return self._cache[m]
