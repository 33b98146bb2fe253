"""The learner's micro-batch rule on row lengths alone (no torch: the simulator prices it too).

rows (prompt + output tokens) ─▶ length order ─▶ cuts of ≤ `size` rows and, with `max_tokens`,
≤ `max_tokens` padded tokens (rows × the longest row; a longer row goes alone)
                               ─▶ `trainable_cuts`: all of them but a partial last one, unless flushing
"""

from __future__ import annotations

from collections.abc import Sequence


def cut_lengths(row_tokens: Sequence[int | float], size: int, *, max_tokens: int | None = None) -> list[list[int]]:
    """Indices of the rows in length order (ties: index order), cut into micro-batches."""
    out: list[list[int]] = []
    cur: list[int] = []
    for i in sorted(range(len(row_tokens)), key=lambda i: row_tokens[i]):
        n = row_tokens[i]
        if cur and (len(cur) == size or (max_tokens is not None and (len(cur) + 1) * n > max_tokens)):
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def trainable_cuts(
    row_tokens: Sequence[int | float], size: int, *, max_tokens: int | None = None, flush: bool
) -> tuple[list[list[int]], list[int]]:
    """(the cuts the learner trains now, the rows it holds): the last cut may still grow with the next
    arrivals, so it waits unless it is full or this flushes (the iteration is in)."""
    cuts = cut_lengths(row_tokens, size, max_tokens=max_tokens)
    held = cuts.pop() if cuts and not flush and len(cuts[-1]) < size else []
    return cuts, held
