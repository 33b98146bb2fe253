"""A trainer rank's part of every published version, kept where it trains, and each new version's delta there.

    version v+1 ─ snapshot(params) ──▶ this rank's part of the flat buffer, in the wire dtype, on the device
                                        (a copy made at once: the next optimizer step may run meanwhile)
                ─ encode(snapshot) ───▶ delta.encode_ranges(previous part, snapshot) on the device: the changed
                                        elements' positions and values, the only bytes that reach the host
                                        (one frame; the ranks' frames make the version's delta, delta_parts)

A rank's part is a set of byte ranges of the version's flat buffer (`rlctl.weights.chunks.Layout`):

    whole replicas (torch data parallel, megatron's gathered weights): range `part` of `parts` of the buffer,
        filled from the full tensors this rank holds
    FSDP2 shards: for every tensor, the rows this rank holds (rows are contiguous bytes of the tensor's slot),
        filled from its local shards — no tensor is gathered

The codec compares 2-byte elements, so each piece is widened to whole elements (`_span`): a 1-byte tensor with
an odd byte count gains a byte of its slot's padding, an FSDP2 shard starting mid-element the byte before it
(its neighbour's). Those bytes are zero in every snapshot, so their XOR is zero and the codec stays lossless: the
neighbour's byte is encoded by its own rank, and the decoder XORs both ranks' values into the shared element.

The device's memory holds two of this rank's parts (the previous version's and the snapshot); the host none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from rlctl.devices import as_dtensor
from rlctl.transport.framing import dtypes
from rlctl.weights import delta
from rlctl.weights.chunks import Layout
from rlctl.weights.delta_parts import part_range

ELEMENT_BYTES = 2  # the codec's element width (every wire dtype is a multiple of it)


@dataclass(frozen=True)
class Piece:
    """Bytes [start, start + nbytes) of the version's buffer, the bytes [at, at + nbytes) of slot `name`'s tensor."""

    name: str
    start: int
    at: int
    nbytes: int


class DeviceEncoder:
    """This rank's part of each version on its device (see the module docstring)."""

    def __init__(self, layout: Layout, pieces: list[Piece], *, device: torch.device, local: bool = False) -> None:
        self.layout, self.pieces, self.device, self.local = layout, pieces, device, local
        self._dtype = {s.name: dtypes()[s.dtype] for s in layout.slots}
        self._spans = [_span(p) for p in pieces]  # whole elements (see the module docstring)
        assert all(hi <= layout.total_bytes for _, hi in self._spans), pieces[:3]
        self.nbytes = sum(hi - lo for lo, hi in self._spans)
        self.ranges = _element_ranges(
            [Piece(p.name, lo, 0, hi - lo) for p, (lo, hi) in zip(pieces, self._spans, strict=True)]
        )
        self.prev: torch.Tensor | None = None  # the last published version's part (None before the first)

    @classmethod
    def for_part(cls, layout: Layout, *, part: int, parts: int, device: torch.device) -> DeviceEncoder:
        """Range `part` of `parts` of the buffer (whole tensors on this rank)."""
        lo, hi = (ELEMENT_BYTES * x for x in part_range(layout.total_bytes // ELEMENT_BYTES, part=part, parts=parts))
        pieces = []
        for s in layout.slots:
            a, b = max(lo, s.offset), min(hi, s.offset + s.nbytes)
            if a < b:
                pieces.append(Piece(s.name, a, a - s.offset, b - a))
        return cls(layout, pieces, device=device)

    @classmethod
    def for_shards(cls, layout: Layout, params: Mapping[str, torch.Tensor], *, device: torch.device) -> DeviceEncoder:
        """The rows of every tensor this rank's FSDP2 shards hold (dim-0 shards, `torch.chunk`'s split)."""
        pieces = []
        for s in layout.slots:
            t = as_dtensor(params[s.name])
            if t is None:
                raise TypeError(f"{s.name} is not sharded: use DeviceEncoder.for_part")
            rows, local = t.shape[0], t.to_local().shape[0]
            row_bytes = s.nbytes // rows if rows else 0
            rank, world = t.device_mesh.get_local_rank(), t.device_mesh.size()
            first = rank * -(-rows // world) if local else 0
            if local:
                pieces.append(Piece(s.name, s.offset + first * row_bytes, 0, local * row_bytes))
        return cls(layout, pieces, device=device, local=True)

    def snapshot(self, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """This rank's part of the version `params` make, in the wire dtype, on the device (a new buffer)."""
        out = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        at = 0
        for p, (lo, hi) in zip(self.pieces, self._spans, strict=True):
            t = params[p.name]
            if self.local and (shard := as_dtensor(t)) is not None:
                t = shard.to_local()
            raw = t.detach().to(self.device, self._dtype[p.name]).reshape(-1).view(torch.uint8)
            first, end = at + p.start - lo, at + hi - lo
            if first > at or first + p.nbytes < end:  # a neighbour's byte, padding: zero in every version
                out[at:end].zero_()
            out[first : first + p.nbytes].copy_(raw[p.at : p.at + p.nbytes])
            at = end
        return out

    def encode(self, snapshot: torch.Tensor, *, level: int = 1) -> bytes:
        """The frame of this rank's segments of the delta from the previous snapshot to `snapshot`, which becomes
        the previous one."""
        assert self.prev is not None, "reset() with the first version before encoding deltas"
        segments = delta.encode_ranges(self.prev, snapshot, self.ranges, element_bytes=ELEMENT_BYTES, level=level)
        self.prev = snapshot
        return delta.to_frame(segments)

    def reset(self, snapshot: torch.Tensor) -> None:
        """A full version was published: deltas from now on are against it."""
        self.prev = snapshot


def _span(p: Piece) -> tuple[int, int]:
    """The bytes [lo, hi) of the version's buffer piece `p` is encoded as: rounded out to whole codec elements."""
    end = p.start + p.nbytes
    return p.start - p.start % ELEMENT_BYTES, end + -end % ELEMENT_BYTES


def _element_ranges(pieces: list[Piece]) -> list[tuple[int, int, int]]:
    """The pieces as `delta.encode_ranges` element ranges of the part's buffer (first, last, offset into the
    version's elements), pieces that follow each other in both merged: a whole-replica part is one range."""
    out: list[tuple[int, int, int]] = []
    at = 0
    for p in pieces:
        first, last, offset = at // ELEMENT_BYTES, (at + p.nbytes) // ELEMENT_BYTES, (p.start - at) // ELEMENT_BYTES
        if out and out[-1][1] == first and out[-1][2] == offset:
            out[-1] = (out[-1][0], last, offset)
        else:
            out.append((first, last, offset))
        at += p.nbytes
    return out
