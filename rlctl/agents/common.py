"""What every agent process shares: its job directory, its link to the controller, its heartbeat.

reader thread:    controller ──recv──▶ inbox (queue of Message; None = the agent must leave)
heartbeat thread: every interval ──heartbeat(figures())──▶ controller
main loop (the agent): inbox.get() … link.send(…)

Every wait on the controller is bounded: it pings every agent (PING_INTERVAL_S), so a reader that hears
nothing for the job's `transport.unreachable_timeout_s` knows its controller is gone or cut off and leaves
(the controller counts it lost after the same bound). A link that breaks:

    trainer:        leave (what it was sent on the old connection may be lost; `launch --resume` continues)
    rollout unit:   reconnect and say hello again, until that bound since the controller last spoke;
                    refused (nothing listens there: the controller exited) → leave at once.
                    Messages sent while the link is down are dropped: the controller requeues the unit's
                    work when it hears the new hello.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from rlctl.agents.messages import FROM_CONTROLLER, Heartbeat, Hello, make, recv_checked
from rlctl.config.job import JobFile
from rlctl.config.task import DatasetTask, DigitsTask
from rlctl.errors import PeerTimeout, TransportError
from rlctl.launch.jobdir import JobDir
from rlctl.transport import Connection, Message, Transport, make_transport

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 1.0
PING_INTERVAL_S = 2.0  # the controller's keepalive to every agent (see the module docstring)
RECONNECT_PAUSE_S = 2.0  # between a rollout unit's attempts to reach its controller again


def job_context(job: JobFile) -> int | None:
    """Tokens of the longest sequence the job's models see: its task's longest prompt (held-out ones are held to the
    same bound) plus the most output tokens a request asks for. The policy, its reference and the engines are
    built for it (their RoPE tables, vLLM's max_model_len and CPU K/V space) where the checkpoint allows more
    (1,024,000 positions of tables are ≈ 1 GiB a model); None where the task has no prompts (kind lengths)."""
    task = job.task
    if isinstance(task, DatasetTask):
        return task.max_prompt_tokens + output_budget(job)
    if isinstance(task, DigitsTask):
        from rlctl.rl.tasks import DigitsTask as Digits

        return Digits(task).context  # (its max_prompt_tokens + output_budget)
    return None


def output_budget(job: JobFile) -> int:
    """The most output tokens a request of the job asks for: the task's max_output_tokens, or the digits task's
    own cap below it (an answer of at most 9 × MAX_DIGITS letters and EOS) — what `loss_aggregation: constant`
    divides by per sample, as no output can be longer."""
    task = job.task
    if isinstance(task, DigitsTask):
        from rlctl.rl.tasks import DigitsTask as Digits

        return Digits(task).max_new_tokens
    return task.max_output_tokens


@dataclass
class AgentContext:
    jobdir: JobDir
    job: JobFile
    transport: Transport
    controller: str  # the controller's RPC address

    @classmethod
    def load(cls, job_dir: Path, *, controller: str | None = None, transport: Transport | None = None) -> AgentContext:
        jd = JobDir(job_dir)
        job = jd.read_job()
        if controller is None:
            controller = str(jd.read_json(jd.controller_json)["address"])
        transport = transport or make_transport(job.transport.kind, secret=jd.secret(), encrypt=job.transport.encrypt)
        return cls(jd, job, transport, controller)


class ControllerLink:
    """One agent's connection to the controller: a reader thread feeding `inbox`, and heartbeats.
    `reconnect`: a broken link is re-established with a new hello (rollout units), and the link ends in order
    even when the unit is killed (`Connection.end_in_order_on_exit`)."""

    def __init__(
        self,
        ctx: AgentContext,
        hello: Hello,
        *,
        figures: Callable[[], Heartbeat],
        inbox: queue.Queue[Message | None] | None = None,
        reconnect: bool = False,
    ) -> None:
        self.name = hello.name
        self.inbox: queue.Queue[Message | None] = inbox if inbox is not None else queue.Queue()
        self._ctx, self._hello, self._figures, self._reconnect = ctx, hello, figures, reconnect
        self.silence_s = ctx.job.transport.unreachable_timeout_s
        self._poll_s = min(2 * PING_INTERVAL_S, self.silence_s)  # how often the reader checks the silence
        self._closed = threading.Event()
        self.reconnects = 0
        self._said_hello = False  # each hello after the first says `again`: the controller may have let it go
        self.conn: Connection = self._connect()
        threading.Thread(target=self._read, name="controller-reader", daemon=True).start()
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    def _connect(self) -> Connection:
        conn = self._ctx.transport.connect(self._ctx.controller, timeout_s=self._ctx.job.transport.timeout_s)
        if self._reconnect:
            # a unit killed mid-generation: its stream still ends in order, so every progress report it wrote
            # arrives and the controller knows it lost at most the steps since (`keeper.py`)
            conn.end_in_order_on_exit()
        hello = msgspec.structs.replace(self._hello, version=self._figures().version, again=self._said_hello)
        conn.send(make("hello", hello))
        self._said_hello = True
        return conn

    def send(self, msg: Message) -> bool:
        """Send to the controller (True). A unit that reconnects drops what it cannot send meanwhile (False; see
        above)."""
        try:
            self.conn.send(msg)
        except TransportError as e:
            if not self._reconnect or self._closed.is_set():
                raise
            log.info("%s: dropped %s while the controller link is down: %s", self.name, msg.kind, e)
            return False
        return True

    def close(self, *, final: Heartbeat | None = None) -> None:
        if final is not None:
            with contextlib.suppress(TransportError):  # the controller is already gone: nothing to tell
                self.conn.send(make("bye", final))
        self._closed.set()
        self.conn.close()

    def _read(self) -> None:
        heard = time.monotonic()  # when the controller last spoke
        while not self._closed.is_set():
            conn = self.conn
            try:
                msg = recv_checked(conn, peer=f"controller {conn.peer}", kinds=FROM_CONTROLLER, timeout_s=self._poll_s)
            except PeerTimeout:
                if time.monotonic() - heard > self.silence_s:
                    log.warning(
                        "%s: controller %s said nothing (no work, no ping) for %.0f s: leaving",
                        self.name,
                        conn.peer,
                        self.silence_s,
                    )
                    break
                continue
            except TransportError as e:
                if self._closed.is_set():
                    return
                log.warning("controller link closed: %s", e)
                if self._reconnect and self._again(heard):
                    continue
                break
            heard = time.monotonic()
            if msg.kind != "ping":
                self.inbox.put(msg)
        if not self._closed.is_set():
            self.conn.close()
        self.inbox.put(None)

    def _again(self, heard: float) -> bool:
        """Reconnect until `silence_s` after the controller last spoke; False when it cannot be reached (refused:
        it no longer listens, or the bound passed)."""
        while not self._closed.is_set():
            left = self.silence_s - (time.monotonic() - heard)
            if left <= 0:
                log.warning(
                    "%s: controller %s unreachable for %.0f s: leaving", self.name, self._ctx.controller, self.silence_s
                )
                return False
            self.conn.close()  # the broken one (and its keeper)
            try:
                self.conn = self._connect()
            except TransportError as e:
                if isinstance(e.__cause__, ConnectionRefusedError):
                    log.warning("%s: %s: nothing listens there, the controller is gone: leaving", self.name, e)
                    return False
                log.info(
                    "%s: controller %s still unreachable (%s); %.0f s left", self.name, self._ctx.controller, e, left
                )
                self._closed.wait(min(RECONNECT_PAUSE_S, max(left, 0.0)))
                continue
            self.reconnects += 1
            log.info("%s: reconnected to controller %s and said hello again", self.name, self._ctx.controller)
            return True
        return False

    def _beat(self) -> None:
        while not self._closed.wait(HEARTBEAT_INTERVAL_S):
            try:
                self.conn.send(make("heartbeat", self._figures()))
            except TransportError:
                if not self._reconnect:
                    return
