"""Flat weight buffers, their layout, and how they are cut into buckets and checksummed chunks.

    state dict ──flatten──▶ one uint8 buffer (each tensor 64-byte aligned, layout = name/dtype/shape/offset)
    buffer     ──cut──────▶ buckets of `bucket_bytes`, each cut into chunks of `chunk_bytes`
    chunk      = (version, bucket, index, offset, length, xxh3_64 of its bytes)

`index` is global across buckets, so a bitmap over indices tells which chunks a holder has.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import xxhash

from rlctl.errors import ProtocolError
from rlctl.transport.framing import Limits, dtypes, tensor_bytes

ALIGN_BYTES = 64
MAX_DIMS = Limits.max_dims


@dataclass(frozen=True)
class Slot:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Layout:
    slots: tuple[Slot, ...]
    total_bytes: int

    def to_wire(self) -> list[list[Any]]:
        return [[s.name, s.dtype, list(s.shape), s.offset, s.nbytes] for s in self.slots]

    @classmethod
    def from_wire(cls, rows: Sequence[Sequence[Any]], total_bytes: int) -> Layout:
        """The layout a manifest announces; ProtocolError for an entry outside the buffer, whose shape does not
        fill its bytes, or at an offset that is not a multiple of its element size (unflatten would fail on it
        later: torch views a tensor's bytes only there)."""
        slots = []
        for name, dtype, shape, offset, nbytes in rows:
            numel = 1
            for d in shape[: MAX_DIMS + 1]:  # no huge products: a longer shape is refused below anyway
                numel *= d
            if (
                dtype not in dtypes()
                or offset % dtypes()[dtype].itemsize
                or offset < 0
                or nbytes < 0
                or offset + nbytes > total_bytes
                or len(shape) > MAX_DIMS
                or any(d < 0 for d in shape)
                or numel * dtypes()[dtype].itemsize != nbytes
            ):
                entry = f"{str(name)[:80]!r}: {dtype!s:.20}{list(shape)[:MAX_DIMS]} at {offset}+{nbytes}"
                raise ProtocolError(f"bad layout entry {entry}")
            slots.append(Slot(str(name), str(dtype), tuple(shape), int(offset), int(nbytes)))
        return cls(tuple(slots), total_bytes)


def layout_of(state_dict: dict[str, torch.Tensor]) -> Layout:
    slots, off = [], 0
    for name, t in state_dict.items():
        nbytes = t.numel() * t.element_size()
        slots.append(Slot(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), off, nbytes))
        off += -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES
    return Layout(tuple(slots), off)


def flatten(state_dict: dict[str, torch.Tensor], layout: Layout, out: torch.Tensor | None = None) -> torch.Tensor:
    """Copy the tensors into one flat uint8 host buffer (padding zeroed, so checksums are stable); a device
    tensor is copied straight into its slice (no host copy of it on the way)."""
    flat = torch.zeros(layout.total_bytes, dtype=torch.uint8) if out is None else out
    for slot in layout.slots:
        t = state_dict[slot.name].detach().contiguous()
        if slot.nbytes:
            flat[slot.offset : slot.offset + slot.nbytes].copy_(t.reshape(-1).view(torch.uint8))
    return flat


def unflatten(flat: torch.Tensor, layout: Layout) -> dict[str, torch.Tensor]:
    """Views of the tensors inside `flat` (no copy)."""
    out = {}
    for s in layout.slots:
        dtype = dtypes()[s.dtype]
        if s.nbytes == 0:
            out[s.name] = torch.empty(s.shape, dtype=dtype)
            continue
        out[s.name] = flat[s.offset : s.offset + s.nbytes].view(dtype).view(s.shape)
    return out


@dataclass(frozen=True)
class ChunkRef:
    bucket: int
    index: int
    offset: int
    length: int


def cut(total_bytes: int, *, bucket_bytes: int, chunk_bytes: int) -> list[ChunkRef]:
    """Buckets of `bucket_bytes` (the last may be short), each cut into chunks of `chunk_bytes`."""
    if chunk_bytes <= 0 or bucket_bytes < chunk_bytes:
        raise ValueError(f"need 0 < chunk_bytes ≤ bucket_bytes, got {chunk_bytes} and {bucket_bytes}")
    refs: list[ChunkRef] = []
    for bucket, start in enumerate(range(0, total_bytes, bucket_bytes)):
        end = min(start + bucket_bytes, total_bytes)
        for off in range(start, end, chunk_bytes):
            refs.append(ChunkRef(bucket, len(refs), off, min(chunk_bytes, end - off)))
    return refs


def checksum(data: torch.Tensor) -> int:
    """xxh3-64 of a contiguous tensor's bytes."""
    return xxhash.xxh3_64_intdigest(tensor_bytes(data))


def chunk_checksums(flat: torch.Tensor, refs: list[ChunkRef]) -> list[int]:
    return [checksum(flat[r.offset : r.offset + r.length]) for r in refs]


def sums_digest(sums: list[int]) -> int:
    """xxh3-64 of a payload's chunk checksums: equal for two holders' payloads that match chunk for chunk."""
    return xxhash.xxh3_64_intdigest(struct.pack(f"<{len(sums)}Q", *sums))
