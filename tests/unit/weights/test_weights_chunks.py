"""Flat layout, bucket/chunk cutting and checksums."""

from __future__ import annotations

import pytest
import torch

from rlctl.errors import ProtocolError
from rlctl.weights import chunks, manifest


def _state() -> dict[str, torch.Tensor]:
    return {
        "emb": torch.randn(13, 7).to(torch.bfloat16),
        "w": torch.randn(5, 3).t(),  # non-contiguous
        "step": torch.tensor(3, dtype=torch.int64),
        "empty": torch.empty(0, 4),
        "mask": torch.tensor([True, False, True]),
    }


def test_flatten_unflatten_round_trip_and_alignment():
    sd = _state()
    layout = chunks.layout_of(sd)
    flat = chunks.flatten(sd, layout)
    assert flat.numel() == layout.total_bytes and layout.total_bytes % chunks.ALIGN_BYTES == 0
    assert all(s.offset % chunks.ALIGN_BYTES == 0 for s in layout.slots)
    back = chunks.unflatten(flat, layout)
    assert list(back) == list(sd)
    for k, v in sd.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v)


def test_layout_survives_the_wire_and_bad_entries_are_refused():
    layout = chunks.layout_of(_state())
    assert chunks.Layout.from_wire(layout.to_wire(), layout.total_bytes) == layout
    rows = layout.to_wire()
    rows[0][3] = layout.total_bytes  # offset past the end
    with pytest.raises(ProtocolError, match="bad layout entry"):
        chunks.Layout.from_wire(rows, layout.total_bytes)


def test_a_layout_entry_at_an_offset_its_elements_cannot_start_at_is_refused():
    """A bf16 scalar at byte 1: taken, `unflatten` raised torch's RuntimeError once the version was complete
    (a unit applying it); refused, the fetch fails as for any bad manifest."""
    with pytest.raises(ProtocolError, match="bad layout entry 'a': bfloat16"):
        chunks.Layout.from_wire([["a", "bfloat16", [], 1, 2]], 3)
    ok = chunks.Layout.from_wire([["a", "bfloat16", [], 2, 2], ["b", "uint8", [3], 5, 3]], 8)
    assert [t.shape for t in chunks.unflatten(torch.zeros(8, dtype=torch.uint8), ok).values()] == [(), (3,)]


@pytest.mark.parametrize("total", [0, 1, 999, 4096, 10_000])
def test_cut_covers_every_byte_once_within_buckets(total):
    refs = chunks.cut(total, bucket_bytes=3000, chunk_bytes=1024)
    covered = [0] * total
    for i, r in enumerate(refs):
        assert r.index == i and 0 < r.length <= 1024
        assert r.offset // 3000 == r.bucket == (r.offset + r.length - 1) // 3000  # never straddles buckets
        for b in range(r.offset, r.offset + r.length):
            covered[b] += 1
    assert covered == [1] * total


def test_cut_rejects_bad_sizes():
    with pytest.raises(ValueError, match="chunk_bytes"):
        chunks.cut(10, bucket_bytes=4, chunk_bytes=8)


def test_checksum_detects_a_single_flipped_bit():
    flat = torch.randint(0, 256, (1 << 16,), dtype=torch.uint8)
    refs = chunks.cut(flat.numel(), bucket_bytes=1 << 15, chunk_bytes=1 << 12)
    sums = chunks.chunk_checksums(flat, refs)
    flat[12345] ^= 4
    changed = [i for i, s in enumerate(chunks.chunk_checksums(flat, refs)) if s != sums[i]]
    assert changed == [12345 // (1 << 12)]


def test_the_least_chunk_fits_the_manifest_in_the_buckets_given_and_is_no_longer_than_one():
    """A 3 MiB bucket: the manifest counted in those buckets (2 MiB chunks leave a 1 MiB one in each: 9 MiB of
    checksums for 1.5 TiB), not in the default 64 MiB ones (6.75 MiB); a chunk capped at the bucket, not the next
    power of two past it (4 MiB, which `chunks.cut` refuses)."""
    bucket = 3 << 20
    for weights in (3 << 39, 123456789012345):
        chunk = manifest.least_chunk_bytes(weights, bucket_bytes=bucket)
        fits = manifest.manifest_bytes(weights, chunk_bytes=chunk, bucket_bytes=bucket) <= manifest.MANIFEST_BOUND
        assert chunk <= bucket and (fits or chunk == bucket), (weights, chunk)
    assert manifest.least_chunk_bytes(3 << 39, bucket_bytes=bucket) == bucket
    assert manifest.least_chunk_bytes(1 << 40) == 2 << 20  # the default buckets: as before
