"""Wire format of one message (shared by tcp and ucx).

    message  = preamble | header | frame_0 | frame_1 | ...
    preamble = "RLM1" (4 bytes) | header_len (u32, big-endian)
    header   = msgpack WireHeader{kind, header, msg_id, reply_to, frames: [[dtype, shape, nbytes], ...]}
    frame_i  = nbytes raw bytes of tensor i (C-contiguous, native little-endian), nothing else

With a connection's keys (every connection rlctl opens: `auth.py`) a message carries two 16-byte tags:

    message  = preamble | header | header_tag | frame_0 | frame_1 | ... | frames_tag
    header_tag = over preamble and header, checked before `decode_header` (nothing is allocated for a forged one)
    frames_tag = over header_tag and every frame byte; absent when the message has no frame bytes

The receiver learns every frame's dtype/shape/size from the header, checks the bounds, allocates
(or is handed) the destination tensors and reads the bytes into them: no pickle, no staging copy.
What a receiver allocates is bounded by `Limits` before anything is allocated: the header buffer
by `max_header_bytes` (the preamble's length is checked first), the tensors by `max_message_bytes`
(the sum of every frame, each frame's shape checked against its size and `max_dims`). Anything
malformed is a `ProtocolError` naming the peer; msgpack ext types decode as inert `msgspec.msgpack.Ext`.

The handshake before any message, and the tags, are `auth.py`'s. TCP then names the stream's role (see
tcp.py): "M" + (stripe streams k: u8, stripe threshold: u64) answered by a 16-byte connection token, or
"J" + token for a stripe stream joining that connection.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from rlctl.errors import ProtocolError
from rlctl.transport.base import Message, TensorSpec

if TYPE_CHECKING:
    import torch

MAGIC = b"RLM1"
END = b"RLE1"  # ucx: in place of a message's magic (header length 0, then its tag), the stream's end in order
PREAMBLE = struct.Struct("!4sI")
S = TypeVar("S", bound=msgspec.Struct)

# Every dtype that may travel (torch's names); anything else is refused at send time with this list in the message.
DTYPE_NAMES = (
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
)


@functools.cache
def dtypes() -> dict[str, torch.dtype]:
    """The dtypes that may travel, by name. torch loads with the first tensor frame: a message without tensors
    (`rlctl status`, `stop`) never imports it."""
    import torch

    return {name: getattr(torch, name) for name in DTYPE_NAMES}


@functools.cache
def _dtype_names() -> dict[torch.dtype, str]:
    return {d: n for n, d in dtypes().items()}


@dataclass(frozen=True)
class Limits:
    """Bounds a receiver enforces before allocating anything."""

    # a weight version's manifest (a checksum per chunk: 1.2 MiB for 72B at 1 MiB chunks) travels in one header
    max_header_bytes: int = 16 << 20
    max_frames: int = 1 << 16
    max_message_bytes: int = 16 << 30
    max_dims: int = 32  # dimensions of one tensor frame


class WireHeader(msgspec.Struct, array_like=True):
    kind: str
    header: dict[str, Any]
    msg_id: int
    reply_to: int
    frames: list[tuple[str, list[int], int]]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(WireHeader)


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """Raw bytes of a contiguous CPU tensor, without copying."""
    assert t.is_contiguous() and t.device.type == "cpu", "call wire_tensors() first"
    import torch

    if t.numel() == 0:
        return memoryview(b"")
    arr: Any = t.reshape(-1).view(torch.uint8).numpy()
    return memoryview(arr)


def wire_tensors(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Tensors as they go on the wire: CPU and contiguous (copies only what is not already)."""
    out = []
    for t in tensors:  # the names by dtype load with the first tensor: a message without any never imports torch
        if t.dtype not in _dtype_names():
            raise ValueError(f"dtype {t.dtype} cannot travel; supported: {', '.join(DTYPE_NAMES)}")
        out.append(t.detach().to("cpu").contiguous())
    return out


def encode_header(msg: Message, tensors: list[torch.Tensor]) -> bytes:
    """Preamble + msgpack header for `msg` whose (wire-ready) tensors are `tensors`."""
    frames = [(_dtype_names()[t.dtype], list(t.shape), t.numel() * t.element_size()) for t in tensors]
    try:
        body = _encoder.encode(WireHeader(msg.kind, msg.header, msg.msg_id, msg.reply_to, frames))
    except (TypeError, msgspec.EncodeError) as e:
        raise ValueError(f"message {msg.kind!r}: header is not msgpack-able: {e}") from e
    return PREAMBLE.pack(MAGIC, len(body)) + body


def parse_preamble(data: bytes, limits: Limits, peer: str) -> int:
    magic, n = PREAMBLE.unpack(data)
    if magic != MAGIC:
        raise ProtocolError(f"{peer}: bad frame magic {magic!r} (not an rlctl peer, or stream out of sync)")
    if n > limits.max_header_bytes:
        raise ProtocolError(f"{peer}: header of {n} bytes exceeds the bound of {limits.max_header_bytes}")
    return n


def decode_header(data: bytes, limits: Limits, peer: str) -> tuple[WireHeader, list[TensorSpec]]:
    """Parse and bound-check a header; returns it with one TensorSpec per frame."""
    try:
        wh = _decoder.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as e:  # nesting deeper than Python allows
        raise ProtocolError(f"{peer}: malformed message header: {e}") from e
    if len(wh.frames) > limits.max_frames:
        raise ProtocolError(f"{peer}: {len(wh.frames)} frames exceed the bound of {limits.max_frames}")
    specs, total = [], 0
    for name, shape, nbytes in wh.frames:
        dtype = dtypes().get(name)
        if dtype is None or len(shape) > limits.max_dims or any(d < 0 for d in shape):
            raise ProtocolError(f"{peer}: bad frame {name[:32]!r} {shape[: limits.max_dims]}")
        numel, span = 1, dtype.itemsize  # span: the bytes torch would stride over, empty dimensions as 1
        for d in shape:
            numel *= d
            span *= max(d, 1)
        if numel * dtype.itemsize != nbytes:
            raise ProtocolError(f"{peer}: frame {name}{shape} announces {nbytes} bytes")
        if span > limits.max_message_bytes:  # an empty (0, 2**40, 2**40) frame still overflows torch's strides
            raise ProtocolError(f"{peer}: frame {name}{shape} exceeds the bound of {limits.max_message_bytes} bytes")
        total += nbytes
        specs.append(TensorSpec(dtype, tuple(shape), nbytes))
    if total > limits.max_message_bytes:
        raise ProtocolError(f"{peer}: message of {total} bytes exceeds the bound of {limits.max_message_bytes}")
    return wh, specs


def to_struct(data: Any, typ: type[S], *, what: str) -> S:
    """`data` (a decoded header, or part of one) as the struct `typ`; ProtocolError naming `what` otherwise.

    The one place where a well-framed but ill-typed header becomes an error of the tree."""
    try:
        return msgspec.convert(data, typ)
    except (msgspec.ValidationError, RecursionError) as e:
        raise ProtocolError(f"{what}: {e}") from e
