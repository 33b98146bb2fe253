"""The delta encoding split over P ranks that each hold both buffers (data-parallel trainer ranks).

    rank r: encode_part(prev, new, r of P) ─▶ the segments of its element range, as one frame (bytes)
    every rank: assemble(every frame) ─▶ one payload: header | every part's segments, in element order

Segments locate themselves (`delta.Segment.first`), so the assembled payload decodes with `delta.decode` to the
same buffer as `delta.encode`'s, whatever the number of parts: receivers need nothing new.
"""

from __future__ import annotations

import torch
import xxhash

from rlctl.transport.framing import tensor_bytes
from rlctl.weights.delta import assemble as assemble_segments
from rlctl.weights.delta import element_bytes_for, encode_segments, from_frame, to_frame


def part_range(num_elements: int, *, part: int, parts: int) -> tuple[int, int]:
    """The [lo, hi) of the elements that `part` of `parts` encodes."""
    if not 0 <= part < parts:
        raise ValueError(f"part {part} is not in 0..{parts - 1}")
    return part * num_elements // parts, (part + 1) * num_elements // parts


def encode_part(
    prev: torch.Tensor, new: torch.Tensor, *, part: int, parts: int, element_bytes: int = 2, level: int = 1
) -> bytes:
    """The frame of this part's element range of the delta from `prev` to `new` (b"" for an empty range)."""
    eb = element_bytes_for(new.numel(), element_bytes)
    lo, hi = part_range(new.numel() // eb, part=part, parts=parts)
    return to_frame(encode_segments(prev, new, element_bytes=eb, level=level, first=lo, last=hi))


def assemble(frames: list[bytes], *, new: torch.Tensor, base_version: int, element_bytes: int = 2) -> torch.Tensor:
    """The delta payload (`delta.decode`'s input) from every part's frame."""
    eb = element_bytes_for(new.numel(), element_bytes)
    segments = sorted((s for f in frames for s in from_frame(f)), key=lambda s: s.first)
    target = xxhash.xxh3_64_intdigest(tensor_bytes(new))
    return assemble_segments(
        segments, base_version=base_version, raw_len=new.numel(), target_xxh3=target, element_bytes=eb
    )
