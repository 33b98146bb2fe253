"""The tensor RPC interface: messages, connections, listeners and transports.

Every plane of a job (control, samples, weights) talks through these four types. A message is
a small typed header plus tensors carried as raw frames; implementations (`tcp`, `inproc`,
`ucx`) never pickle and receive tensor bytes straight into preallocated buffers.

    client                                   server
    transport.connect(addr) ──handshake──▶   listener.accept() → Connection
    conn.request(msg)  ───── msg ────────▶   conn.recv() → req
                       ◀──── reply ──────    conn.reply(req, Message(...))
    conn.send(msg)     ───── one-way ────▶   conn.recv()

A connection is safe for one sender thread plus one receiver thread at a time.
"""

from __future__ import annotations

import itertools
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from rlctl.errors import ProtocolError

if TYPE_CHECKING:  # torch loads with the first tensor (`rlctl status` and `stop` never need it)
    import torch


@dataclass
class Message:
    """One RPC message: `kind` names it, `header` is msgpack-able, `tensors` travel as raw frames.

    `msg_id` / `reply_to` are filled in by the connection (request/response correlation).
    """

    kind: str
    header: dict[str, Any] = field(default_factory=dict)
    tensors: list[torch.Tensor] = field(default_factory=list)
    msg_id: int = 0
    reply_to: int = 0


@dataclass(frozen=True)
class TensorSpec:
    """What the header announces about one tensor frame before its bytes arrive."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int


# Called by a receiver once the header of a message is known: returns one tensor per spec to
# receive into (contiguous, matching dtype and shape), e.g. a slice of a weight buffer.
BufferProvider: TypeAlias = "Callable[[str, dict[str, Any], list[TensorSpec]], list[torch.Tensor]]"


def empty_buffers(kind: str, header: dict[str, Any], specs: list[TensorSpec]) -> list[torch.Tensor]:
    """The default BufferProvider: fresh `torch.empty` tensors (a message without frames does not import torch)."""
    del kind, header
    if not specs:
        return []
    import torch

    return [torch.empty(s.shape, dtype=s.dtype) for s in specs]


def check_buffers(specs: list[TensorSpec], bufs: list[torch.Tensor]) -> None:
    if len(bufs) != len(specs):
        raise ProtocolError(f"buffer provider returned {len(bufs)} tensors for {len(specs)} frames")
    for s, b in zip(specs, bufs, strict=True):
        if b.dtype != s.dtype or tuple(b.shape) != s.shape or not b.is_contiguous():
            raise ProtocolError(f"buffer {b.dtype}{tuple(b.shape)} does not fit frame {s.dtype}{s.shape}")


class Connection(ABC):
    """One authenticated, bidirectional, ordered message stream to `peer`."""

    peer: str

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        # Messages read by request() while waiting for its reply; recv() returns them first.
        self._stash: deque[Message] = deque()

    # -- implementation hooks -------------------------------------------------------------
    @abstractmethod
    def _send(self, msg: Message) -> None:
        """Write one message (msg_id/reply_to already set)."""

    @abstractmethod
    def _recv(self, timeout_s: float | None, into: BufferProvider) -> Message:
        """Read one message; PeerTimeout if none starts within timeout_s."""

    @abstractmethod
    def close(self) -> None:
        """Close the stream; the peer's next recv raises PeerUnreachable."""

    def end_in_order_on_exit(self) -> bool:
        """Make the stream end in order even if this process dies without closing it (killed): every message
        sent is delivered, then the peer's recv raises PeerClosed. False where the transport cannot (the
        default: an in-process stream ends with its process anyway)."""
        return False

    # -- public API -------------------------------------------------------------------------
    def send(self, msg: Message) -> None:
        """Send one-way (or as a reply when msg.reply_to is set). Blocks until handed to the OS."""
        with self._send_lock:
            if msg.msg_id == 0:
                msg.msg_id = next(self._ids)
            self._send(msg)

    def recv(self, timeout_s: float | None = None, *, into: BufferProvider | None = None) -> Message:
        """Next message; tensors land in buffers from `into` (default: fresh tensors)."""
        if self._stash:
            return self._stash.popleft()
        return self._recv(timeout_s, into or empty_buffers)

    def reply(self, request: Message, msg: Message) -> None:
        msg.reply_to = request.msg_id
        self.send(msg)

    def request(self, msg: Message, timeout_s: float | None = None, *, into: BufferProvider | None = None) -> Message:
        """Send and wait for the reply; other messages arriving meanwhile stay queued for recv()."""
        msg.msg_id = 0
        self.send(msg)
        while True:
            got = self._recv(timeout_s, into or empty_buffers)
            if got.reply_to == msg.msg_id:
                return got
            self._stash.append(got)

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Listener(ABC):
    """Accepts authenticated connections at `address` (the real one, port 0 resolved)."""

    address: str

    @abstractmethod
    def accept(self, timeout_s: float | None = None) -> Connection:
        """Next authenticated peer. AuthError if it failed the handshake, PeerTimeout if none came."""

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Transport(ABC):
    """Factory of listeners and connections for one scheme, holding the per-job secret."""

    scheme: str

    @abstractmethod
    def listen(self, address: str) -> Listener:
        """Listen at `address` (`tcp://host:0` picks a free port; `.address` tells the real one)."""

    @abstractmethod
    def connect(self, address: str, timeout_s: float) -> Connection:
        """Connect and authenticate. PeerUnreachable / PeerTimeout / AuthError name the peer."""


def split_address(address: str, scheme: str) -> tuple[str, int]:
    """`tcp://host:port` → (host, port); ValueError naming the valid form otherwise."""
    prefix = f"{scheme}://"
    if not address.startswith(prefix):
        raise ValueError(f"address {address!r} is not a {scheme} address; expected {prefix}HOST:PORT")
    host, sep, port = address[len(prefix) :].rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {address!r} has no port; expected {prefix}HOST:PORT")
    return host.strip("[]"), int(port)


def bind_host(address: str) -> str:
    """The interface a listener at `address` (`tcp://10.0.0.5:4000`) is bound to: where the same process's
    other servers (its metrics endpoint) bind too, so an agent listens only where it was configured to.
    The loopback for an in-process address."""
    scheme, sep, rest = address.partition("://")
    if not sep or scheme == "inproc":
        return "127.0.0.1"
    return rest.rpartition(":")[0].strip("[]") or "127.0.0.1"
