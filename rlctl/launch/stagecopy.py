"""Copying to one host view of a site while it is staged: the view (`View`), the thread pool its copies run in
(`copy_pool`), the copy and its verification (size + SHA-256, the secret 0600: `copy_files`), and the progress
lines and live bar of a site's copy (`StagingProgress`). rlctl.launch.stage and rlctl.launch.stagefanout copy
through these."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rlctl.errors import LaunchError
from rlctl.launch.sitefs import FileState, HostFiles, StagingStopped
from rlctl.textutil import duration

log = logging.getLogger(__name__)

SECRET_MODE = 0o600
PROGRESS_INTERVAL_S = 10.0  # a staging progress line at most this often
BAR_INTERVAL_S = 0.25  # … and the terminal's live bar


@contextmanager
def copy_pool(workers: int, progress: StagingProgress | None) -> Iterator[ThreadPoolExecutor]:
    """A thread pool for a site's copies, left (as a plain one) only once its threads are done; when the thread
    that waits on it is stopped (Ctrl-C, SIGTERM's exit) or fails, `progress` is stopped first, so the copies end
    at their next chunk and their checksums at once. A plain pool waited for them: a launch stopped while it staged
    went on copying (minutes to hours across a slow link), or hashing what it copied, before it stopped."""
    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        yield pool
    except BaseException:
        if progress is not None:
            progress.stop()
        raise
    finally:
        pool.shutdown(wait=True)


@dataclass
class View:
    """One host view of a site while it is staged: its files (`fs`), its site job dir, what it held before and
    what it lacks (`todo`)."""

    host: str
    fs: HostFiles
    resolved: str
    have: dict[str, FileState]
    todo: list[str]


def copy_files(
    site: str, src: Path, v: View, names: list[str], want: dict[str, FileState], progress: StagingProgress | None
) -> None:
    """Copy `names` from the operator's job dir straight to the view (SFTP / a local copy) and verify them."""
    if not names:
        return
    tick = progress.advance if progress is not None else None
    stop = progress.stopping if progress is not None else None
    resumed = [n for n in names if v.fs.put(src / n, f"{v.resolved}/{n}", progress=tick, resume=True)]
    after = v.fs.states(v.resolved, names, stop=stop)
    again = [n for n in resumed if after.get(n) != want[n]]  # an earlier partial copy of other bytes
    if again:
        log.warning("site %s: %s: %d resumed copies did not verify; copying them again", site, v.host, len(again))
        for n in again:
            v.fs.put(src / n, f"{v.resolved}/{n}", resume=False)
        after.update(v.fs.states(v.resolved, again, stop=stop))
    _verify(site, v.fs.where, v.resolved, {n: want[n] for n in names}, after)


def _verify(site: str, where: str, root: str, want: dict[str, FileState], have: dict[str, FileState]) -> None:
    for n, w in want.items():
        h = have.get(n)
        path = f"site {site}: {where}:{root}/{n}"
        if h is None:
            raise LaunchError(f"{path}: missing after the copy")
        if h.size != w.size:
            raise LaunchError(f"{path}: {h.size} bytes after the copy, {w.size} here")
        if h.sha256 != w.sha256:
            raise LaunchError(f"{path}: SHA-256 {h.sha256[:12]}… after the copy, {w.sha256[:12]}… here")
        if n == "secret" and h.mode != SECRET_MODE:
            raise LaunchError(f"{path}: mode {h.mode:o} after the copy, must be 600")


class StagingProgress:
    """Bytes a site's copy has to move and has moved (every host's, from their threads), reported through `say`
    at most every `interval_s`: done / total, the rate, the time left; and through `show` (a terminal's live line,
    when there is one) as a bar at most every BAR_INTERVAL_S."""

    def __init__(
        self,
        site: str,
        say: Callable[[str], None],
        *,
        show: Callable[[str], None] | None = None,
        interval_s: float = PROGRESS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.site, self.say, self.show, self.interval_s, self.clock = site, say, show, interval_s, clock
        self.total = self.moved = 0
        self._lock = threading.Lock()
        self._t0 = self._last = self._shown = clock()
        self._stopping = threading.Event()

    def stop(self) -> None:
        """The launch is stopping: every copy that reports here raises StagingStopped at its next chunk, and every
        checksum given `stopping` soon."""
        self._stopping.set()

    @property
    def stopping(self) -> threading.Event:
        """Set once the launch is stopping (`stop`): what a site view's checksums watch (HostFiles.states)."""
        return self._stopping

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.total += nbytes

    def advance(self, nbytes: int) -> None:
        if self._stopping.is_set():
            raise StagingStopped(f"staging {self.site}: stopped")
        with self._lock:
            self.moved += nbytes
            now = self.clock()
            bar = self.bar(now) if self.show is not None and now - self._shown >= BAR_INTERVAL_S else None
            if bar is not None:
                self._shown = now
            line = None
            if now - self._last >= self.interval_s:
                self._last = now
                line = self.line(now)
        if bar is not None and self.show is not None:
            self.show(bar)
        if line is not None:
            self.say(line)

    def bar(self, now: float, width: int = 30) -> str:
        """`staging gen [██████········] 1.00 GB / 3.00 GB  100 MB/s  ≈ 20 s left`"""
        frac = min(self.moved / self.total, 1.0) if self.total else 1.0
        full = round(frac * width)
        rate = self.moved / max(now - self._t0, 1e-9)
        left = f"≈ {duration((self.total - self.moved) / rate)} left" if rate > 0 else ""
        return (
            f"staging {self.site} [{'█' * full}{'·' * (width - full)}] {_gb(self.moved)} / {_gb(self.total)}  "
            f"{rate / 1e6:.0f} MB/s  {left}"
        ).rstrip()

    def line(self, now: float) -> str:
        spent = max(now - self._t0, 1e-9)
        rate = self.moved / spent
        left = (self.total - self.moved) / rate if rate > 0 else float("inf")
        pct = 100 * self.moved / self.total if self.total else 100.0
        eta = f"≈ {duration(left)} left" if left != float("inf") else "waiting for the first bytes"
        return (
            f"staging {self.site}: {_gb(self.moved)} of {_gb(self.total)} ({pct:.0f} %), {rate / 1e6:.0f} MB/s, {eta}"
        )

    def done(self) -> None:
        """The closing line, when anything was copied."""
        if self.total:
            spent = self.clock() - self._t0
            rate = self.moved / spent if spent > 0 else 0.0
            self.say(f"staging {self.site}: {_gb(self.moved)} copied in {duration(spent)} ({rate / 1e6:.0f} MB/s)")


def _gb(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 10**8 else f"{nbytes / 1e6:.1f} MB"
