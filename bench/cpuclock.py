"""A dedicated-core clock for a process tree on a shared machine, from the kernel's scheduler statistics.

The simulator prices every agent as if it had its own "GPU" (one core of the local site); on this
machine the job's trainer, rollout units and controller share 2 cores with other work. Linux counts,
per thread, the time it ran and the time it waited runnable in a run queue
(`/proc/<pid>/task/<tid>/schedstat`). Sampling the job's threads every `period_s`:

    window k:  r_k = Σ Δcpu / Σ (Δcpu + Δwait)   over the job's threads (1 if none was runnable)
    virtual time   V(t_k) = V(t_{k-1}) + r_k · (t_k − t_{k-1})

With a fair scheduler every runnable thread progresses at the same rate r_k, so the job's timeline
stretched by waiting for a core is mapped back onto the timeline it would have with a core per
runnable thread: `V` of an interval is the interval as the simulator sees it. Threads sleeping on
a message or a lock are not runnable and do not count; time blocked on I/O or page faults (not
runnable either) stays in V. Threads found after the start count from their first reading.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np

PROC = Path("/proc")


def descendants(root: int) -> list[int]:
    """`root` and every process below it (from /proc/*/stat parent pids)."""
    children: dict[int, list[int]] = {}
    for d in PROC.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


Counters = dict[tuple[int, int], tuple[int, int]]  # (pid, tid) → (ns on a CPU, ns waiting in a run queue)


def thread_counters(pids: list[int]) -> Counters:
    """(pid, tid) → (ns on a CPU, ns waiting in a run queue) for every thread of `pids`."""
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(PROC / str(pid) / "task")
        except OSError:
            continue
        for tid in tids:
            try:
                cpu, wait, _ = (PROC / str(pid) / "task" / tid / "schedstat").read_text().split()
            except (OSError, ValueError):
                continue
            out[(pid, int(tid))] = (int(cpu), int(wait))
    return out


class DedicatedClock:
    """Samples a process tree in a background thread; `virtual(t)` maps wall time (time.time()) to V."""

    def __init__(self, root_pid: int, *, period_s: float = 0.025, rescan_s: float = 0.5) -> None:
        self.root_pid = root_pid
        self.period_s = period_s
        self.rescan_s = rescan_s
        self.t: list[float] = []
        self.v: list[float] = []
        self.total_cpu_s = 0.0  # CPU seconds of the tree's threads while sampled
        self.total_wait_s = 0.0  # seconds they waited for a core
        self._cpu_by_pid: dict[int, float] = {}  # CPU seconds so far, per process
        self._main_by_pid: dict[int, float] = {}  # … of its main thread (an agent's loop)
        self._cpu_snapshots: list[tuple[dict[int, float], dict[int, float]]] = []  # (both) at each sample
        self._last: Counters = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dedicated-clock", daemon=True)

    def start(self) -> DedicatedClock:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        pids, t_scan = descendants(self.root_pid), time.monotonic()
        self.record(time.time(), thread_counters(pids))
        while not self._stop.wait(self.period_s):
            if time.monotonic() - t_scan >= self.rescan_s:
                pids, t_scan = descendants(self.root_pid), time.monotonic()
            self.record(time.time(), thread_counters(pids))

    def record(self, t: float, counters: Counters) -> None:
        """One sample: the tree's `thread_counters` read at wall time `t`."""
        if not self.t:
            self.t.append(t)
            self.v.append(0.0)
            self._cpu_snapshots.append(({}, {}))
            self._last = counters
            return
        d_cpu = d_wait = 0
        for key, (cpu, wait) in counters.items():
            c0, w0 = self._last.get(key, (cpu, wait))  # a new thread counts from its first reading
            d_cpu += cpu - c0
            d_wait += wait - w0
            self._cpu_by_pid[key[0]] = self._cpu_by_pid.get(key[0], 0.0) + (cpu - c0) / 1e9
            if key[0] == key[1]:
                self._main_by_pid[key[0]] = self._main_by_pid.get(key[0], 0.0) + (cpu - c0) / 1e9
        self._last = counters
        busy = d_cpu + d_wait
        rate = d_cpu / busy if busy > 0 else 1.0
        self.total_cpu_s += d_cpu / 1e9
        self.total_wait_s += d_wait / 1e9
        self.v.append(self.v[-1] + rate * (t - self.t[-1]))
        self.t.append(t)
        self._cpu_snapshots.append((dict(self._cpu_by_pid), dict(self._main_by_pid)))

    def virtual(self, t: np.ndarray) -> np.ndarray:
        """V at wall times `t` (time.time() stamps, e.g. metrics rows' `t`), interpolated."""
        return np.asarray(np.interp(t, self.t, self.v))

    def cpu_s(self, pid: int, t0: float, t1: float, *, main_thread: bool = False) -> float:
        """CPU seconds process `pid` (or only its main thread) used between wall times t0 and t1 (at sample
        resolution)."""
        series = [(main if main_thread else whole).get(pid, 0.0) for whole, main in self._cpu_snapshots]
        return float(np.interp(t1, self.t, series) - np.interp(t0, self.t, series))

    @property
    def cpu_share(self) -> float:
        """Of the time the job's threads were runnable, the fraction they ran (1.0: never waited)."""
        total = self.total_cpu_s + self.total_wait_s
        return self.total_cpu_s / total if total > 0 else 1.0
