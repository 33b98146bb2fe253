"""The delta codec's encoding split over P ranks that each hold both buffers (data-parallel trainer ranks).

    delta.encode:  header | one zstd frame of S           S = the byte planes of (new XOR prev), plane-major
    here:          header | frame(S[0:L/P]) | frame(S[L/P:2L/P]) | … | frame(S[(P-1)L/P:L])
                            └ rank 0 ┘        └ rank 1 ┘               └ rank P-1 ┘

`delta.decode` reads concatenated zstd frames as one stream, so the assembled payload decodes exactly as
`delta.encode`'s does (same header, same decompressed bytes, same xxh3 check of the result): receivers
need nothing new. Each rank compresses only its 1/P of S (`encode_part`); the frames are exchanged (an
all-gather) and every rank builds the same payload (`assemble`).
"""

from __future__ import annotations

import numpy as np
import torch
import xxhash
import zstandard

from rlctl.weights.delta import _PIECE_BYTES, HEADER, MAGIC, _np


def element_bytes_for(nbytes: int, element_bytes: int = 2) -> int:
    """The byte-plane width `delta.encode` uses for a buffer of `nbytes` (1 when `element_bytes` does not divide it)."""
    return element_bytes if nbytes % element_bytes == 0 else 1


def part_range(nbytes: int, *, part: int, parts: int) -> tuple[int, int]:
    """The [lo, hi) of the plane-major stream that `part` of `parts` compresses."""
    if not 0 <= part < parts:
        raise ValueError(f"part {part} is not in 0..{parts - 1}")
    return part * nbytes // parts, (part + 1) * nbytes // parts


def encode_part(
    prev: torch.Tensor, new: torch.Tensor, *, part: int, parts: int, element_bytes: int = 2, level: int = 1
) -> bytes:
    """One zstd frame of this part's range of the byte planes of (new XOR prev); b"" for an empty range."""
    if prev.numel() != new.numel():
        raise ValueError(f"delta needs equal sizes, got {prev.numel()} and {new.numel()} bytes")
    eb = element_bytes_for(new.numel(), element_bytes)
    lo, hi = part_range(new.numel(), part=part, parts=parts)
    if lo == hi:
        return b""
    n = new.numel() // eb
    a2, b2 = _np(prev).reshape(-1, eb), _np(new).reshape(-1, eb)
    piece = np.empty(min(hi - lo, _PIECE_BYTES), dtype=np.uint8)
    comp = zstandard.ZstdCompressor(level=level).compressobj(size=hi - lo)
    out = []
    pos = lo
    while pos < hi:
        plane, first = divmod(pos, n)
        m = min(piece.size, n - first, hi - pos)
        np.bitwise_xor(a2[first : first + m, plane], b2[first : first + m, plane], out=piece[:m])
        out.append(comp.compress(piece[:m].data))
        pos += m
    out.append(comp.flush())
    return b"".join(out)


def assemble(frames: list[bytes], *, new: torch.Tensor, base_version: int, element_bytes: int = 2) -> torch.Tensor:
    """The delta payload (uint8 tensor, `delta.decode`'s input) from every part's frame, in part order."""
    eb = element_bytes_for(new.numel(), element_bytes)
    head = HEADER.pack(MAGIC, base_version, new.numel(), xxhash.xxh3_64_intdigest(_np(new).data), eb)
    body = b"".join(frames)
    out = torch.empty(len(head) + len(body), dtype=torch.uint8)
    o = out.numpy()
    o[: len(head)] = np.frombuffer(head, dtype=np.uint8)
    o[len(head) :] = np.frombuffer(body, dtype=np.uint8)
    return out
