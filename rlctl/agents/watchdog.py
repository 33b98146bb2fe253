"""Catching an agent whose work stopped moving: a busy phase of its main loop that runs past its limit.

Heartbeats come from their own thread, so an agent whose main loop hangs — an engine step that never returns, a
deadlock between its threads, a filesystem that stopped answering — still looks alive to the controller, and the
job waits for it forever. The main loop marks its busy phases (never its waits for work):

    with watchdog.busy("engine step"):      ──▶ a phase begins: its limit from the phase's history
        engine.step()                       ◀── it ended: its duration kept (the next limits)

    watcher thread, every TICK_S:  a phase past its limit ──▶ one ERROR line (phase, how long, the limit), every
        thread's stack into the agent's log, `on_hang` (a last heartbeat whose state says "hung: …"), exit HUNG_EXIT
    faulthandler (C), armed by the first phase after a wait and kept armed by the watcher while phases run: the
        same stacks and exit GRACE_S past the longest limit, without Python — for a hang that holds the GIL (the
        watcher cannot run then). It is the process's one timer: one watched agent per process

The controller then counts the agent lost as for any crash, naming the hang: a rollout unit's work is requeued and
a unit replaces it; a lost trainer fails the run, which `checkpoint.auto_resume` resumes.

Limits (`trainer.hang_timeout_s`, `rollout.hang_timeout_s`):

    auto    a phase's first run FIRST_S (compiles, CUDA graph capture, first collectives, first loads);
            after it, max(FLOOR_S, FACTOR × the longest it took so far)
    N       N seconds for every phase, its first run included
    never   no watch
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Literal, TextIO

log = logging.getLogger(__name__)

FIRST_S = 1800.0
FLOOR_S = 300.0
FACTOR = 10.0
TICK_S = 1.0
GRACE_S = 60.0  # the C backstop fires this long after the Python watcher would have
HUNG_EXIT = 70  # EX_SOFTWARE: the agent's exit status when it ended itself as hung
HUNG = "hung:"  # how its last heartbeat's state begins (the controller names the hang when it loses the agent)

HangTimeout = Literal["auto", "never"] | float


@dataclass
class Limits:
    """Each phase's limit from its history (see the module docstring)."""

    timeout: HangTimeout = "auto"
    longest: dict[str, float] = field(default_factory=dict)  # phase → the longest it took so far

    def limit(self, phase: str) -> float | None:
        """Seconds `phase` may run now; None: unwatched."""
        if self.timeout == "never":
            return None
        if not isinstance(self.timeout, str):
            return float(self.timeout)
        took = self.longest.get(phase)
        return FIRST_S if took is None else max(FLOOR_S, FACTOR * took)

    def ended(self, phase: str, took_s: float) -> None:
        self.longest[phase] = max(took_s, self.longest.get(phase, 0.0))

    def most(self) -> float | None:
        """The longest limit any phase has now (what the C backstop waits for)."""
        limits = [self.limit(p) for p in self.longest] + [self.limit("")]
        return max((x for x in limits if x is not None), default=None)


@dataclass(frozen=True)
class Phase:
    name: str
    started: float
    limit_s: float
    thread: int = 0  # the thread that runs it (its stack is written first)


