"""The learner's micro-batch rule on row lengths alone (no torch: the simulator and planner price it too).

rows (prompt + output tokens) ─▶ length order ─▶ cuts over `ranks` data-parallel ranks, each rank's share a
                               contiguous run of the order (`share_rows`: rlctl.rl.learner.backward_share) ≤ `size`
                               rows and, with `max_tokens`, ≤ `max_tokens` padded tokens (its rows × its longest
                               row; a longer row alone)
                               ─▶ `trainable_cuts`: all of them but a partial last one, unless flushing
                                  (`reduce_per_step`: but the last one, full or not, unless flushing)

At pipeline parallel pp > 1 each cut's rows (on one data-parallel rank) are split into
`pipeline_chunks(rows, pp)` chunks that overlap across the stages (GPipe inside the cut,
rlctl.trainers.megatron.pipeline); the planner's trainer time prices the same number
(rlctl.planner.costs.train_time_s).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# Pipeline chunks per stage in one cut. A cut of m chunks over pp stages takes m + pp − 1 chunk-steps of
# compute instead of m: a bubble of (pp − 1)/m (pp = 2: 1/4 at 2 per stage, against 1 stage by stage).
# More chunks shrink the bubble but make every stage's GEMMs smaller (fewer rows each, less efficient on
# a GPU) and add a message per chunk and stage each way; the activations of the whole cut are held until
# its backward either way (GPipe), so memory does not change with it. Measured on CPU (`python -m bench
# pipeline-parallel`'s cut of 8 rows, 10M parameters, pp 2): m = 1, 2, 4, 8 chunks took 0.52, 0.40, 0.37,
# 0.39 s (pp 1: 0.48 s).
CHUNKS_PER_STAGE = 2


def pipeline_chunks(rows: int, pp: int) -> int:
    """How many chunks a cut of `rows` rows is split into at pipeline parallel `pp`: CHUNKS_PER_STAGE per
    stage, at most one per row (1 when pp = 1: nothing to overlap)."""
    return 1 if pp == 1 else max(1, min(rows, CHUNKS_PER_STAGE * pp))


def _fits(rows: int, n: int | float, size: int, max_tokens: int | None) -> bool:
    """Whether a share of `rows` rows (in length order) takes a row of `n` tokens as its longest: one row more, within
    `size` rows and, padded, `max_tokens` (a share's first row goes in whatever its length)."""
    return rows == 0 or (rows < size and (max_tokens is None or (rows + 1) * n <= max_tokens))


def _greedy(tokens: Sequence[int | float], size: int, max_tokens: int | None) -> list[int]:
    """Rows of each share as the rows in length order fill them one after another up to the budgets."""
    out = [0]
    for n in tokens:
        if not _fits(out[-1], n, size, max_tokens):
            out.append(0)
        out[-1] += 1
    return out


def _run_padding(tokens: Sequence[int | float], size: int) -> np.ndarray:
    """[i, m − 1]: the padded tokens of a run of m ≤ `size` rows from row i of rows in length order (m × its last
    row's length; inf past the cut's end). Non-decreasing along m, so the rows a run from i takes within a cap are
    the count of its entries within it."""
    lengths = np.asarray(tokens, dtype=float)
    n = len(lengths)
    m = np.arange(1, min(size, n) + 1)
    last = np.arange(n)[:, None] + m - 1
    return np.where(last < n, m * lengths[np.minimum(last, n - 1)], np.inf)


def _fill(padding: np.ndarray, cap: float, *, most: int) -> list[int]:
    """Rows of each run as the rows in length order fill them one after another to the budgets and `cap` padded
    tokens a run (`_run_padding`'s `padding`; a run's first row goes in whatever its length): `_greedy` with the cap,
    stopped past `most` runs."""
    rows = np.maximum(1, (padding <= cap).sum(axis=1)).tolist()
    out: list[int] = []
    i = 0
    while i < len(rows) and len(out) <= most:
        out.append(rows[i])
        i += rows[i]
    return out


def share_rows(tokens: Sequence[int | float], size: int, *, max_tokens: int | None = None, ranks: int = 1) -> list[int]:
    """How many rows of a cut (its rows' lengths in order, `cut_lengths`') each of `ranks` ranks takes, rank 0 the
    first: contiguous runs of the length order, so a share pads little. A full cut is `ranks` shares filled one after
    another to the budgets (`size` rows, `max_tokens` padded tokens: its rows × its longest, a longer row alone); a
    cut that fill leaves a rank without a share of (a step's last: the flush's remainder) is split into `ranks` runs
    balanced by padded tokens (the busiest rank's fewest), a rank without a row only where the cut has fewer rows
    than ranks. Before 2026-12-07 a rank took every
    `ranks`-th row, a share spanning the whole cut's lengths: 1.46–1.49× its real tokens computed at dp 2 against
    1.25–1.27× at dp 1 (the sim-accuracy bench's task)."""
    filled = _greedy(tokens, size, max_tokens) if tokens else []
    if len(filled) >= ranks:
        assert len(filled) == ranks, "a cut of more shares than ranks"
        return filled
    # the fewest padded tokens a share such that `ranks` runs take the cut: a share's padding is one of its rows ×
    # its last (longest) row's length
    # (in numpy: a cut of 1,024 rows at 32 a rank into 33 to 256 runs took 18-20 ms with the caps a Python set and the
    # fill a loop over the rows, which the planner pays at every dp it prices: `planner.costs.TrainWorkload.cuts_at`)
    padding = _run_padding(tokens, size)
    budget = math.inf if max_tokens is None else max_tokens
    caps = np.unique(padding[np.isfinite(padding)]).tolist()
    lo, hi = 0, len(caps) - 1  # the largest cap fits: `filled` is within it
    while lo < hi:
        mid = (lo + hi) // 2
        if len(_fill(padding, min(caps[mid], budget), most=ranks)) <= ranks:
            hi = mid
        else:
            lo = mid + 1
    out = _fill(padding, min(caps[lo], budget), most=len(tokens)) if tokens else []
    while len(out) < min(ranks, len(tokens)):  # more ranks than runs: split the busiest run of several rows
        i = max((i for i, r in enumerate(out) if r > 1), key=lambda i: out[i] * tokens[sum(out[: i + 1]) - 1])
        out[i : i + 1] = [out[i] - out[i] // 2, out[i] // 2]
    return out + [0] * (ranks - len(out))


def busiest_padded(tokens: Sequence[int | float], size: int, *, max_tokens: int | None = None, ranks: int = 1) -> float:
    """The padded tokens (its rows × its longest row) of the busiest rank's share of one cut whose rows' lengths, in
    order, are `tokens` (`share_rows`): a rank computes its share padded to its longest row (`rl.samples.make_batch`),
    and the cut takes as long as its busiest share (every rank waits for it at the step's reduction)."""
    out, start = 0.0, 0
    for rows in share_rows(tokens, size, max_tokens=max_tokens, ranks=ranks):
        if rows:
            out = max(out, rows * tokens[start + rows - 1])
            start += rows
    return out


def step_padded_tokens(
    row_tokens: Sequence[int | float], size: int, *, max_tokens: int | None = None, ranks: int = 1
) -> float:
    """The busiest share's padded tokens (`busiest_padded`) summed over the cuts of a step's rows (`cut_lengths`): what
    a rank of `ranks` computes in the step, the slowest setting each cut's time."""
    return sum(
        busiest_padded([row_tokens[i] for i in cut], size, max_tokens=max_tokens, ranks=ranks)
        for cut in cut_lengths(row_tokens, size, max_tokens=max_tokens, ranks=ranks)
    )


def share_slice(
    tokens: Sequence[int | float], size: int, *, max_tokens: int | None = None, ranks: int = 1, rank: int
) -> slice:
    """Rank `rank`'s share of a cut whose rows (in order) are `tokens` long (`share_rows`): what it trains of the
    cut (`rlctl.rl.learner.Learner.backward_share`, `rlctl.rl.ppo.PpoLearner`)."""
    rows = share_rows(tokens, size, max_tokens=max_tokens, ranks=ranks)
    start = sum(rows[:rank])
    return slice(start, start + rows[rank])


def cut_lengths(
    row_tokens: Sequence[int | float], size: int, *, max_tokens: int | None = None, ranks: int = 1
) -> list[list[int]]:
    """Indices of the rows in length order (ties: index order), cut into micro-batches over `ranks` data-parallel
    ranks: a cut is `ranks` shares, contiguous runs of the order each rank trains (`share_rows`), filled one after
    another, each to at most `size` rows and `max_tokens` padded tokens (its rows × its longest row; a longer row
    alone), the budgets a GPU's memory sets (verl's ppo_micro_batch_size_per_gpu and ppo_max_token_len_per_gpu); the
    cut closes where its last share is full. Until 2026-12-07 (morning) the budgets bounded the whole cut, which its
    ranks then divided: at dp 8 rows of 3,000 tokens in cuts of 8,192 left 6 of 8 ranks idle; then until the evening
    each rank took every `ranks`-th row of a cut."""
    out: list[list[int]] = []
    cur: list[int] = []
    share = rows = 0  # the share being filled (of the cut's), its rows
    for i in sorted(range(len(row_tokens)), key=row_tokens.__getitem__):
        if not _fits(rows, row_tokens[i], size, max_tokens):
            share, rows = share + 1, 0
            if share == ranks:
                out.append(cur)
                cur, share = [], 0
        cur.append(i)
        rows += 1
    if cur:
        out.append(cur)
    return out


def trainable_cuts(
    row_tokens: Sequence[int | float],
    size: int,
    *,
    max_tokens: int | None = None,
    ranks: int = 1,
    flush: bool,
    reduce_per_step: bool = False,
) -> tuple[list[list[int]], list[int]]:
    """(the cuts the learner trains now, the rows it holds): the last cut may still grow with the next
    arrivals, so it waits unless it is full or this flushes (the iteration is in). `reduce_per_step` (FSDP2
    reducing the gradients in a step's last cut alone, `DataParallel.reduce_per_step`): which cut is last is
    known at the flush alone, so the last cut waits for it, full or not."""
    cuts = cut_lengths(row_tokens, size, max_tokens=max_tokens, ranks=ranks)
    held = cuts.pop() if cuts and not flush and (reduce_per_step or len(cuts[-1]) < size * ranks) else []
    return cuts, held


def trained_count(
    sorted_tokens: Sequence[int | float],
    size: int,
    *,
    max_tokens: int | None = None,
    ranks: int = 1,
    flush: bool,
    reduce_per_step: bool = False,
) -> int:
    """How many of the rows `trainable_cuts` trains now, of rows given in length order (ascending): it trains
    them in that order, the first ones, and holds the rest (a partial last cut; with `reduce_per_step` the last
    cut, full or not). The rule on the lengths alone, without the indices (the simulator's learner, thousands of
    times a plan)."""
    n, full = len(sorted_tokens), size * ranks
    if max_tokens is None:
        last = (n - 1) // full * full if n else 0  # the last cut starts there
    else:
        last = share = rows = 0
        for i, v in enumerate(sorted_tokens):
            if not _fits(rows, v, size, max_tokens):
                share, rows = share + 1, 0
                if share == ranks:
                    last, share = i, 0
            rows += 1
    return last if n and not flush and (reduce_per_step or n - last < full) else n
