"""The in-process transport: the test double and the single-process mode (`inproc://name`).

Messages cross a pair of queues instead of a socket, but keep wire semantics: the header is
encoded and decoded with the same msgpack codec and bounds as TCP (a header TCP would refuse
is refused here too), tensors are copied at send time (the receiver owns its tensors, as if
they had crossed a wire), and connecting requires the same per-job secret.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import queue
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlctl.errors import CredentialsRefused, PeerClosed, PeerTimeout, PeerUnreachable
from rlctl.transport import framing
from rlctl.transport.base import (
    BufferProvider,
    Connection,
    Listener,
    Message,
    Transport,
    check_buffers,
    empty_buffers,
)

if TYPE_CHECKING:
    import torch

_registry: dict[str, InprocListener] = {}
_registry_lock = threading.Lock()
_anon = itertools.count(1)


@dataclass
class _Packet:
    head: bytes  # encoded header (preamble stripped)
    tensors: list[torch.Tensor]


_CLOSED = _Packet(b"", [])


class InprocConnection(Connection):
    def __init__(self, peer: str, inbox: queue.Queue[_Packet], outbox: queue.Queue[_Packet]) -> None:
        super().__init__(peer)
        self._inbox = inbox
        self._outbox = outbox
        self._closed = False
        self._peer_closed = False
        self.limits = framing.Limits()

    def _send(self, msg: Message) -> None:
        if self._closed or self._peer_closed:
            raise PeerUnreachable(f"{self.peer}: connection is closed")
        tensors = [t.clone() for t in framing.wire_tensors(msg.tensors)]
        head = framing.encode_header(msg, tensors)[framing.PREAMBLE.size :]
        self._outbox.put(_Packet(head, tensors))

    def _recv(self, timeout_s: float | None, into: BufferProvider) -> Message:
        if self._closed or self._peer_closed:
            raise PeerUnreachable(f"{self.peer}: connection is closed")
        try:
            pkt = self._inbox.get(timeout=timeout_s)
        except queue.Empty as e:
            raise PeerTimeout(f"{self.peer}: no message within {timeout_s}s") from e
        if pkt is _CLOSED:
            self._peer_closed = True
            raise PeerClosed(f"{self.peer}: connection closed by peer")
        wh, specs = framing.decode_header(pkt.head, self.limits, self.peer)
        if into is empty_buffers:
            bufs = pkt.tensors
            check_buffers(specs, bufs)  # what the header announces is what arrives, as over a wire
        else:
            bufs = into(wh.kind, wh.header, specs)
            check_buffers(specs, bufs)
            for dst, src in zip(bufs, pkt.tensors, strict=True):
                dst.copy_(src)
        return Message(wh.kind, wh.header, bufs, msg_id=wh.msg_id, reply_to=wh.reply_to)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._outbox.put(_CLOSED)


class InprocListener(Listener):
    def __init__(self, address: str, secret_digest: bytes) -> None:
        self.address = address
        self.secret_digest = secret_digest
        self.pending: queue.Queue[InprocConnection] = queue.Queue()

    def accept(self, timeout_s: float | None = None) -> Connection:
        try:
            return self.pending.get(timeout=timeout_s)
        except queue.Empty as e:
            raise PeerTimeout(f"{self.address}: no connection within {timeout_s}s") from e

    def close(self) -> None:
        with _registry_lock:
            if _registry.get(self.address) is self:
                del _registry[self.address]


class InprocTransport(Transport):
    scheme = "inproc"

    def __init__(self, *, secret: bytes) -> None:
        if not secret:
            raise ValueError("a per-job secret is required (non-empty bytes)")
        self._digest = hashlib.sha256(secret).digest()

    def listen(self, address: str) -> Listener:
        if not address.startswith("inproc://"):
            raise ValueError(f"address {address!r} is not an inproc address; expected inproc://NAME")
        if address == "inproc://":
            address = f"inproc://anon-{next(_anon)}"
        with _registry_lock:
            if address in _registry:
                raise PeerUnreachable(f"{address}: already in use")
            lst = InprocListener(address, self._digest)
            _registry[address] = lst
        return lst

    def connect(self, address: str, timeout_s: float) -> Connection:
        del timeout_s  # connecting in-process never waits
        with _registry_lock:
            lst = _registry.get(address)
        if lst is None:
            raise PeerUnreachable(f"{address}: nobody listens there")
        if not hmac.compare_digest(lst.secret_digest, self._digest):
            raise CredentialsRefused(f"{address}: refused our credentials; check that both sides use this job's secret")
        a: queue.Queue[_Packet] = queue.Queue()
        b: queue.Queue[_Packet] = queue.Queue()
        lst.pending.put(InprocConnection(f"inproc-client->{address}", inbox=a, outbox=b))
        return InprocConnection(address, inbox=b, outbox=a)
