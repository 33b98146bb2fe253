"""Linux's /proc/PID/stat, read one way for every caller: the fields after the command name, which may hold spaces
and parentheses (`(comm) `), so field 3 of proc(5), the state, is index 0 here; the parent is 1, the process group
2, the start time (field 22, clock ticks since boot) 19. Where there is no /proc, nothing is found. (`alive`, whether a
pid names a process, asks the kernel by signal 0 instead, so it holds on any POSIX system.) `pid_space` says which
machine and namespace this process's pids are those of, and `pids_here` whether a pid recorded in a shared file is one
of this pid space."""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Iterator

STATE, PPID, PGRP, START = 0, 1, 2, 19
PID_MAX = 2**31 - 1  # a pid_t is a C int


def stat(pid: int | str) -> list[str] | None:
    """The fields of process `pid` after its command name; None when it is gone (or unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot): with its pid, who it is; None: no such process."""
    fields = stat(pid)
    return int(fields[START]) if fields and len(fields) > START else None


def possible(pid: int, *, group: bool = False) -> bool:
    """Whether `pid` (read from a file: agents.jsonl, a lock's holder line, a folder's name) can name one process to
    `kill`, or one process group to `killpg` (`group`), before either is given it: 0 is this process's own group to
    both, a negative pid a group or every process to `kill`, and 1 every process to `killpg` (kill(-1)); one past a
    C int is their OverflowError."""
    return (1 if group else 0) < pid <= PID_MAX


def alive(pid: int) -> bool:
    """A process with that pid exists on this machine (another user's too), on any POSIX system: signal 0. A pid no
    process can have (`possible`) is none, versus an OverflowError or this process's own group signalled."""
    if not possible(pid):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@functools.cache
def pid_space() -> str | None:
    """What this process's pids are numbered in: its machine's boot (boot_id, new at each boot; a host name is not
    one machine's: containers on several share it) and its pid namespace (a container's own numbering), e.g.
    '8c4e…-4026531836'; None where there is no /proc. A pid written to a shared file by a process of another pid
    space names nothing here, whatever `alive` says of it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return f"{boot}-{namespace}"


def pids_here(host: object, space: object) -> bool:
    """Whether a pid that a process of `host` (its host name) and pid space `space` (its `pid_space`) wrote to a
    shared file (a job dir on NFS) is one of this pid space, to be asked of here (`alive`, /proc): the host is this
    one and, where the record and this machine both say a pid space, so is that. A record without one (an older
    rlctl's) or a machine without /proc goes by the host alone, as before pid spaces were recorded; a record of
    another pid space under this host name (a container of another machine) is not here, versus its pid taken for
    whatever process of this machine has that number."""
    if host != socket.gethostname():
        return False
    here = pid_space()
    return space is None or here is None or space == here


def every_stat() -> Iterator[tuple[int, list[str]]]:
    """(pid, fields) of every process there is, those gone meanwhile left out."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if name.isdigit() and (fields := stat(name)) is not None:
            yield int(name), fields
