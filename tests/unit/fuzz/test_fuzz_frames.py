"""Fuzzing the RPC frame decoder: the real TCP receiver (`TcpConnection.recv`) and the in-process one
read generated and mutated byte streams. Only documented errors may come out — a message, or
ProtocolError (malformed, bound exceeded) / PeerUnreachable (the stream ended) — and no header makes
the receiver ask for more tensor memory than `Limits.max_message_bytes`.

    seeds (valid messages) ──mutate (bits, bytes, lengths, splices, header fields)──▶ byte stream
        ──▶ FeedSocket (the stream behind recv_into, in small pieces) ──▶ TcpConnection.recv until it raises

The bulk runs as a seeded loop (fast, reproducible); hypothesis adds structured headers of any msgpack
shape, and a real socketpair checks the same over the kernel.
"""

from __future__ import annotations

import os
import random
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.errors import PeerUnreachable, ProtocolError
from rlctl.transport import Message
from rlctl.transport.base import TensorSpec
from rlctl.transport.framing import MAGIC, PREAMBLE, Limits, dtypes, encode_header, tensor_bytes, wire_tensors
from rlctl.transport.inproc import InprocConnection, _Packet
from rlctl.transport.tcp import TcpConfig, TcpConnection

LIMITS = Limits(max_header_bytes=16 << 10, max_frames=64, max_message_bytes=256 << 10)
CFG = TcpConfig(limits=LIMITS, read_ahead_bytes=1024, stall_timeout_s=5)  # small: headers outgrow read-ahead
NUM_MUTATED = 100_000
INTERESTING = [0, 1, 2, 7, 8, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63]
HUGE = [2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


class FeedSocket:
    """`data` and then end of stream behind the calls TcpConnection makes, at most `piece` bytes per read."""

    def __init__(self, data: bytes, fd: int, piece: int) -> None:
        self._data, self._pos, self._fd, self._piece = memoryview(data), 0, fd, piece

    def fileno(self) -> int:
        return self._fd

    def recv_into(self, view: memoryview) -> int:
        n = min(len(view), len(self._data) - self._pos, self._piece)
        view[:n] = self._data[self._pos : self._pos + n]
        self._pos += n
        return n

    def shutdown(self, how: int) -> None:
        del how

    def close(self) -> None:
        pass


class Allocations:
    """A BufferProvider that checks each message's tensors fit the bound before allocating them."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.messages = 0

    def __call__(self, kind: str, header: dict[str, Any], specs: list[TensorSpec]) -> list[torch.Tensor]:
        del kind, header
        total = sum(s.nbytes for s in specs)
        assert total <= self.limits.max_message_bytes, f"asked to allocate {total} bytes"
        assert len(specs) <= self.limits.max_frames
        self.messages += 1
        return [torch.empty(s.shape, dtype=s.dtype) for s in specs]


def encode(msg: Message) -> bytes:
    tensors = wire_tensors(msg.tensors)
    return b"".join([encode_header(msg, tensors), *(bytes(tensor_bytes(t)) for t in tensors)])


def seeds() -> list[bytes]:
    """Valid streams: every dtype, empty and scalar frames, nested headers, several messages in a row."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i, (name, dtype) in enumerate(dtypes().items()):
        shape = [(), (0,), (3,), (2, 5), (1, 0, 4)][i % 5]
        raw = torch.randint(0, 256, (max(1, _numel(shape)) * dtype.itemsize,), dtype=torch.uint8, generator=g)
        t = raw[: _numel(shape) * dtype.itemsize].view(dtype).reshape(shape)
        out.append(encode(Message(f"t-{name}", {"i": i, "nested": {"a": [1, 2.5, None, "x"]}}, [t], msg_id=i + 1)))
    out.append(encode(Message("empty")))
    out.append(encode(Message("sample", {"sample_id": "s-1", "version": 3}, [torch.arange(5, dtype=torch.int32)])))
    out.append(encode(Message("big-header", {"blob": "x" * 3000, "ids": list(range(300))}, [torch.zeros(2, 3)])))
    out.append(out[0] + out[1] + out[-1])  # three messages on one stream
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# -- mutations --------------------------------------------------------------------------------------------
def _flip_bits(r: random.Random, b: bytearray, _: list[bytes]) -> None:
    for _i in range(r.randint(1, 8)):
        i = r.randrange(len(b))
        b[i] ^= 1 << r.randrange(8)


def _set_bytes(r: random.Random, b: bytearray, _: list[bytes]) -> None:
    for _i in range(r.randint(1, 4)):
        b[r.randrange(len(b))] = r.choice(
            [0x00, 0xFF, 0x7F, 0x80, 0xC1, 0xDC, 0xDD, 0xDE, 0xDF, 0xCF, 0xD3, r.randrange(256)]
        )


def _set_int(r: random.Random, b: bytearray, _: list[bytes]) -> None:
    width = r.choice([1, 2, 4, 8])
    value = r.choice(INTERESTING) % (1 << (8 * width))
    i = r.randrange(max(1, len(b) - width + 1))
    b[i : i + width] = value.to_bytes(width, "big")


def _set_header_length(r: random.Random, b: bytearray, _: list[bytes]) -> None:
    if len(b) >= PREAMBLE.size:
        b[4:8] = struct.pack("!I", r.choice([0, 1, 5, LIMITS.max_header_bytes, LIMITS.max_header_bytes + 1, 2**32 - 1]))


def _insert(r: random.Random, b: bytearray, _: list[bytes]) -> None:
    i = r.randrange(len(b) + 1)
    b[i:i] = os.urandom(r.randint(1, 16)) if r.random() < 0.5 else bytes([r.randrange(256)]) * r.randint(1, 64)


def _delete(r: random.Random, b: bytearray, _: list[bytes]) -> None:
    i = r.randrange(len(b))
    del b[i : i + r.randint(1, 32)]


def _truncate(r: random.Random, b: bytearray, _: list[bytes]) -> None:
    del b[r.randrange(len(b)) :]


def _duplicate(r: random.Random, b: bytearray, _: list[bytes]) -> None:
    i = r.randrange(len(b))
    piece = b[i : i + r.randint(1, 64)]
    j = r.randrange(len(b) + 1)
    b[j:j] = piece


def _splice(r: random.Random, b: bytearray, corpus: list[bytes]) -> None:
    other = r.choice(corpus)
    b[r.randrange(len(b) + 1) :] = other[r.randrange(len(other)) :]


def _field(r: random.Random, b: bytearray, _: list[bytes]) -> None:
    """Re-encode the first header with one field replaced by a hostile value (sizes, shapes, dtypes, types)."""
    if len(b) < PREAMBLE.size:
        return
    n = struct.unpack("!I", b[4:8])[0]
    try:
        head = msgspec.msgpack.decode(bytes(b[8 : 8 + n]))
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return
    if not isinstance(head, list) or len(head) != 5:
        return
    which = r.randrange(9)
    frames = head[4] if isinstance(head[4], list) and head[4] else [["uint8", [1], 1]]
    f = list(frames[0]) if isinstance(frames[0], list) and len(frames[0]) == 3 else ["uint8", [1], 1]
    if which == 0:
        f[2] = r.choice(HUGE)  # announced byte count
    elif which == 1:
        f[1] = [r.choice(HUGE)] * r.randint(1, 3)  # shape
        f[2] = r.choice([0, *HUGE])
    elif which == 2:
        f[1] = [0, r.choice(HUGE), r.choice(HUGE)]  # empty, but strides overflow
        f[2] = 0
    elif which == 3:
        f[1] = [1] * r.choice([33, 1000])  # too many dimensions
    elif which == 4:
        f[0] = r.choice(["object", "", "float8_e4m3fnuz", "uint8" * 50, 7])
    elif which == 5:
        f[1] = [-1, -4]  # negative dimensions whose product is right
        f[2] = 4
    elif which == 6:
        frames = [["uint8", [LIMITS.max_message_bytes // 4], LIMITS.max_message_bytes // 4]] * r.choice([5, 65, 5000])
    elif which == 7:
        head[r.randrange(5)] = r.choice([None, True, -1, 2**64 - 1, 1.5, "x", b"\x80", [], {}])
    else:
        head[1] = {"k": msgspec.msgpack.Ext(r.randrange(128), os.urandom(8))}  # ext types stay inert
    if which < 6:
        frames = [f, *frames[1:]]
    if which != 7:
        head[4] = frames
    try:
        body = msgspec.msgpack.encode(head)
    except (TypeError, OverflowError):
        return
    b[: 8 + n] = MAGIC + struct.pack("!I", len(body)) + body


MUTATIONS: list[Callable[[random.Random, bytearray, list[bytes]], None]] = [
    _flip_bits,
    _set_bytes,
    _set_int,
    _set_header_length,
    _insert,
    _delete,
    _truncate,
    _duplicate,
    _splice,
    _field,
]


def mutated(seed: int, count: int, corpus: list[bytes]) -> Iterator[bytes]:
    r = random.Random(seed)
    for _ in range(count):
        b = bytearray(r.choice(corpus))
        for _m in range(r.choice([1, 1, 1, 2, 3])):
            if not b:
                break
            r.choice(MUTATIONS)(r, b, corpus)
        yield bytes(b)


# -- the receivers ------------------------------------------------------------------------------------------
def receive_all(data: bytes, fd: int, *, piece: int = 1 << 20, limits: Limits = LIMITS) -> tuple[int, str]:
    """Read messages off `data` with the real TCP receiver until it raises; (messages, how it ended)."""
    cfg = CFG if limits is LIMITS else TcpConfig(limits=limits, read_ahead_bytes=1024, stall_timeout_s=5)
    conn = TcpConnection(FeedSocket(data, fd, piece), "fuzz-peer", cfg)  # type: ignore[arg-type]
    alloc = Allocations(limits)
    try:
        while True:
            msg = conn.recv(into=alloc)
            assert all(t.is_contiguous() and t.dtype in dtypes().values() for t in msg.tensors)
    except ProtocolError as e:
        assert "fuzz-peer" in str(e)
        return alloc.messages, "protocol"
    except PeerUnreachable:
        return alloc.messages, "closed"
    finally:
        conn.close()


@pytest.fixture(scope="module")
def fd() -> Iterator[int]:
    r, w = os.pipe()  # any real descriptor: the connection registers it with poll() but never waits on it here
    yield r
    os.close(r)
    os.close(w)


def test_seeds_decode_cleanly(fd: int) -> None:
    for s in seeds():
        n, end = receive_all(s, fd, piece=3)  # three bytes per read: every boundary inside a message
        assert end == "closed" and n >= 1


def test_mutated_frames_only_documented_errors(fd: int, fuzz_count: Callable[[str, int], None]) -> None:
    corpus = seeds()
    ends = {"protocol": 0, "closed": 0}
    messages = 0
    for i, data in enumerate(mutated(1234, NUM_MUTATED, corpus)):
        try:
            n, end = receive_all(data, fd, piece=(7 if i % 10 == 0 else 1 << 20))
        except AssertionError as e:
            raise AssertionError(f"input {i} ({data[:200].hex()}...): {e}") from e
        except Exception as e:  # the test: anything undocumented fails it, with the input
            raise AssertionError(f"input {i}: undocumented {type(e).__name__}: {e}; input {data[:200].hex()}") from e
        ends[end] += 1
        messages += n
    fuzz_count("frames: tcp receiver, mutated streams", NUM_MUTATED)
    # the mutations reach every outcome: refused, cut short, and still-valid messages
    assert ends["protocol"] > NUM_MUTATED // 10 and ends["closed"] > NUM_MUTATED // 10 and messages > NUM_MUTATED // 10


def test_mutated_headers_through_inproc(fuzz_count: Callable[[str, int], None]) -> None:
    """The in-process receiver decodes the same header bytes with the same bounds."""
    msgs = [
        Message("a", {"x": [1, 2]}, [torch.arange(6, dtype=torch.int32).reshape(2, 3)]),
        Message("b", {}, [torch.zeros(0), torch.ones(4, dtype=torch.bfloat16)]),
    ]
    heads = []
    for m in msgs:
        ts = wire_tensors(m.tensors)
        heads.append((encode_header(m, ts), ts))
    corpus = [h for h, _ in heads]
    n, outcomes = 20_000, {"ok": 0, "protocol": 0}
    import queue

    inbox: queue.Queue[_Packet] = queue.Queue()
    conn = InprocConnection("fuzz-inproc", inbox=inbox, outbox=queue.Queue())
    conn.limits = LIMITS
    r = random.Random(99)
    for data in mutated(5678, n, corpus):
        inbox.put(_Packet(data[PREAMBLE.size :], r.choice(heads)[1]))
        try:
            got = conn.recv(timeout_s=1)
            assert all(t.dtype in dtypes().values() for t in got.tensors)
            outcomes["ok"] += 1
        except ProtocolError:
            outcomes["protocol"] += 1
    fuzz_count("frames: inproc receiver, mutated headers", n)
    assert outcomes["ok"] and outcomes["protocol"]


# -- hypothesis: structured headers of any msgpack shape -----------------------------------------------------
msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=8,
)
frame_entries = st.lists(
    st.tuples(
        st.sampled_from([*dtypes(), "object", ""]) | st.text(max_size=12),
        st.lists(st.integers(min_value=-2, max_value=2**64 - 1) | st.sampled_from([0, 1, 2, 3]), max_size=5),
        st.integers(min_value=-1, max_value=2**64 - 1) | st.sampled_from([0, 1, 4, 8, 24]),
    ).map(list)
    | msgpack_values,
    max_size=4,
)
headers = st.tuples(
    st.text(max_size=10) | msgpack_values,
    st.dictionaries(st.text(max_size=8), msgpack_values, max_size=4) | msgpack_values,
    st.integers(min_value=0, max_value=2**64 - 1) | msgpack_values,
    st.integers(min_value=0, max_value=2**64 - 1) | msgpack_values,
    frame_entries | msgpack_values,
).map(list)


@settings(settings.get_profile("rlctl-fuzz"), max_examples=400)
@given(head=headers, tail=st.binary(max_size=64), piece=st.sampled_from([1, 5, 1 << 20]))
def test_generated_headers_only_documented_errors(
    fd: int, fuzz_count: Callable[[str, int], None], head: list[Any], tail: bytes, piece: int
) -> None:
    body = msgspec.msgpack.encode(head)
    receive_all(MAGIC + struct.pack("!I", len(body)) + body + tail, fd, piece=piece)
    fuzz_count("frames: tcp receiver, hypothesis headers", 1)


@settings(settings.get_profile("rlctl-fuzz"), max_examples=1000)
@given(data=st.binary(max_size=200))
def test_raw_bytes_only_documented_errors(fd: int, fuzz_count: Callable[[str, int], None], data: bytes) -> None:
    receive_all(MAGIC + data, fd)
    receive_all(data, fd)
    fuzz_count("frames: tcp receiver, hypothesis raw bytes", 2)


# -- the same over a real socket -------------------------------------------------------------------------------
def send_then_close(sock: socket.socket, data: bytes) -> None:
    """The peer's side: the receiver may close first (it refused the frame), which ends the send."""
    try:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
    except (BrokenPipeError, ConnectionResetError):
        pass


def test_mutated_frames_over_a_real_socketpair(fuzz_count: Callable[[str, int], None]) -> None:
    corpus, n = seeds(), 1500
    for data in mutated(4321, n, corpus):
        a, b = socket.socketpair()
        b.settimeout(5)
        writer = threading.Thread(target=send_then_close, args=(a, data))
        writer.start()
        conn = TcpConnection(b, "fuzz-socket", CFG)
        try:
            while True:
                conn.recv(timeout_s=5, into=Allocations(LIMITS))
        except (ProtocolError, PeerUnreachable):
            pass
        finally:
            conn.close()
            writer.join()
            a.close()
    fuzz_count("frames: tcp receiver over a socketpair, mutated streams", n)
