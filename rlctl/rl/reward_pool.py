"""The pool of worker processes that calls a reward function, each call bounded by a deadline; `rlctl check`'s
check that a reward loads.

    trainer thread                    dispatcher thread                  worker processes (forkserver)
    pool.submit(id, …) ─▶ Future ─▶  pending ─▶ idle worker ─── call ──▶ fn(**kwargs) → checked result
          │                           ◀── result / deadline passed ◀───┘
          ▼                           deadline passed: kill the worker, start a new one,
    future.result() → RewardResult    and score the call `on_error`

A call that raises, runs past `timeout_s`, returns a wrong type (or a NaN, or an int past a float's range) or kills
its worker never fails the job: it scores `on_error`, is counted (calls, errors, timeouts, bad_type, died) and logged
with its sample id (a dict's other keys that are no name of letters, digits and `_`, or hold no finite number, are
left out of `extra`: `rlctl.rl.reward.extra_figures`, said once a key). `workers=0` loads and calls the function in
the submitting thread (no deadline, no timeout): the in-process mode for debugging and tests.
With workers, the process that starts the pool never imports the user's module (an import that hangs there could
not be bounded): the workers load it, each start within a deadline (below).

A call that hangs holds its worker until its deadline; the pool does not let it hold the others' calls: while
calls wait and a worker's call has run longer than `stuck_s`, one more worker starts for each such worker (up
to `workers × EXTRA_FACTOR`), and a worker beyond `workers` stops as soon as it is idle with nothing waiting.
`cancel(sample_id)` drops a call nobody waits for any more (the controller filtered its sample out): a queued one
leaves the queue, a running one's worker is replaced at once instead of at the deadline; its future is cancelled.
It drops the calls submitted before it only: the same sample generated again and submitted while the dispatcher
had not got to the cancel yet is scored.

A worker killed (its call timed out or was cancelled, or the pool stops it) takes the programs its calls started
with it: see rlctl.rl.reward_worker.

A worker that cannot load the function is no reason to score calls `on_error`:

    first start (no worker has loaded it yet): a worker cannot load it ──▶ the pool fails (a config error)
    later: a worker cannot load it ──▶ down ──(1 s, 2 s, 4 s … 60 s)──▶ started again ──▶ ready, scoring again
           (each failure counted and logged; calls wait meanwhile)
    every worker unable to load it for `load_retry_s` (6 × timeout_s, at least 60 s) ──▶ the pool fails
    (`load_retry_s`: a job's task.reward_load_timeout_s where it sets one)

A start that has not loaded the function within `load_retry_s` (its import hangs: a network mount, a lock) could not
load it: the worker is killed, and it is a config error at the first start, a failed start (backoff) later. A pool
made with `wait=True` (the controller's, and `rlctl check`'s: `check_loads`) returns once a worker has loaded the
function, or raises the first start's failure as one line (ValueError), so that it ends the job before it starts.

A pool that failed logs why (the load error), keeps it in `failed`, and cancels its calls, those to come included:
the controller fails the job with it (a sample waits for a reward that will not come) instead of training on
`on_error` scores for the rest of the run.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import socket
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from multiprocessing.connection import Connection, wait
from multiprocessing.context import ForkServerContext, SpawnContext
from pathlib import Path
from typing import Any, Literal, cast

from rlctl.rl.reward import RewardResult, call_reward, load_reward, takes_extra_info
from rlctl.rl.reward_worker import kill_tree, worker_main

log = logging.getLogger(__name__)

EXTRA_FACTOR = 4  # at most this many times `workers` processes while calls wait behind stuck ones
STUCK_FRACTION = 0.1  # a call running longer than this part of the timeout (at least STUCK_MIN_S) is stuck
STUCK_MIN_S = 0.2
RETRY_FIRST_S = 1.0  # a worker that failed to load starts again after this, doubled on each failure in a row …
RETRY_MAX_S = 60.0  # … up to this
LOAD_RETRY_FACTOR = 6  # the pool fails once every worker has failed to load for this many × timeout_s …
WAIT_SLACK_S = 30.0  # a pool made with wait=True waits at most load_retry_s + this for its first start's word
LOAD_RETRY_MIN_S = 60.0  # … or this, if longer: a filesystem hiccup or an OOM kill while importing passes sooner
SAID_DROPPED_MAX = 1024  # a dict reward's keys left out of its figures said (a key per sample: the first ones)
# (job dir, reward, key) said left out of a dict reward's figures: once a process, the held-out evaluation's pool too
_said_dropped: set[tuple[str, str, str]] = set()


@dataclass
class _Call:
    sample_id: str
    kwargs: dict[str, Any]
    future: Future[RewardResult]
    seq: int = 0  # its place in the order of submits (a cancel drops only the calls before it)
    origin: str | None = None  # where its prompt came from ("data.jsonl line 7"), for the log


@dataclass
class _Worker:
    proc: Any  # multiprocessing.process.BaseProcess
    conn: Connection
    state: Literal["starting", "ready", "down"] = "starting"  # down: it could not load the function
    call: _Call | None = None
    deadline: float = math.inf  # starting: when its load has failed (load_retry_s); else its call's deadline
    stuck_at: float = math.inf  # when its call counts as stuck (another worker may start for the calls waiting)
    load_failures: int = 0  # its starts in a row that could not load the function (0 once one loads)
    retry_at: float = math.inf  # down: when it starts again


@dataclass
class RewardStats:
    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    bad_type: int = 0
    died: int = 0  # calls whose worker died (a segfault, an OOM kill, os._exit) while it ran them
    restarts: int = 0  # workers replaced (killed on a timeout or a cancel, or died)
    cancelled: int = 0  # calls dropped by `cancel` before they finished
    extra_started: int = 0  # workers started beside stuck ones for the calls waiting behind them
    load_failures: int = 0  # worker starts that could not load the function (each started again after a backoff)
    first_failure: str | None = None  # the first call scored on_error: its outcome, sample, origin and error

    @property
    def failures(self) -> int:
        return self.errors + self.timeouts + self.bad_type + self.died

    def plus(self, later: RewardStats) -> RewardStats:
        """The job's counts: these (the runs before a resume, up to its checkpoint) and a later run's `later`; the
        first failure the earliest one."""
        ints = [f.name for f in dataclass_fields(self) if f.type == "int"]
        counts = {name: getattr(self, name) + getattr(later, name) for name in ints}
        return RewardStats(**counts, first_failure=self.first_failure or later.first_failure)


def load_deadline_s(timeout_s: float, load_timeout_s: float | None = None) -> float:
    """How long a pool gives a worker to load the function (`load_retry_s`): a job's `task.reward_load_timeout_s`
    (`load_timeout_s`), else a bound that follows its calls' `timeout_s`."""
    return load_timeout_s if load_timeout_s is not None else max(LOAD_RETRY_MIN_S, LOAD_RETRY_FACTOR * timeout_s)


