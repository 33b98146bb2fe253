"""The job's sample log: samples.jsonl in the controller's job dir, one line per sample of every round the ledger
retired (`Ledger.retire`), as the ledger held it last — its state, unit, versions, output tokens, reward and when
it was dispatched, finished, delivered and trained (`entry_row`, the rows of a checkpoint's ledger.json).

    round complete ─▶ Ledger.retire ─▶ ControllerCore.on_retire ─▶ SampleLog.write (appended, flushed)
    checkpoint due ─▶ ledger.json (the rounds in flight) + state.json `samples_log_bytes` = SampleLog.size()
    launch --resume v ─▶ SampleLog.cut(v's samples_log_bytes): the lines past it (rounds retired after the
                         checkpoint, whose samples this run trains again) move to samples.discarded.jsonl; the
                         rounds v's ledger holds trained (`ControllerCore.restore` retires them) follow the cut, kept
                         where an earlier resume from v wrote them

The ledger keeps only the rounds in flight, since a job runs for weeks (a sample takes ≈ 340–370 bytes here on disk,
instead of ≈ 1.5 kB of the controller's memory with its prompt's share: `python -m bench controller-age`); between
them, a checkpoint's ledger.json and the log up to that checkpoint's `samples_log_bytes` hold each sample of its
lineage once (`rows`).
"""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from rlctl.agents.ledger import Entry, entry_row
from rlctl.checkpoint.cut import append_discarded

log = logging.getLogger(__name__)

# no spaces after ',' and ':': 30 of a line's ≈ 400 bytes (16 fields), ≈ 150 MB over 5 million samples; every reader
# parses the lines as JSON (`read`)
COMPACT = (",", ":")


class SampleLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None

    def write(self, entries: Iterable[Entry]) -> None:
        """Append one line per entry, flushed: `size` then covers them (a checkpoint taken next includes them)."""
        if self._file is None:
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(_lines(entries).decode())
        self._file.flush()

    def size(self) -> int:
        """Bytes written so far (every line whole)."""
        return self.path.stat().st_size if self.path.exists() else 0

    def cut(self, size: int, *, then: Iterable[Entry] = ()) -> int:
        """Keep the first `size` bytes (whole lines: a size this log reported), then the lines of `then` (the rounds
        the resume retires from its checkpoint's ledger); the lines after them move to samples.discarded.jsonl
        beside it, each whole (a last line cut short gets its newline there). Returns how many lines moved. The
        lines of `then` a log holds right after `size` already (an earlier resume from the same checkpoint retired
        them) stay, not moved nor written twice. A log shorter than `size` (lost or cut by hand) is left as it is,
        with a warning: the rounds it lacks are not in it."""
        self.close()
        ours = _lines(then)
        have = self.size()
        if size > have:
            log.warning("%s: %d bytes, shorter than the checkpoint's %d: left as it is", self.path, have, size)
        rest = b""
        if size < have:
            with self.path.open("rb") as f:
                f.seek(size)
                rest = f.read()
        if ours and rest.startswith(ours):
            size, rest, ours = size + len(ours), rest[len(ours) :], b""
        moved = self._aside(size, rest) if rest else 0
        if ours:
            with self.path.open("ab") as f:
                f.write(ours)
        return moved

    def _aside(self, size: int, rest: bytes) -> int:
        """Move `rest`, the log's bytes past `size`, to samples.discarded.jsonl (`append_discarded`: there, on disk,
        before the log loses them); how many lines moved."""
        moved = append_discarded(self.path, io.BytesIO(rest))
        with self.path.open("rb+") as f:
            f.truncate(size)
            os.fsync(f.fileno())
        return moved

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _lines(entries: Iterable[Entry]) -> bytes:
    """The log's lines of `entries` (ASCII: `json.dumps` escapes the rest)."""
    return "".join(json.dumps(entry_row(e), separators=COMPACT) + "\n" for e in entries).encode()


def read(path: Path, size: int | None = None) -> list[dict[str, Any]]:
    """The log's rows, the first `size` bytes only when given (a checkpoint's `samples_log_bytes`)."""
    if not path.exists():
        return []
    with path.open("rb") as f:
        data = f.read() if size is None else f.read(size)
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def rows(path: Path, ledger: dict[str, Any], size: int | None) -> list[dict[str, Any]]:
    """Every sample of a checkpoint's lineage once: the log's rows up to the checkpoint's `samples_log_bytes`
    (`size`; None: a checkpoint written before the log, whose ledger holds them all) and its ledger's entries."""
    return (read(path, size) if size is not None else []) + list(ledger["entries"])
