"""What every agent process shares: its job directory, its link to the controller, its heartbeat.

reader thread:    controller ──recv──▶ inbox (queue of Message; None = link closed)
heartbeat thread: every interval ──heartbeat(figures())──▶ controller
main loop (the agent): inbox.get() … link.send(…)
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlctl.agents.messages import FROM_CONTROLLER, Heartbeat, Hello, make, recv_checked
from rlctl.config.job import JobFile
from rlctl.errors import TransportError
from rlctl.launch.jobdir import JobDir
from rlctl.transport import Connection, Message, Transport, make_transport

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 1.0


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
        return cls(jd, job, transport or make_transport(job.transport.kind, secret=jd.secret()), controller)


class ControllerLink:
    """One agent's connection to the controller: a reader thread feeding `inbox`, and heartbeats."""

    def __init__(
        self,
        ctx: AgentContext,
        hello: Hello,
        *,
        figures: Callable[[], Heartbeat],
        inbox: queue.Queue[Message | None] | None = None,
    ) -> None:
        self.name = hello.name
        self.inbox: queue.Queue[Message | None] = inbox if inbox is not None else queue.Queue()
        self._figures = figures
        self._closed = threading.Event()
        self.conn: Connection = ctx.transport.connect(ctx.controller, timeout_s=ctx.job.transport.timeout_s)
        self.conn.send(make("hello", hello))
        threading.Thread(target=self._read, name="controller-reader", daemon=True).start()
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    def send(self, msg: Message) -> None:
        self.conn.send(msg)

    def close(self, *, final: Heartbeat | None = None) -> None:
        if final is not None:
            with contextlib.suppress(TransportError):  # the controller is already gone: nothing to tell
                self.conn.send(make("bye", final))
        self._closed.set()
        self.conn.close()

    def _read(self) -> None:
        while not self._closed.is_set():
            try:
                self.inbox.put(recv_checked(self.conn, peer=f"controller {self.conn.peer}", kinds=FROM_CONTROLLER))
            except TransportError as e:
                if not self._closed.is_set():
                    log.warning("controller link closed: %s", e)
                self.inbox.put(None)
                return

    def _beat(self) -> None:
        while not self._closed.wait(HEARTBEAT_INTERVAL_S):
            try:
                self.conn.send(make("heartbeat", self._figures()))
            except TransportError:
                return
