"""Lossless delta codec between two flat weight buffers of the same layout.

    encoded = header | zstd( byte-planes of (new XOR prev) )
    header  = "RLD1" | base_version (i64) | raw_len (u64) | target_xxh3 (u64) | element_bytes (u32)

After an RL step with a small learning rate most bf16 weights are bit-identical, so the XOR is
mostly zero; splitting it into byte planes (all first bytes of each element, then all second
bytes, ...) puts the rarely-touched exponent/sign bytes next to each other, which zstd squeezes
far better than the interleaved bytes. Decoding XORs back onto the base and checks the xxh3 of
the result against the header: a mismatch (wrong base, corrupted payload) raises ProtocolError,
and the caller falls back to a full transfer. Both directions stream through 4 MiB pieces (one
zstd frame), so no full-size intermediate buffer is ever allocated.
"""

from __future__ import annotations

import struct

import numpy as np
import torch
import xxhash
import zstandard

from rlctl.errors import ProtocolError
from rlctl.transport.framing import tensor_bytes

MAGIC = b"RLD1"
HEADER = struct.Struct("!4sqQQI")
_PIECE_BYTES = 4 << 20


def _np(flat: torch.Tensor) -> np.ndarray:
    assert flat.dtype == torch.uint8 and flat.dim() == 1 and flat.is_contiguous()
    return flat.numpy()


def encode(
    prev: torch.Tensor, new: torch.Tensor, *, base_version: int, element_bytes: int = 2, level: int = 1
) -> torch.Tensor:
    """Encoded delta (uint8 tensor) that turns `prev` (version base_version) into `new`."""
    if prev.numel() != new.numel():
        raise ValueError(f"delta needs equal sizes, got {prev.numel()} and {new.numel()} bytes")
    if new.numel() % element_bytes:
        element_bytes = 1
    a, b = _np(prev), _np(new)
    # XOR plane by plane in small pieces fed to one zstd frame: no full-size intermediates
    n = a.size // element_bytes
    a2, b2 = a.reshape(-1, element_bytes), b.reshape(-1, element_bytes)
    piece = np.empty(min(n, _PIECE_BYTES) or 1, dtype=np.uint8)
    comp = zstandard.ZstdCompressor(level=level).compressobj(size=a.size)
    parts = []
    for plane in range(element_bytes):
        for first in range(0, n, piece.size):
            m = min(piece.size, n - first)
            np.bitwise_xor(a2[first : first + m, plane], b2[first : first + m, plane], out=piece[:m])
            parts.append(comp.compress(piece[:m].data))
    parts.append(comp.flush())
    body = b"".join(parts)
    head = HEADER.pack(MAGIC, base_version, a.size, xxhash.xxh3_64_intdigest(b.data), element_bytes)
    out = torch.empty(len(head) + len(body), dtype=torch.uint8)
    o = out.numpy()
    o[: len(head)] = np.frombuffer(head, dtype=np.uint8)
    o[len(head) :] = np.frombuffer(body, dtype=np.uint8)
    return out


def base_version_of(encoded: torch.Tensor) -> int:
    return _header(encoded)[1]


def _header(encoded: torch.Tensor) -> tuple[bytes, int, int, int, int]:
    if encoded.numel() < HEADER.size:
        raise ProtocolError(f"delta payload of {encoded.numel()} bytes is shorter than its header")
    fields = HEADER.unpack(bytes(tensor_bytes(encoded[: HEADER.size])))
    if fields[0] != MAGIC:
        raise ProtocolError(f"delta payload has bad magic {fields[0]!r}")
    return fields


def decode(prev: torch.Tensor, encoded: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Rebuild the new buffer from `prev` and the encoded delta; bit-exact or ProtocolError."""
    _, _, raw_len, target, element_bytes = _header(encoded)
    if raw_len != prev.numel():
        raise ProtocolError(f"delta is for a {raw_len}-byte buffer, base has {prev.numel()} bytes")
    result = torch.empty(raw_len, dtype=torch.uint8) if out is None else out
    r = _np(result)
    # stream the planes through a small buffer, XOR-ing each piece straight into its strided
    # place: no full-size intermediate, so decoding touches the big buffers once
    n = raw_len // element_bytes
    base, dst = _np(prev).reshape(-1, element_bytes), r.reshape(-1, element_bytes)
    piece = np.empty(min(raw_len, _PIECE_BYTES) or 1, dtype=np.uint8)
    pos = 0
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(tensor_bytes(encoded[HEADER.size :]))
        while pos < raw_len:
            got = reader.readinto(piece)
            if got == 0:
                raise ProtocolError(f"delta decompressed to {pos} bytes, expected {raw_len}")
            off = 0
            while off < got:
                plane, first = divmod(pos, n)
                take = min(got - off, n - first)
                np.bitwise_xor(
                    base[first : first + take, plane], piece[off : off + take], out=dst[first : first + take, plane]
                )
                off, pos = off + take, pos + take
        if reader.read(1):
            raise ProtocolError(f"delta decompresses to more than {raw_len} bytes")
    except zstandard.ZstdError as e:
        raise ProtocolError(f"delta payload does not decompress: {e}") from e
    if xxhash.xxh3_64_intdigest(r.data) != target:
        raise ProtocolError("delta reconstruction failed its checksum (wrong base version or corrupted payload)")
    return result
