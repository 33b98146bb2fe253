"""Whether a process the test started still runs, read from /proc: a zombie or a dead one no reaper has collected
yet has ended (this machine's pid 1 does not always reap orphans at once)."""

from __future__ import annotations

from rlctl import procfs


def running(pid: int) -> bool:
    """`pid` runs (a zombie no reaper has collected yet is not running)."""
    fields = procfs.stat(pid)
    return fields is not None and fields[procfs.STATE] not in ("Z", "X")
