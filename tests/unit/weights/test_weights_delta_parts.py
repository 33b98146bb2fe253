"""The delta encoding split over P parts: the assembled frames decode with `delta.decode` bit for bit, to the
same result as `delta.encode`'s, and each part encodes only its share of the elements."""

from __future__ import annotations

import itertools

import pytest
import torch

from rlctl.errors import ProtocolError
from rlctl.weights import delta
from rlctl.weights.delta_parts import assemble, encode_part, part_range


def buffers(nbytes: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    prev = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    new = prev.clone()
    new[::7] ^= 3  # a sparse change, as after one small RL step
    return prev, new


@pytest.mark.parametrize("nbytes", [1, 2, 5, 1001, 70_000])
@pytest.mark.parametrize("parts", [1, 2, 3, 8])
def test_assembled_parts_decode_like_the_single_frame(nbytes: int, parts: int) -> None:
    prev, new = buffers(nbytes)
    frames = [encode_part(prev, new, part=r, parts=parts) for r in range(parts)]
    payload = assemble(frames, new=new, base_version=4)
    assert delta.base_version_of(payload) == 4
    assert torch.equal(delta.decode(prev, payload), new)
    single = delta.encode(prev, new, base_version=4)
    assert bytes(payload[: delta.HEADER.size - 4].numpy()) == bytes(single[: delta.HEADER.size - 4].numpy())


def test_each_part_encodes_only_its_share() -> None:
    prev, new = buffers(90_001)  # odd: compared byte by byte, as delta.encode does
    ranges = [part_range(new.numel(), part=r, parts=3) for r in range(3)]
    assert ranges[0][0] == 0 and ranges[-1][1] == new.numel()
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))  # disjoint and covering
    for r, (lo, hi) in enumerate(ranges):
        segs = delta.from_frame(encode_part(prev, new, part=r, parts=3))
        assert segs[0].first == lo and sum(s.count for s in segs) == int((prev[lo:hi] != new[lo:hi]).sum())


def test_frames_in_any_order_assemble_the_same_delta() -> None:
    prev, new = buffers(10_000)
    frames = [encode_part(prev, new, part=r, parts=2) for r in range(2)]
    assert torch.equal(delta.decode(prev, assemble(frames[::-1], new=new, base_version=1)), new)
    with pytest.raises(ProtocolError, match="ends inside"):
        delta.from_frame(frames[0][:-1])
    with pytest.raises(ValueError, match="part 2"):
        encode_part(prev, new, part=2, parts=2)
