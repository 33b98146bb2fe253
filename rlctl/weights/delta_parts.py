"""The delta of one version assembled from the parts the trainer's ranks encoded (`rlctl.weights.encoder`).

    rank r: its segments of the delta (its part of the version's buffer), as one frame (`delta.to_frame`)
    every rank: assemble(every frame) ─▶ one payload: header | every part's segments, in element order

Segments locate themselves (`delta.Segment.first`), so the assembled payload decodes with `delta.decode` like any
other, whatever the number of parts: receivers need nothing new.
"""

from __future__ import annotations

import torch

from rlctl.weights.delta import assemble as assemble_segments
from rlctl.weights.delta import from_frame


def part_range(num_elements: int, *, part: int, parts: int) -> tuple[int, int]:
    """The [lo, hi) of the elements that `part` of `parts` encodes."""
    if not 0 <= part < parts:
        raise ValueError(f"part {part} is not in 0..{parts - 1}")
    return part * num_elements // parts, (part + 1) * num_elements // parts


def assemble(
    frames: list[bytes], *, raw_len: int, base_version: int, element_bytes: int = 2, target_xxh3: int = 0
) -> torch.Tensor:
    """The delta payload (`delta.decode`'s input) from every part's frame, turning version `base_version` of a
    `raw_len`-byte buffer into the one whose xxh3 is `target_xxh3` (0: set by the root that applies it,
    `delta.set_target`)."""
    segments = sorted((s for f in frames for s in from_frame(f)), key=lambda s: s.first)
    return assemble_segments(
        segments, base_version=base_version, raw_len=raw_len, target_xxh3=target_xxh3, element_bytes=element_bytes
    )
