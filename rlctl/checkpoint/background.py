"""Checkpoints written beside training: the training thread copies what a checkpoint holds into host memory
(`rlctl.checkpoint.trainer.snapshot_trainer` / `snapshot_shard`) and hands the write to a `BackgroundWriter`,
which writes it on a thread of its own while the next steps run.

    training thread                                 writer thread
      snapshot (host copies of policy, optimizers)
      writer.submit(write) ───────────────────────▶  write(): files, fsync, the ranks' gather, the manifest
      next steps …                                    done (or its exception kept)
      writer.submit(next write) — waits for the one before: one snapshot in host memory at a time
      writer.wait() at the end — raises what a write raised

`blocked_s` is the training thread's time in `submit`/`wait` waiting for a write (with `snapshot_s`, taken by
the caller, what a checkpoint costs training); `written_s` the writes' own time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class BackgroundWriter:
    """One checkpoint write at a time, on a thread of its own."""

    def __init__(self, name: str = "checkpoint-writer") -> None:
        self._name = name
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.blocked_s = 0.0
        self.written_s = 0.0
        self.writes = 0

    def submit(self, write: Callable[[], object]) -> None:
        """Start `write` once the write before it is done (raising what that one raised)."""
        self.wait()

        def run() -> None:
            t0 = time.monotonic()
            try:
                write()
            except Exception as e:  # noqa: BLE001 - kept for the training thread: `wait` raises it there
                log.error("%s: the write failed: %s: %s (raised at the next wait)", self._name, type(e).__name__, e)
                self._error = e
            finally:
                self.written_s += time.monotonic() - t0
                self.writes += 1

        self._thread = threading.Thread(target=run, name=self._name, daemon=True)
        self._thread.start()

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Wait for the write in progress, if any; raise what it raised."""
        if self._thread is not None:
            t0 = time.monotonic()
            self._thread.join()
            self.blocked_s += time.monotonic() - t0
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
