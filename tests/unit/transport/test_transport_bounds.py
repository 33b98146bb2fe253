"""A header can never make a receiver allocate more than its configured bounds.

Each hostile header below arrives on a real socket whose sender then stays silent: the receiver must
refuse it from the header alone (a ProtocolError, not a stall waiting for bytes it wanted to read), without
calling the buffer provider (which is where tensor memory is allocated), and with a Python heap peak far
below what the header announces (tracemalloc).
"""

from __future__ import annotations

import socket
import struct
import threading
import tracemalloc
from typing import Any

import msgspec
import pytest
import torch

from rlctl.errors import ProtocolError
from rlctl.transport.base import TensorSpec
from rlctl.transport.framing import MAGIC, Limits
from rlctl.transport.tcp import TcpConfig, TcpConnection

LIMITS = Limits(max_header_bytes=64 << 10, max_frames=16, max_message_bytes=1 << 20)
CFG = TcpConfig(limits=LIMITS, stall_timeout_s=3, read_ahead_bytes=64 << 10)
PEAK_BYTES = 4 << 20  # read-ahead, the header bound and the decoded header, with room to spare


def frame(head: list[Any]) -> bytes:
    body = msgspec.msgpack.encode(head)
    return MAGIC + struct.pack("!I", len(body)) + body


def raw(body: bytes) -> bytes:
    return MAGIC + struct.pack("!I", len(body)) + body


HOSTILE = {
    "header length 2**32-1": MAGIC + struct.pack("!I", 2**32 - 1),
    "header length one over the bound": MAGIC + struct.pack("!I", LIMITS.max_header_bytes + 1),
    "frame of 2**63 bytes": frame(["k", {}, 1, 0, [["uint8", [2**63], 2**63]]]),
    "frame of 2**64-1 bytes": frame(["k", {}, 1, 0, [["uint8", [2**64 - 1], 2**64 - 1]]]),
    "frame of 2**62 float32 bytes": frame(["k", {}, 1, 0, [["float32", [2**30, 2**30], 2**62]]]),
    "frame size lying about its shape": frame(["k", {}, 1, 0, [["uint8", [8], 2**63]]]),
    "empty frame whose strides overflow": frame(["k", {}, 1, 0, [["uint8", [0, 2**62, 2**62], 0]]]),
    "frames over the count bound": frame(["k", {}, 1, 0, [["uint8", [1], 1]] * (LIMITS.max_frames + 1)]),
    "frames each in bound, together over": frame(["k", {}, 1, 0, [["uint8", [1 << 19], 1 << 19]] * 3]),
    "msgpack array of 2**32-1 items": raw(b"\xdd\xff\xff\xff\xff"),
    "msgpack map of 2**32-1 items": raw(b"\xdf\xff\xff\xff\xff"),
    "msgpack str of 2**32-1 bytes": raw(b"\x95\xdb\xff\xff\xff\xff"),
    "msgpack bin of 2**32-1 bytes": raw(b"\x95\xa1k\x81\xa1b\xc6\xff\xff\xff\xff"),
    "nesting deeper than Python's recursion limit": raw(
        b"\x95\xa1k\x81\xa1h" + b"\x91" * 20_000 + b"\xc0" + b"\x00\x00\x90"
    ),
}


@pytest.mark.parametrize("stream", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_header_is_refused_before_any_allocation(stream: bytes) -> None:
    a, b = socket.socketpair()
    sender = threading.Thread(target=a.sendall, args=(stream,))
    sender.start()  # and then stays silent, the socket open: a receiver that wanted more would stall
    asked: list[list[TensorSpec]] = []

    def provider(kind: str, header: dict[str, Any], specs: list[TensorSpec]) -> list[torch.Tensor]:
        asked.append(specs)
        return [torch.empty(s.shape, dtype=s.dtype) for s in specs]

    conn = TcpConnection(b, "hostile", CFG)
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match="hostile"):
            conn.recv(timeout_s=10, into=provider)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        sender.join()
        conn.close()
        a.close()
    assert asked == []
    assert peak < PEAK_BYTES, f"{peak} bytes allocated for a refused header"


def test_a_header_in_bound_is_allocated_as_announced() -> None:
    """The counterpart: the same path does allocate, exactly what a header within the bounds announces."""
    n = LIMITS.max_message_bytes
    a, b = socket.socketpair()
    sender = threading.Thread(target=a.sendall, args=(frame(["k", {}, 1, 0, [["uint8", [n], n]]]) + bytes(n),))
    sender.start()
    asked: list[int] = []

    def provider(kind: str, header: dict[str, Any], specs: list[TensorSpec]) -> list[torch.Tensor]:
        asked.append(sum(s.nbytes for s in specs))
        return [torch.empty(s.shape, dtype=s.dtype) for s in specs]

    conn = TcpConnection(b, "fine", CFG)
    try:
        msg = conn.recv(timeout_s=10, into=provider)
    finally:
        sender.join()
        conn.close()
        a.close()
    assert asked == [n] and msg.tensors[0].numel() == n


def test_an_agent_on_a_site_without_rdma_leaves_infiniband_out_of_ucx_unless_told_otherwise() -> None:
    from rlctl.transport.ucx import ENV_RDMA, NO_RDMA_TLS, transports_for

    assert transports_for({ENV_RDMA: "0"}) == NO_RDMA_TLS == "^ib"
    assert transports_for({ENV_RDMA: "0", "UCX_TLS": "tcp"}) is None  # the operator's (or the site setup's) choice
    assert transports_for({ENV_RDMA: "1"}) is None and transports_for({}) is None  # UCX picks (RDMA where it is)
