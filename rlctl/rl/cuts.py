"""The learner's micro-batch rule on row lengths alone (no torch: the simulator and planner price it too).

rows (prompt + output tokens) ─▶ length order ─▶ cuts over `ranks` data-parallel ranks, each rank's share (every
                               `ranks`-th row: rlctl.rl.learner.backward_share) ≤ `size` rows and, with `max_tokens`,
                               ≤ `max_tokens` padded tokens (its rows × its longest row; a longer row alone)
                               ─▶ `trainable_cuts`: all of them but a partial last one, unless flushing
                                  (`reduce_per_step`: but the last one, full or not, unless flushing)

At pipeline parallel pp > 1 each cut's rows (on one data-parallel rank) are split into
`pipeline_chunks(rows, pp)` chunks that overlap across the stages (GPipe inside the cut,
rlctl.trainers.megatron.pipeline); the planner's trainer time prices the same number
(rlctl.planner.costs.train_time_s).
"""

from __future__ import annotations

from collections.abc import Sequence

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


def _closes(rows: int, n: int | float, size: int, max_tokens: int | None, ranks: int) -> bool:
    """Whether a cut of `rows` rows (in length order) is closed before a row of `n` tokens: that row would go to rank
    rows % ranks as its share's longest, one row more than the share held, past `size` rows or, padded, `max_tokens`
    (a share's first row goes in whatever its length)."""
    mine = rows // ranks + 1  # the share's rows with it
    return mine > size or (max_tokens is not None and mine > 1 and mine * n > max_tokens)


def cut_lengths(
    row_tokens: Sequence[int | float], size: int, *, max_tokens: int | None = None, ranks: int = 1
) -> list[list[int]]:
    """Indices of the rows in length order (ties: index order), cut into micro-batches over `ranks` data-parallel
    ranks: each rank takes every `ranks`-th row of a cut (`rlctl.rl.learner.backward_share`), so its share holds at
    most `size` rows and pads to at most `max_tokens` tokens (its rows × its longest row; a longer row alone), the
    budgets a GPU's memory sets (verl's ppo_micro_batch_size_per_gpu and ppo_max_token_len_per_gpu). Until
    2026-12-07 they bounded the whole cut, which its ranks then divided: at dp 8 rows of 3,000 tokens in cuts of
    8,192 left 6 of 8 ranks idle."""
    out: list[list[int]] = []
    cur: list[int] = []
    for i in sorted(range(len(row_tokens)), key=row_tokens.__getitem__):
        if cur and _closes(len(cur), row_tokens[i], size, max_tokens, ranks):
            out.append(cur)
            cur = []
        cur.append(i)
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
        last = cur = 0
        for i, v in enumerate(sorted_tokens):
            if cur and _closes(cur, v, size, max_tokens, ranks):
                last, cur = i, 0
            cur += 1
    return last if n and not flush and (reduce_per_step or n - last < full) else n
