"""A rollout unit's flight record: how many tokens it has generated that it has not yet written to its
controller link, kept in a small file mapped into the unit's memory, so that it outlives the unit.

A unit killed mid-generation (SIGKILL, the OOM killer) leaves its record in the page cache: what it says then
is what the kill cost, the tokens its generations must decode again elsewhere (every byte the unit wrote
reached the controller: `Connection.end_in_order_on_exit`). The record is exact for engines that add one token
per running row per step (rlctl's embedded engine) but for the microseconds between a step's last token and the
store that counts it; for vLLM, whose rows in a chunked prefill add none, it is an upper bound. It does not
survive the loss of the host.

    steps  decode steps run          unsent  tokens generated and not written to the link
    pid    the unit's process        sent    tokens written to the link (partial reports, samples, withdrawals)

Each field is one aligned 8-byte store; a reader that races a writer may see fields of two adjacent steps.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"rlflight"
LAYOUT = struct.Struct("<8sqqqq")  # magic, pid, steps, unsent, sent


@dataclass(frozen=True)
class Flight:
    pid: int
    steps: int
    unsent: int
    sent: int


class FlightRecord:
    """The writer: a rollout unit's record at `path` (created, or overwritten by a unit of the same name)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, mmap.PAGESIZE)
            self._map = mmap.mmap(fd, mmap.PAGESIZE, mmap.MAP_SHARED)
        finally:
            os.close(fd)
        self.steps = self.unsent = self.sent = 0
        LAYOUT.pack_into(self._map, 0, MAGIC, os.getpid(), 0, 0, 0)

    def stepped(self, tokens: int) -> None:
        """One decode step ran and generated `tokens`."""
        self.steps += 1
        self.unsent += tokens
        struct.pack_into("<qq", self._map, 16, self.steps, self.unsent)

    def wrote(self, tokens: int) -> None:
        """`tokens` of those went into the link."""
        self.unsent = max(self.unsent - tokens, 0)
        self.sent += tokens
        struct.pack_into("<qq", self._map, 24, self.unsent, self.sent)

    def close(self) -> None:
        self._map.close()


def read_flight(path: Path) -> Flight | None:
    """A unit's record as it left it; None when there is none (or not one of these)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < LAYOUT.size:
        return None
    magic, pid, steps, unsent, sent = LAYOUT.unpack_from(data)
    return Flight(pid, steps, unsent, sent) if magic == MAGIC else None
