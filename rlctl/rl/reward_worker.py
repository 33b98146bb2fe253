"""A reward worker process: it loads the function and answers each call (`worker_main`), and what it started goes
with it when it is killed (`kill_tree`) or its pool goes.

A worker killed (its call timed out or was cancelled, or the pool stops it) takes the programs its calls started
with it: each worker leads a process group of its own (os.setsid), and a kill is SIGKILL to that group, so a
code-execution reward's child and the child's children, orphaned or not, go too; on Linux the worker's descendants
that left its group for one of their own (`start_new_session=True`, as sandboxes do) are found in /proc and their
groups killed as well. A process that both left the group and lost its parent (a double-forked daemon) would escape
to init: each worker is its descendants' subreaper (Linux's PR_SET_CHILD_SUBREAPER), so such an orphan becomes the
worker's child, and the same walk of /proc finds and kills it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

from rlctl import procfs
from rlctl.rl.reward import call_reward, load_reward, takes_extra_info

ORPHAN_CHECK_S = 0.05  # a worker's watch of its pool, after a call arrived: how long before it looks again
PR_SET_CHILD_SUBREAPER = 36  # prctl(2), Linux ≥ 3.4
REAP_EVERY_S = 1.0  # a worker reaps the zombies of the orphans it adopted at most this often, between calls


def worker_main(spec: str, base_dir: str, on_error: float, conn: Connection) -> None:
    """Worker process: load the function, say "ready" (or why not), then answer each kwargs with a RewardResult."""
    os.setsid()  # a group of its own: killing the worker kills what its calls started (see kill_tree)
    _adopt_orphans()
    _die_with_the_pool(conn)
    try:
        fn = load_reward(spec, Path(base_dir), own_process=True)
    except ValueError as e:
        conn.send(str(e))
        return
    takes_extra = takes_extra_info(fn)
    conn.send("ready")
    reaped_at = time.monotonic()
    while True:
        try:
            kwargs = conn.recv()
        except EOFError:
            return
        if not takes_extra:
            kwargs.pop("extra_info", None)
        conn.send(call_reward(fn, kwargs, on_error))
        if time.monotonic() >= reaped_at + REAP_EVERY_S:
            _reap_zombies()
            reaped_at = time.monotonic()


def _adopt_orphans() -> None:
    """Make this worker the subreaper of its descendants: one whose parent exits — a daemon that double-forked out of
    the worker's group and session (`setsid cmd &`) — becomes the worker's child instead of init's, so `kill_tree`'s
    walk of the worker's descendants finds it; nothing but a descendant can become its child. Set in each worker,
    not in the pool's process: there it would adopt every orphan below the controller (its forkserver's, torch's
    compile workers') and leave their zombies to a process that reaps only its own children. The worker reaps the
    zombies of those that exit between calls (`_reap_zombies`). A no-op off Linux."""
    if sys.platform != "linux":
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # no libc to load: the double-forked daemon escapes, as before
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap_zombies() -> None:
    """Reap this worker's children that have exited: the orphans it adopts (`_adopt_orphans`: a `cmd &` a call's
    shell left behind) are nobody else's to wait for, and a worker that lives for weeks would pile up their zombies
    until the machine has no pid left. Between calls, so that a call's own child is waited for by its call; a child
    a reward keeps across calls and waits for in a later one reads exit 0 there (Python's ECHILD rule)."""
    me = str(os.getpid())
    for pid, fields in procfs.every_stat():
        if fields[procfs.STATE] == "Z" and fields[procfs.PPID] == me:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _die_with_the_pool(conn: Connection) -> None:
    """A worker in a group of its own is out of reach of its agent's stop (the backends kill the agent's process
    group), and the forkserver that started it outlives a controller killed on its own (the OOM killer): when the
    pool's end of `conn` closes — its process gone, however — the worker kills what its calls started outside its
    group (`_kill_below`: in sessions of their own, adopted daemons), then its own group, itself included. A thread
    waiting on the socket's hang-up (never reading it: the calls are the loop's), so a call hung in a system call (a
    wait on its child) does not hold it up."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLRDHUP)
    gone = select.POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL

    def watch() -> None:
        while not any(events & gone for _, events in poller.poll()):
            time.sleep(ORPHAN_CHECK_S)  # a call arrived (the loop reads it): look again after a while
        _kill_below(os.getpid())  # those in sessions of their own (an adopted daemon's included) first
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="reward-orphan-watch", daemon=True).start()


def _descendants(pid: int) -> list[int]:
    """The processes below `pid`, children first, from Linux's /proc (none where there is no /proc)."""
    children: dict[int, list[int]] = {}
    for child, fields in procfs.every_stat():
        children.setdefault(int(fields[procfs.PPID]), []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL worker `pid`'s process group (itself, once it ran os.setsid, and what its calls started, orphaned or
    not) and its descendants outside it (`_kill_below`). The worker's group is stopped first, so that it starts
    nothing more while /proc is read; a signal to a process gone meanwhile is no error."""

    def signal_(kill: Callable[[int, int], None], target: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(target, sig)

    signal_(os.killpg, pid, signal.SIGSTOP)  # no such group (killed before its os.setsid): nothing below it yet
    _kill_below(pid)
    signal_(os.killpg, pid, signal.SIGKILL)


def _kill_below(pid: int) -> None:
    """SIGKILL `pid`'s descendants (the worker's adopted orphans among its children), each with the group it leads.
    Those outside the worker's stopped group run on while /proc is read: read again until it shows none not killed
    yet (one killed cannot start more)."""
    killed: set[int] = set()
    while found := [child for child in _descendants(pid) if child not in killed]:
        for child in found:
            with contextlib.suppress(OSError):
                if os.getpgid(child) == child:  # it leads a group (start_new_session=True): its members go too
                    os.killpg(child, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)
        killed.update(found)