class RewardPool:
    """Reward calls in `workers` processes, each call bounded by `timeout_s` (see the module docstring).

    `load_retry_s`: how long every worker may stay unable to load the function before the pool fails, and how long
    one start may take to load it: a job's `task.reward_load_timeout_s` (a reward model's load takes minutes), by
    default LOAD_RETRY_FACTOR × timeout_s, at least LOAD_RETRY_MIN_S (long enough for an import of torch or sympy
    from cold shared storage)."""

    def __init__(
        self,
        spec: str,
        *,
        base_dir: Path,
        workers: int = 2,
        timeout_s: float = 10.0,
        on_error: float = 0.0,
        load_retry_s: float | None = None,
        loaded: bool = False,
        wait: bool = False,
    ) -> None:
        """`loaded`: the function is known to load (another pool of the job loaded it): a first start that fails
        is then retried as a restart is, not a config error. `wait`: return once a worker has loaded the function,
        or raise ValueError with one line naming the function and why none could (the caller reports it: the pool
        does not log it) — within the pool's deadline for a start, `load_retry_s`."""
        self.spec = spec
        self.base_dir = base_dir
        self.timeout_s = timeout_s
        self.on_error = float(on_error)
        self.load_retry_s = load_deadline_s(timeout_s) if load_retry_s is None else load_retry_s
        # what sets that bound, for the line of a load that outlasts it: the job field that raises it
        self._bound_by = (
            f" ({LOAD_RETRY_FACTOR} × reward_timeout_s, at least {LOAD_RETRY_MIN_S:g} s; a longer load: set "
            "task.reward_load_timeout_s)"
            if load_retry_s is None
            else " (task.reward_load_timeout_s)"
        )
        self.stats = RewardStats()
        self.failed: str | None = None  # why the pool stopped for good (its calls are cancelled), once it has
        # a bad spec fails here, in the caller, when the caller calls the function (workers=0) or it is a built-in;
        # a user's module is imported by the workers only, where its load has a deadline (the first start's failure
        # is the pool's, a config error: `failed`)
        self._fn = load_reward(spec, base_dir) if workers == 0 or ":" not in spec else None
        self.base_workers = workers
        self.stuck_s = max(STUCK_MIN_S, STUCK_FRACTION * timeout_s)
        self._inline = workers == 0
        self._lock = threading.Lock()
        self._pending: deque[_Call] = deque()
        self._seq = 0  # calls submitted so far
        self._cancels: dict[str, int] = {}  # sample id → its calls up to this seq are dropped (the dispatcher does it)
        self._closed = False
        self._loaded = loaded  # a worker has loaded the function: the first start is over
        self._wait = wait  # the constructor waits for the first start (and raises its failure)
        self._down_since: float | None = None  # since when every worker has been unable to load the function
        self._load_error: str | None = None  # why the last start that failed could not load it
        self.load_error: str | None = None  # the same, as one line that names the function's file, module or spec
        self._load_timed_out = False  # the first start failed for want of time (a slow import), not an error
        self._first_start_over = threading.Event()  # a worker loaded the function, or the pool failed or ended
        self._workers: list[_Worker] = []
        if self._inline:
            return
        methods = multiprocessing.get_all_start_methods()
        # never fork: the trainer has threads (and torch's); forkserver forks from a clean process
        ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        self._ctx = cast("ForkServerContext | SpawnContext", ctx)
        self._wake_r, self._wake_w = socket.socketpair()
        self._workers = [self._start_worker() for _ in range(workers)]
        self._thread = threading.Thread(target=self._dispatch, name="reward-pool", daemon=True)
        self._thread.start()
        if wait and (why := self._wait_loaded()) is not None:
            self.close()
            raise (LoadTimedOut if self._load_timed_out else ValueError)(why)

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(
        self,
        sample_id: str,
        data_source: str,
        solution_str: str,
        ground_truth: Any,
        extra_info: Any = None,
        *,
        origin: str | None = None,
    ) -> Future[RewardResult]:
        """Queue one call and return at once; the future's result is always a RewardResult. `origin` (where the
        prompt came from: "data.jsonl line 7") is named beside the sample id where the call fails."""
        kwargs = {
            "data_source": data_source,
            "solution_str": solution_str,
            "ground_truth": ground_truth,
            "extra_info": extra_info,
        }
        call = _Call(sample_id, kwargs, Future(), origin=origin)
        if self._inline:
            assert self._fn is not None
            if not takes_extra_info(self._fn):
                kwargs.pop("extra_info")
            self._finish(call, call_reward(self._fn, kwargs, self.on_error))
            return call.future
        with self._lock:
            if self.failed is not None:  # cancelled like those it had: whoever waits for it learns it will not come
                call.future.cancel()
                return call.future
            if self._closed:
                raise RuntimeError("reward pool is closed")
            self._seq += 1
            call.seq = self._seq
            self._pending.append(call)
        self._wake_w.send(b"x")
        return call.future

    def cancel(self, sample_id: str) -> None:
        """Drop `sample_id`'s calls submitted so far, queued or running (their futures are cancelled); nothing for
        one that has finished, or one submitted after this."""
        if self._inline:
            return
        with self._lock:
            if self._closed:
                return
            self._cancels[sample_id] = self._seq
        self._wake_w.send(b"x")

    def score(
        self, sample_id: str, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
    ) -> RewardResult:
        """One call, waiting for its result."""
        return self.submit(sample_id, data_source, solution_str, ground_truth, extra_info).result()

    def close(self) -> None:
        """Stop the workers; calls not finished yet are cancelled."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._inline:
            return
        self._wake_w.send(b"x")
        self._thread.join()
        self._wake_r.close()
        self._wake_w.close()

    # ── the dispatcher thread ──

    def _start_worker(self, load_failures: int = 0) -> _Worker:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=worker_main,
            args=(self.spec, str(self.base_dir), self.on_error, child),
            name="rlctl-reward",
            daemon=True,
        )
        proc.start()
        child.close()
        return _Worker(proc, parent, load_failures=load_failures, deadline=time.monotonic() + self.load_retry_s)

    def _stop(self, w: _Worker) -> None:
        """Kill worker `w` and what its calls started (`kill_tree`), and reap it."""
        kill_tree(w.proc.pid)
        w.proc.kill()  # killed before its os.setsid, it was in no group of its own
        w.proc.join()
        w.conn.close()

    def _finish(self, call: _Call, result: RewardResult) -> None:
        s = self.stats
        s.calls += 1
        if result.outcome == "error":
            s.errors += 1
        elif result.outcome == "timeout":
            s.timeouts += 1
        elif result.outcome == "bad_type":
            s.bad_type += 1
        elif result.outcome == "died":
            s.died += 1
        for key, why in result.dropped.items():
            said = (str(self.base_dir), self.spec, key)
            if said not in _said_dropped and len(_said_dropped) < SAID_DROPPED_MAX:
                _said_dropped.add(said)
                log.warning(
                    "reward %s returned %s beside 'score' (sample %s): left out of its figures (reward_extra/<key>): "
                    "%s; said once a key",
                    self.spec, key, call.sample_id, why,
                )  # fmt: skip
        if not result.ok:
            who = f"sample {call.sample_id}" + (f" ({call.origin})" if call.origin else "")
            if s.first_failure is None:
                s.first_failure = f"{result.outcome}: {who}: {result.error}"
            log.warning("reward %s: %s: %s; scored %s", result.outcome, who, result.error, result.score)
        call.future.set_result(result)

    def _replace(self, i: int) -> None:
        self._stop(self._workers[i])
        self.stats.restarts += 1
        self._workers[i] = self._start_worker()

    def _assign(self) -> None:
        for i, w in enumerate(self._workers):
            if w.state != "ready" or w.call is not None:
                continue
            with self._lock:
                if not self._pending:
                    return
                call = self._pending.popleft()
            try:
                w.conn.send(call.kwargs)
            except OSError:  # died while idle: its replacement takes the call once ready
                with self._lock:
                    self._pending.appendleft(call)
                self._replace(i)
                continue
            now = time.monotonic()
            w.call, w.deadline, w.stuck_at = call, now + self.timeout_s, now + self.stuck_s
        self._grow()

    def _grow(self) -> None:
        """Calls wait and no worker is free: one more worker for each stuck call beyond those already started
        beside them, up to workers × EXTRA_FACTOR."""
        with self._lock:
            waiting = len(self._pending)
        if not waiting or any(w.state == "starting" or (w.state == "ready" and w.call is None) for w in self._workers):
            return
        now = time.monotonic()
        stuck = sum(1 for w in self._workers if w.call is not None and now >= w.stuck_at)
        extra = len(self._workers) - self.base_workers
        room = self.base_workers * EXTRA_FACTOR - len(self._workers)
        for _ in range(min(stuck - extra, waiting, room)):
            self._workers.append(self._start_worker())
            self.stats.extra_started += 1

    def _shrink(self, i: int) -> None:
        """Worker `i` is idle: stop it if it is beyond the pool's size and nothing waits."""
        with self._lock:
            waiting = bool(self._pending)
        if waiting or len(self._workers) <= self.base_workers:
            return
        self._stop(self._workers.pop(i))  # idle: nothing to lose, and the dispatcher must not wait for a clean exit

    def _receive(self, i: int) -> None:
        w = self._workers[i]
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            w.proc.join(1.0)
            code, call = w.proc.exitcode, w.call
            if w.state == "starting":  # crashed while loading the function
                self._load_failed(i, f"died while loading it (exit code {code})")
                return
            self._replace(i)
            if call is not None:
                self._finish(call, RewardResult(self.on_error, "died", f"reward worker died (exit code {code})"))
            return
        if w.state == "starting":
            if msg == "ready":
                w.state, w.load_failures, w.deadline, self._loaded = "ready", 0, math.inf, True
                self._first_start_over.set()
            else:
                self._load_failed(i, msg, named=True)
            return
        call, w.call, w.deadline, w.stuck_at = w.call, None, math.inf, math.inf
        assert call is not None and isinstance(msg, RewardResult), msg
        self._finish(call, msg)
        self._shrink(i)

    def _load_failed(self, i: int, why: str, *, named: bool = False) -> None:
        """Worker `i` could not load the function: on the pool's first start a config error (the pool fails);
        later (an NFS hiccup, an OOM kill while importing) it is down and starts again after a backoff.
        `named`: `why` is the loader's own line, which names the file or module (else the spec is put before it)."""
        w = self._workers[i]
        self._stop(w)
        self.stats.load_failures += 1
        delay = min(RETRY_MAX_S, RETRY_FIRST_S * 2**w.load_failures)
        w.state, w.load_failures, w.retry_at = "down", w.load_failures + 1, time.monotonic() + delay
        self._load_error = why
        self.load_error = why if named else f"{self.spec}: {why}"
        if not self._loaded:
            self._fail(f"a reward worker cannot load {self.spec}: {why}")
            return
        log.error(
            "reward worker %d cannot load %s: %s; starting it again in %.0f s (%d failed start(s) in a row)",
            i, self.spec, why, delay, w.load_failures,
        )  # fmt: skip

    def _retry(self) -> None:
        """Start again the workers whose backoff has passed (one beyond the pool's size goes, if nothing waits);
        fail the pool when every worker has been unable to load the function for `load_retry_s`."""
        now = time.monotonic()
        for w in list(self._workers):
            if w.state != "down" or now < w.retry_at:
                continue
            with self._lock:
                waiting = bool(self._pending)
            if not waiting and len(self._workers) > self.base_workers:
                self._workers.remove(w)
                continue
            self._workers[self._workers.index(w)] = self._start_worker(w.load_failures)
        if not self._workers or not all(w.load_failures for w in self._workers):
            self._down_since = None
            return
        if self._down_since is None:
            self._down_since = now
        if now - self._down_since >= self.load_retry_s:
            self._fail(
                f"no reward worker could load {self.spec} for {now - self._down_since:.0f} s "
                f"({self.stats.load_failures} failed starts); the last error: {self._load_error}"
            )

    def _wait_loaded(self) -> str | None:
        """Wait for the first start to end: None once a worker has loaded the function, else why none could, in one
        line naming the function (`load_error`). Bounded by the pool's deadline: a start has `load_retry_s` to load
        it, and the first start that cannot fails the pool."""
        if not self._first_start_over.wait(self.load_retry_s + WAIT_SLACK_S):  # a dispatcher that died: no hang
            self._load_timed_out = True
            return f"{self.spec}: no reward worker said whether it loaded within {self.load_retry_s:.0f} s"
        if self._loaded and self.failed is None:
            return None
        return self.load_error or self.failed or f"{self.spec}: the reward pool ended before a worker loaded it"

    def _fail(self, why: str) -> None:
        """Stop the pool for good: the dispatcher ends, and every call, queued, running or to come, is cancelled."""
        if not self._wait or self._loaded:  # (a constructor that waits raises the first start's failure itself)
            log.error("reward pool failed: %s; its calls are cancelled", why)
        with self._lock:
            self.failed = why
        self._first_start_over.set()

    def _drop_cancelled(self) -> None:
        with self._lock:
            drop, self._cancels = self._cancels, {}
            if not drop:
                return
            keep: deque[_Call] = deque()
            gone: list[_Call] = []
            for c in self._pending:
                (gone if c.seq <= drop.get(c.sample_id, 0) else keep).append(c)
            self._pending = keep
        for i, w in enumerate(self._workers):
            if w.call is not None and w.call.seq <= drop.get(w.call.sample_id, 0):
                gone.append(w.call)
                self._replace(i)  # a running call cannot be interrupted: its process goes
        for call in gone:
            self.stats.cancelled += 1
            call.future.cancel()

    def _dispatch(self) -> None:
        try:
            while not self._closed and self.failed is None:
                self._drop_cancelled()
                self._retry()
                if self.failed is not None:
                    break
                self._assign()
                waiting = [w for w in self._workers if w.state == "starting" or w.call is not None]
                next_deadline = min((w.deadline for w in waiting), default=math.inf)
                next_deadline = min([next_deadline, *(w.retry_at for w in self._workers if w.state == "down")])
                if self._down_since is not None:  # wake to fail the pool if no retry has loaded the function by then
                    next_deadline = min(next_deadline, self._down_since + self.load_retry_s)
                with self._lock:
                    queued = bool(self._pending)
                if queued:  # wake when a running call becomes stuck: a worker may start for the waiting calls
                    next_deadline = min(
                        [next_deadline, *(w.stuck_at for w in waiting if w.stuck_at > time.monotonic())]
                    )
                timeout = None if math.isinf(next_deadline) else max(0.0, next_deadline - time.monotonic())
                ready = wait([self._wake_r, *(w.conn for w in waiting)], timeout)
                if self._wake_r in ready:
                    self._wake_r.recv(4096)
                for w in list(self._workers):
                    if w not in self._workers:  # stopped by _shrink meanwhile
                        continue
                    i = self._workers.index(w)
                    if w.conn in ready:
                        self._receive(i)
                        if self.failed is not None:
                            break
                    elif w.call is not None and time.monotonic() >= w.deadline:
                        call = w.call
                        self._replace(i)  # a running call cannot be interrupted: its process goes
                        self._finish(call, RewardResult(self.on_error, "timeout", f"no result in {self.timeout_s}s"))
                    elif w.state == "starting" and time.monotonic() >= w.deadline:  # its import hangs
                        self._load_timed_out = self._load_timed_out or not self._loaded
                        self._load_failed(
                            i, f"it did not finish loading within {self.load_retry_s:g} s{self._bound_by}"
                        )
                        if self.failed is not None:
                            break
        except Exception:  # a dead dispatcher would leave futures hanging: log, cancel them
            log.exception("reward pool dispatcher failed; pending reward calls are cancelled")
        finally:
            with self._lock:
                self._closed = True
            self._shutdown()
            self._first_start_over.set()

    def _shutdown(self) -> None:
        with self._lock:
            pending, self._pending = list(self._pending), deque()
        for call in pending:
            call.future.cancel()
        for w in self._workers:
            if w.call is not None:  # a running call is not waited for
                w.call.future.cancel()
            if w.state != "down":  # (a down worker is stopped already)
                # killed, idle ones too: a clean exit would orphan what their calls left running in groups of
                # their own, where no kill finds it any more
                self._stop(w)


# ── `rlctl check` ─────────────────────────────────────────────────────────────────────────────────


class LoadTimedOut(ValueError):
    """A reward's first start did not load it within its deadline (its import hangs, or is slow): no error of its
    own to say."""


def check_loads(spec: str, base_dir: Path, *, timeout_s: float, load_timeout_s: float | None = None) -> None:
    """What `rlctl check` verifies of a reward: that it loads — a built-in by its name, a user's function in one
    reward worker, as the job's pool loads it and within the pool's deadline for `timeout_s` (`load_retry_s`): the
    operator's process never imports the user's module, so a module whose import hangs (a network mount, a lock)
    is refused in one line at the deadline instead of hanging the check. Raises ValueError with that line (an
    error inside the module: the loader's, as `load_reward` words it; else the spec and the deadline)."""
    if ":" not in spec:
        load_reward(spec, base_dir)
        return
    RewardPool(spec, base_dir=base_dir, workers=1, timeout_s=timeout_s, load_retry_s=load_timeout_s, wait=True).close()
