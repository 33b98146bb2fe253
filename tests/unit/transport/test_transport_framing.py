"""Framing: every dtype and shape round-trips bit-exactly; bounds and bad frames are refused."""

from __future__ import annotations

import socket
import threading

import pytest
import torch

from rlctl.errors import PeerTimeout, PeerUnreachable, ProtocolError
from rlctl.transport import Message
from rlctl.transport.framing import PREAMBLE, Limits, decode_header, dtypes, encode_header, wire_tensors
from rlctl.transport.tcp import TcpConfig, TcpConnection

SHAPES = [(), (0,), (3, 0, 2), (1,), (5, 7), (2, 3, 4)]


def _sample(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    n = 1
    for d in shape:
        n *= d
    raw = torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8)
    return raw.view(dtype).reshape(shape) if n else torch.empty(shape, dtype=dtype)


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    cfg = TcpConfig(stall_timeout_s=5)
    for s in (a, b):
        s.settimeout(cfg.stall_timeout_s)
    ca, cb = TcpConnection(a, "peer-b", cfg), TcpConnection(b, "peer-a", cfg)
    yield ca, cb
    ca.close()
    cb.close()


def _same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    if x.numel() == 0:
        return True
    xb = x.contiguous().reshape(-1).view(torch.uint8)
    return torch.equal(xb, y.contiguous().reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("dtype", list(dtypes().values()), ids=list(dtypes()))
def test_every_dtype_and_shape_round_trips_bit_exactly(pair, dtype):
    a, b = pair
    tensors = [_sample(dtype, s) for s in SHAPES]
    a.send(Message("t", {"n": len(tensors)}, tensors))
    got = b.recv(timeout_s=5)
    assert got.kind == "t" and got.header == {"n": len(tensors)}
    assert all(_same_bits(x, y) for x, y in zip(tensors, got.tensors, strict=True))


def test_non_contiguous_and_sliced_tensors_arrive_as_their_values(pair):
    a, b = pair
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    views = [base.t(), base[:, 3], base[1:5:2, ::3], torch.arange(10)[2:7], base.expand(2, 6, 10)[1]]
    a.send(Message("v", {}, views))
    got = b.recv(timeout_s=5)
    for x, y in zip(views, got.tensors, strict=True):
        assert torch.equal(x, y) and y.is_contiguous()


def test_large_frames_and_read_ahead_boundaries(pair):
    a, b = pair
    ts = [torch.randn(300_001), torch.randint(0, 9, (7,)), torch.randn(70_000).to(torch.bfloat16)]
    th = threading.Thread(target=lambda: [a.send(Message("m", {"i": i}, ts)) for i in range(3)])
    th.start()
    for i in range(3):
        got = b.recv(timeout_s=10)
        assert got.header["i"] == i and all(torch.equal(x, y) for x, y in zip(ts, got.tensors, strict=True))
    th.join()


def test_request_reply_correlates_and_keeps_interleaved_messages(pair):
    a, b = pair

    def server():
        req = b.recv(timeout_s=5)
        b.send(Message("note", {"seq": 1}))  # one-way message before the reply
        b.reply(req, Message("answer", {"x": req.header["x"] * 2}))

    th = threading.Thread(target=server)
    th.start()
    reply = a.request(Message("ask", {"x": 21}), timeout_s=5)
    th.join()
    assert (reply.kind, reply.header) == ("answer", {"x": 42})
    assert a.recv(timeout_s=5).kind == "note"


def test_recv_into_provided_buffer_lands_in_place(pair):
    a, b = pair
    dest = torch.zeros(100, dtype=torch.uint8)
    payload = torch.arange(40, dtype=torch.uint8)
    a.send(Message("chunk", {"offset": 30}, [payload]))
    b.recv(timeout_s=5, into=lambda kind, h, specs: [dest[h["offset"] : h["offset"] + specs[0].nbytes]])
    assert torch.equal(dest[30:70], payload) and int(dest[:30].sum()) == 0 and int(dest[70:].sum()) == 0


def test_recv_timeout_leaves_connection_usable(pair):
    a, b = pair
    with pytest.raises(PeerTimeout, match="peer-a"):
        b.recv(timeout_s=0.05)
    a.send(Message("late"))
    assert b.recv(timeout_s=5).kind == "late"


def test_peer_close_is_peer_unreachable(pair):
    a, b = pair
    a.close()
    with pytest.raises(PeerUnreachable, match="peer-a"):
        b.recv(timeout_s=5)


def test_header_bounds_and_bad_frames_are_refused():
    lim = Limits(max_header_bytes=1 << 10, max_frames=2, max_message_bytes=1000)
    msg = Message("x", {}, wire_tensors([torch.zeros(100), torch.zeros(200)]))
    head = encode_header(msg, msg.tensors)[PREAMBLE.size :]
    with pytest.raises(ProtocolError, match="exceeds the bound of 1000"):
        decode_header(head, lim, "p")
    three = Message("x", {}, wire_tensors([torch.zeros(1)] * 3))
    with pytest.raises(ProtocolError, match="3 frames"):
        decode_header(encode_header(three, three.tensors)[PREAMBLE.size :], lim, "p")
    with pytest.raises(ProtocolError, match="malformed"):
        decode_header(b"\xc1garbage", lim, "p")


def test_oversized_message_closes_the_stream():
    a, b = socket.socketpair()
    small = TcpConfig(limits=Limits(max_message_bytes=1 << 10), stall_timeout_s=5)
    ca, cb = TcpConnection(a, "a", TcpConfig()), TcpConnection(b, "b", small)
    ca.send(Message("big", {}, [torch.zeros(1 << 12, dtype=torch.uint8)]))
    with pytest.raises(ProtocolError, match="exceeds the bound"):
        cb.recv(timeout_s=5)
    with pytest.raises(PeerUnreachable):
        cb.recv(timeout_s=0.1)
    ca.close()


def test_unsendable_inputs_fail_at_the_sender(pair):
    a, _ = pair
    with pytest.raises(ValueError, match="not msgpack-able"):
        a.send(Message("x", {"obj": object()}))
    with pytest.raises(ValueError, match="cannot travel"):
        a.send(Message("x", {}, [torch.zeros(2, dtype=torch.float8_e4m3fnuz)]))