class Watchdog:
    """One agent's watch over its main loop's busy phases. `on_hang(text)` runs on the watcher thread before the
    agent exits (a last word to the controller); `exit` ends the process; the stacks go to `stream` (default: stderr,
    the agent's log); `backstop`: arm faulthandler's timer too; `tick_s` None: no watcher thread (the caller calls
    `check`; a test on its own clock)."""

    def __init__(
        self,
        name: str,
        timeout: HangTimeout,
        *,
        on_hang: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        exit: Callable[[int], None] = os._exit,
        stream: TextIO | None = None,
        backstop: bool = True,
        tick_s: float | None = TICK_S,
    ) -> None:
        self.name = name
        self.limits = Limits(timeout)
        self._on_hang, self._clock, self._exit = on_hang, clock, exit
        self._stream, self._backstop = stream, backstop
        self._phase: Phase | None = None
        self.hung: Phase | None = None  # the phase that ran past its limit, once one did
        self._armed: float | None = None  # the C backstop's deadline (this clock), None when disarmed
        self._lock = threading.Lock()  # arming and disarming, from the loop and the watcher
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if timeout != "never" and tick_s is not None:
            self._thread = threading.Thread(target=self._watch, args=(tick_s,), name="watchdog", daemon=True)
            self._thread.start()

    @contextlib.contextmanager
    def busy(self, phase: str) -> Iterator[None]:
        """Mark a busy phase. Phases nest: an inner one is watched on its own limit while it runs, and the outer
        one again once it ends (from the outer's own start)."""
        limit = self.limits.limit(phase)
        if limit is None:
            yield
            return
        start = self._clock()
        outer = self._phase
        self._phase = current = Phase(phase, start, limit, threading.get_ident())
        if self._armed is None:  # the first phase after a wait: armed at once (it may hang holding the GIL at once)
            with self._lock:
                self._arm(current, start)
        try:
            yield
        finally:
            self._phase = outer
            self.limits.ended(phase, self._clock() - start)

    def current(self) -> tuple[str, float]:
        """The busy phase running now and for how long; ("", 0.0) while the loop waits for work (for heartbeats)."""
        phase = self._phase
        return ("", 0.0) if phase is None else (phase.name, max(0.0, self._clock() - phase.started))

    def check(self) -> bool:
        """One look (the watcher's tick): True when the phase running now is past its limit (the agent was ended)."""
        with self._lock:
            now = self._clock()
            phase = self._phase
            if phase is None:
                self._disarm()
                return False
            ran = now - phase.started
            if ran <= phase.limit_s:
                self._arm(phase, now)
                return False
        text = f"{HUNG} {phase.name} ran {ran:.0f} s, past its limit of {phase.limit_s:.0f} s"
        out = self._stream or sys.stderr
        log.error(
            "%s: %s has run %.0f s, past its limit of %.0f s (%s): it is hung. Every thread's stack follows; the "
            "agent exits %d so that the job goes on without it",
            self.name,
            phase.name,
            ran,
            phase.limit_s,
            _describe(self.limits.timeout),
            HUNG_EXIT,
        )
        with contextlib.suppress(Exception):  # the stacks are a courtesy: the exit must happen
            # the hung loop's own stack first: faulthandler writes the newest threads first and stops after 100, so
            # in an agent with many threads (a controller's readers, pools) the loop's — the oldest — was cut off
            frame = sys._current_frames().get(phase.thread)
            if frame is not None:
                out.write(f"The hung phase's thread ({phase.name}), most recent call last:\n")
                out.write(stack_text(frame))
            out.flush()
            faulthandler.dump_traceback(file=out, all_threads=True)
            out.flush()
        self.hung = phase  # for `on_hang`: which phase, on which thread
        if self._on_hang is not None:
            try:
                self._on_hang(text)
            except Exception as e:  # noqa: BLE001 - the last word may not reach the controller; the exit must happen
                log.warning("%s: could not tell the controller it hung: %s", self.name, e)
        self._exit(HUNG_EXIT)
        return True

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self._disarm()

    def _watch(self, tick_s: float) -> None:
        while not self._stop.wait(tick_s):
            if self.check():
                return

    def _arm(self, phase: Phase, now: float) -> None:
        """Keep the C backstop armed past the longest limit from this phase's start (under the lock): a hang that
        holds the GIL stops the watcher, and the backstop (re-armed at most once a tick, GRACE_S > TICK_S) fires no
        earlier than the own limit of whichever phase hung."""
        most = max(self.limits.most() or 0.0, phase.limit_s)
        deadline = phase.started + most + GRACE_S
        if self._armed is not None and abs(self._armed - deadline) < TICK_S:
            return
        if self._backstop:
            faulthandler.dump_traceback_later(max(deadline - now, TICK_S), exit=True, file=sys.stderr)
        self._armed = deadline

    def _disarm(self) -> None:
        if self._armed is not None and self._backstop:
            faulthandler.cancel_dump_traceback_later()
        self._armed = None


def stack_text(frame: FrameType) -> str:
    """`frame`'s stack, most recent call last, as a traceback names it — without reading any source file (a hang
    on a filesystem that stopped answering would stop the watchdog there, as it stopped the loop)."""
    summary = traceback.StackSummary.extract(traceback.walk_stack(frame), lookup_lines=False)
    return "".join(f'  File "{f.filename}", line {f.lineno}, in {f.name}\n' for f in reversed(summary))


def waits_in_collective(thread: int) -> bool:
    """Whether `thread` is inside a torch.distributed call: waiting for other ranks, not hung itself."""
    frame = sys._current_frames().get(thread)
    while frame is not None:
        if f"torch{os.sep}distributed{os.sep}" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def _describe(timeout: HangTimeout) -> str:
    if timeout == "auto":
        return (
            f"auto: {FIRST_S:.0f} s the first time, then {FACTOR:g} × its longest run so far, at least {FLOOR_S:.0f} s"
        )
    return f"hang_timeout_s {timeout:g}" if not isinstance(timeout, str) else str(timeout)
