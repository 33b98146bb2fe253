"""The trainer side of a delta: each rank's part of a version snapshotted and encoded where it trains
(`rlctl.weights.encoder`), the ranks' frames assembled into the delta every root applies (`delta_parts`)."""

from __future__ import annotations

import itertools

import pytest
import torch

from rlctl.weights import chunks, delta
from rlctl.weights.delta_parts import assemble, part_range
from rlctl.weights.encoder import DeviceEncoder


def params(step: int) -> dict[str, torch.Tensor]:
    """fp32 master weights after `step` small updates (most bf16 values do not move)."""
    g = torch.Generator().manual_seed(0)
    out = {
        "a.weight": torch.randn(96, 64, generator=g),
        "b.bias": torch.randn(33, generator=g),
        "c": torch.randn(7, 5, generator=g),
    }
    for _ in range(step):
        out = {k: v + 0.002 * v * (torch.rand(v.shape, generator=g) < 0.1) for k, v in out.items()}
    return out


def wire(step: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: v.to(dtype) for k, v in params(step).items()}


@pytest.mark.parametrize("parts", [1, 2, 3, 7])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_parts_deltas_assemble_into_the_versions_delta(parts: int, dtype: torch.dtype) -> None:
    layout = chunks.layout_of(wire(0, dtype))
    encoders = [DeviceEncoder.for_part(layout, part=r, parts=parts, device=torch.device("cpu")) for r in range(parts)]
    for e in encoders:
        e.reset(e.snapshot(params(0)))  # the master weights, cast to the wire dtype by the encoder
    prev = chunks.flatten(wire(0, dtype), layout)
    for step in (1, 2):
        frames = [e.encode(e.snapshot(params(step))) for e in encoders]
        payload = assemble(frames[::-1], raw_len=layout.total_bytes, base_version=step - 1)  # any order
        new = chunks.flatten(wire(step, dtype), layout)
        assert torch.equal(delta.decode(prev, payload, verify=False), new)
        prev = new
    covered = sum(e.nbytes for e in encoders)
    assert covered == sum(s.nbytes for s in layout.slots)  # every byte of every tensor, once; no padding


def test_each_part_is_its_range_of_the_buffer() -> None:
    layout = chunks.layout_of(wire(0, torch.bfloat16))
    ranges = [part_range(layout.total_bytes // 2, part=r, parts=3) for r in range(3)]
    assert ranges[0][0] == 0 and ranges[-1][1] == layout.total_bytes // 2
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    for r, (lo, hi) in enumerate(ranges):
        e = DeviceEncoder.for_part(layout, part=r, parts=3, device=torch.device("cpu"))
        assert all(2 * lo <= p.start and p.start + p.nbytes <= 2 * hi for p in e.pieces)
    with pytest.raises(ValueError, match="part 3"):
        part_range(10, part=3, parts=3)


def test_a_delta_needs_its_base() -> None:
    e = DeviceEncoder.for_part(chunks.layout_of(wire(0, torch.bfloat16)), part=0, parts=1, device=torch.device("cpu"))
    with pytest.raises(AssertionError, match="reset"):
        e.encode(e.snapshot(params(1)))


def test_pieces_that_follow_each_other_are_encoded_as_one_range() -> None:
    """A whole-replica part is one range for the codec (one pass, not one per tensor); a padded slot or a
    shard's next tensor starts a new one."""
    from rlctl.weights.encoder import Piece, _element_ranges

    pieces = [Piece("a", 100, 40, 60), Piece("b", 160, 0, 20), Piece("c", 256, 0, 8), Piece("d", 264, 0, 4)]
    assert _element_ranges(pieces) == [(0, 40, 50), (40, 46, 88)]


@pytest.mark.parametrize("parts", [1, 2, 3, 5])
def test_one_byte_tensors_of_odd_length_round_trip(parts: int) -> None:
    """A bool mask and a uint8 tensor of odd byte counts: each piece is widened to whole codec elements."""

    def odd(step: int) -> dict[str, torch.Tensor]:
        out = wire(step, torch.bfloat16)
        out["mask"] = torch.tensor([True, False, step % 2 == 0])
        out["codes"] = torch.arange(7, dtype=torch.uint8) * (step + 1)
        return out

    layout = chunks.layout_of(odd(0))
    encoders = [DeviceEncoder.for_part(layout, part=r, parts=parts, device=torch.device("cpu")) for r in range(parts)]
    for e in encoders:
        e.reset(e.snapshot(odd(0)))
    frames = [e.encode(e.snapshot(odd(1))) for e in encoders]
    payload = assemble(frames, raw_len=layout.total_bytes, base_version=0)
    new = chunks.flatten(odd(1), layout)
    assert torch.equal(delta.decode(chunks.flatten(odd(0), layout), payload, verify=False), new)


def test_shards_that_split_an_element_each_encode_their_own_byte() -> None:
    """Two ranks' shards of a uint8 tensor meeting mid-element (rows of odd bytes, as `for_shards` cuts them):
    both encode the shared element, each with the other's byte zero, and the decoder XORs both in."""
    from rlctl.weights.encoder import Piece

    def sd(step: int) -> dict[str, torch.Tensor]:
        return {"codes": (torch.arange(15, dtype=torch.uint8) * (step + 3)).reshape(5, 3)}

    layout = chunks.layout_of(sd(0))
    cpu = torch.device("cpu")
    ranks = [DeviceEncoder(layout, [Piece("codes", lo, lo, hi - lo)], device=cpu) for lo, hi in ((0, 9), (9, 15))]
    for e in ranks:
        e.reset(e.snapshot(sd(0)))
    frames = [e.encode(e.snapshot(sd(1))) for e in ranks]
    payload = assemble(frames, raw_len=layout.total_bytes, base_version=0)
    new = chunks.flatten(sd(1), layout)
    assert torch.equal(delta.decode(chunks.flatten(sd(0), layout), payload, verify=False), new)
