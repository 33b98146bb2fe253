"""A rollout unit's flight record: the tokens it has generated and those it has written to its controller link,
kept in a small file mapped into the unit's memory, so that it outlives the unit.

A unit killed mid-generation (SIGKILL, the OOM killer) leaves its record in its host's page cache. What it says
then is what the kill cost: the tokens generated and not written, which its generations must decode again
elsewhere (every byte the unit wrote reached the controller: `Connection.end_in_order_on_exit`). Engines say
how many tokens each step added (`GenerationEngine.step_tokens`). The record is exact but for two gaps of
microseconds: between a step's last token and the store that counts it (a kill there counts too few), and
between a write to the link and the store that counts it (too many). It does not survive the loss of the host.

    pid, host           the unit's process
    num_steps           decode steps run
    generated_tokens    tokens its steps added
    sent_tokens         … written to the link (in partial reports, finished samples, withdrawals; each token once)
    dropped_tokens      … of samples and withdrawals the link dropped while it was down (the controller requeues
                        them: an outage's cost, not a kill's)
    unsent_tokens       generated − sent − dropped: what a kill now would cost

Each field is one aligned 8-byte store; a reader that races a writer may see fields of two adjacent steps.
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"rlflight"
LAYOUT = struct.Struct("<8sqqqqq64s")  # magic, pid, num_steps, generated, sent, dropped, host
_COUNTS = struct.Struct("<qqqq")  # num_steps … dropped, after magic and pid
_COUNTS_AT = struct.calcsize("<8sq")


@dataclass(frozen=True)
class Flight:
    pid: int
    host: str
    num_steps: int
    generated_tokens: int
    sent_tokens: int
    dropped_tokens: int

    @property
    def unsent_tokens(self) -> int:
        return self.generated_tokens - self.sent_tokens - self.dropped_tokens


class FlightRecord:
    """The writer: a rollout unit's record at `path`. A new file each time (renamed into place), so a process of
    the same name still running — an orphan during a resume — writes only into its own."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            # the page written out, not a hole: a full disk fails here, not as SIGBUS at a later store
            header = LAYOUT.pack(MAGIC, os.getpid(), 0, 0, 0, 0, socket.gethostname().encode()[:64])
            os.write(fd, header.ljust(mmap.PAGESIZE, b"\0"))
            self._map = mmap.mmap(fd, mmap.PAGESIZE, mmap.MAP_SHARED)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        self.num_steps = self.generated = self.sent = self.dropped = 0

    def stepped(self, tokens: int) -> None:
        """One decode step ran and added `tokens`."""
        self.num_steps += 1
        self.generated += tokens
        self._store()

    def wrote(self, tokens: int, *, dropped: bool = False) -> None:
        """`tokens` not written before went into the link (`dropped`: out with a sample or withdrawal the link
        dropped while it was down)."""
        if dropped:
            self.dropped += tokens
        else:
            self.sent += tokens
        self._store()

    def _store(self) -> None:
        _COUNTS.pack_into(self._map, _COUNTS_AT, self.num_steps, self.generated, self.sent, self.dropped)

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
    magic, pid, num_steps, generated, sent, dropped, host = LAYOUT.unpack_from(data)
    if magic != MAGIC:
        return None
    return Flight(pid, host.rstrip(b"\0").decode(errors="replace"), num_steps, generated, sent, dropped)
