"""Delta codec: bit-exact reconstruction, small deltas for sparse changes, loud failures."""

from __future__ import annotations

import pytest
import torch
import zstandard

from rlctl.errors import ProtocolError
from rlctl.weights import delta


def _versions(n: int, frac: float, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    old = (torch.randn(n, generator=g) * 0.02).to(dtype)
    new = old.clone()
    idx = torch.randperm(n, generator=g)[: int(n * frac)]
    new[idx] = (new[idx].float() * 1.01 + 1e-4).to(dtype)
    return old.view(torch.uint8), new.view(torch.uint8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_round_trip_is_bit_exact(dtype):
    old, new = _versions(50_000, 0.05, dtype)
    enc = delta.encode(old, new, base_version=4, element_bytes=dtype.itemsize)
    assert delta.base_version_of(enc) == 4
    assert torch.equal(delta.decode(old, enc), new)


def test_odd_sizes_are_compared_byte_by_byte():
    old = torch.randint(0, 256, (1001,), dtype=torch.uint8)
    new = old.clone()
    new[::97] ^= 0x5A
    assert torch.equal(delta.decode(old, delta.encode(old, new, base_version=0)), new)


def test_sparse_changes_give_small_deltas():
    old, new = _versions(1 << 20, 0.01)
    enc = delta.encode(old, new, base_version=1)
    assert enc.numel() < 0.05 * new.numel()
    same = delta.encode(old, old, base_version=1)
    assert same.numel() < 0.001 * old.numel()


def test_wrong_base_fails_the_checksum():
    old, new = _versions(10_000, 0.05)
    enc = delta.encode(old, new, base_version=1)
    other = old.clone()
    other[5] ^= 1
    with pytest.raises(ProtocolError, match="checksum"):
        delta.decode(other, enc)


def test_corrupted_or_truncated_payloads_are_refused():
    old, new = _versions(10_000, 0.05)
    enc = delta.encode(old, new, base_version=1)
    bad = enc.clone()
    bad[-3] ^= 0xFF
    with pytest.raises(ProtocolError):
        delta.decode(old, bad)
    with pytest.raises(ProtocolError, match="shorter than its header"):
        delta.decode(old, enc[:5])
    with pytest.raises(ProtocolError, match="-byte buffer"):
        delta.decode(old[:-64], enc)


def test_an_element_width_that_does_not_divide_the_buffer_is_a_protocol_error():
    """A header's element width 2 changed to 4 (one byte) for a 6-byte buffer: refused as the rest of a bad
    payload is (the node then fetches the version in full), not numpy's ValueError out of `decode`."""
    old, new = torch.zeros(6, dtype=torch.uint8), torch.ones(6, dtype=torch.uint8)
    bad = delta.encode(old, new, base_version=3)
    bad[delta.HEADER.size - 5] ^= 6  # element_bytes (u32, big-endian): 2 → 4
    with pytest.raises(ProtocolError, match="element width 4 for a buffer of 6 bytes"):
        delta.decode(old, bad)


def test_only_changed_elements_travel_in_located_segments():
    """Positions as gaps (int32) and XOR values per segment: each piece is one segment, found where it says."""
    old, new = _versions(100_000, 0.01)
    segs = delta.encode_segments(old, new, piece_elements=30_000)
    assert [s.first for s in segs] == [0, 30_000, 60_000, 90_000] and {s.gap_bytes for s in segs} == {4}
    changed = int((old.view(torch.int16) != new.view(torch.int16)).sum())
    assert sum(s.count for s in segs) == changed
    frame = delta.to_frame(segs[::-1])  # segments locate themselves: order does not matter
    target = __import__("xxhash").xxh3_64_intdigest(new.numpy().data)
    payload = delta.assemble(
        delta.from_frame(frame), base_version=2, raw_len=new.numel(), target_xxh3=target, element_bytes=2
    )
    assert torch.equal(delta.decode(old, payload), new)
    empty = delta.encode(old, old, base_version=0)
    assert torch.equal(delta.decode(old, empty), old) and empty.numel() < 200


def test_a_segment_outside_the_buffer_is_refused():
    old, new = _versions(10_000, 0.05)
    (seg,) = delta.encode_segments(old, new)
    moved = delta.Segment(seg.first + 9_990, seg.count, seg.gap_bytes, seg.gaps, seg.values)
    payload = delta.assemble([moved], base_version=1, raw_len=new.numel(), target_xxh3=0, element_bytes=2)
    with pytest.raises(ProtocolError, match=r"outside the buffer|does not fit"):
        delta.decode(old, payload)


def test_a_frame_header_that_names_another_size_is_a_protocol_error():
    """One changed byte of a segment's zstd frame header (its descriptor: the content size field 1 byte long made 8,
    the next bytes read as a size of exabytes): refused as the rest of a bad payload is, not the MemoryError of
    zstandard's decompress allocating what the header says (the node catches only ProtocolError)."""
    old, new = torch.zeros(6, dtype=torch.uint8), torch.ones(6, dtype=torch.uint8)
    bad = delta.encode(old, new, base_version=3)
    bad[delta.HEADER.size + delta.SEGMENT.size + 4] ^= 192  # the gaps' frame descriptor: its size field 8 bytes long
    with pytest.raises(ProtocolError, match="delta segment 0"):
        delta.decode(old, bad)


def test_positions_whose_int64_gaps_wrap_around_are_a_protocol_error():
    """A peer's int64 gaps that sum past 2⁶³ wrap around to positions in the buffer again (gaps 0, 2⁶³−1, 2⁶³−1, 3:
    positions 0, 2⁶³−1, −2, 1, the last inside the buffer): refused, versus numpy's IndexError out of `decode` (the
    node catches only ProtocolError) or a negative position XORed into the buffer from its end."""
    old = torch.zeros(64, dtype=torch.uint8)
    zstd = zstandard.ZstdCompressor()
    for gaps in ([0, 2**63 - 1, 2**63 - 1, 3], [5, 2**63 - 1, 2**63 - 1, 1]):
        g = torch.tensor(gaps, dtype=torch.int64)
        v = torch.arange(1, len(gaps) + 1, dtype=torch.int16)
        seg = delta.Segment(
            0, len(gaps), 8, zstd.compress(delta._planes(g).numpy().data), zstd.compress(delta._planes(v).numpy().data)
        )
        payload = delta.assemble([seg], base_version=0, raw_len=64, target_xxh3=0, element_bytes=2)
        with pytest.raises(ProtocolError, match="outside the buffer"):
            delta.decode(old, payload)
