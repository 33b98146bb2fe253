"""Sorting more rows than should be held at once: the whole merge of the controller site's events
(`record._merge_lines`) sorts every event of a job, hundreds of MB after a week, where a `rlctl status` or the
launcher runs.

    add(row) ─▶ heap of ≤ BUDGET_BYTES ─▶ the smallest ─▶ a sorted run in `spill` (a temporary file)
    rows()   ─▶ the heap sorted (nothing spilled), or every run merged, each read a block at a time

A row goes to the current run where it sorts after the last row the run was given, else to the next (replacement
selection): rows that come mostly in order, as events do (the operator's file, a merge's output, then the site's,
in the order its controller wrote them), make a run or two whatever their number; rows in any order make runs of
about BUDGET_BYTES each, merged holding one block of each.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterator
from typing import IO

Row = tuple[float, int, int, str]  # (time, side, line number, text): compared as tuples, the text never newline
BUDGET_BYTES = 1 << 20  # the rows held at once, as `_cost` counts them
ROW_BYTES = 200  # what a held row costs besides its text: the tuple, its time and numbers, the text's header
BLOCK_BYTES = 16 << 10  # a run is read back this many bytes at a time


class SpillSort:
    """The rows `add`ed, in order, from `rows()`; at most about BUDGET_BYTES of them held (see the module)."""

    def __init__(self, spill: IO[bytes]) -> None:
        self.spill = spill  # empty, binary; the caller's to close
        self.spilled = False  # whether a row is in it
        self.heap: list[tuple[int, Row]] = []  # (run, row)
        self.held_bytes = 0
        self.run = 0  # the run being written
        self.last: Row | None = None  # the last row written to it
        self.ends: list[int] = []  # where each run ended in the spill

    def add(self, row: Row) -> None:
        heapq.heappush(self.heap, (self.run if self.last is None or row > self.last else self.run + 1, row))
        self.held_bytes += _cost(row)
        while self.held_bytes > BUDGET_BYTES:
            self._write_smallest()

    def rows(self) -> Iterator[Row]:
        """Every row added, sorted."""
        if not self.spilled:  # all held
            yield from (row for _, row in sorted(self.heap))
            return
        while self.heap:
            self._write_smallest()
        self.ends.append(self.spill.tell())
        self.spill.flush()
        fd = self.spill.fileno()
        yield from heapq.merge(
            *(_run(fd, start, end) for start, end in zip([0, *self.ends[:-1]], self.ends, strict=True))
        )

    def _write_smallest(self) -> None:
        self.spilled = True
        run, row = heapq.heappop(self.heap)
        self.held_bytes -= _cost(row)
        if run != self.run:
            self.ends.append(self.spill.tell())
            self.run = run
        t, side, n, text = row
        self.spill.write(f"{t.hex()}\t{side}\t{n}\t{text}\n".encode("utf-8", "surrogatepass"))
        self.last = row


def _cost(row: Row) -> int:
    return ROW_BYTES + len(row[3])


def _run(fd: int, start: int, end: int) -> Iterator[Row]:
    """The rows the spill `fd` holds from `start` to `end`, read a block at a time."""
    head: list[bytes] = []  # the start of a row the blocks read so far hold
    while start < end:
        block = os.pread(fd, min(BLOCK_BYTES, end - start), start)
        assert block, "the spill ended before its run"
        start += len(block)
        records = block.split(b"\n")
        if len(records) == 1:
            head.append(block)
            continue
        records[0] = b"".join([*head, records[0]])
        head = [records.pop()]
        for record in records:
            t, side, n, text = record.decode("utf-8", "surrogatepass").split("\t", 3)
            yield float.fromhex(t), int(side), int(n), text
