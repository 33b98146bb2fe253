"""Properties of the delta codec (`rlctl.weights.delta`), its split over ranks (`delta_parts`, `encoder`) and a root's
composed deltas (`root`), over arbitrary buffers: any dtype's bit patterns (NaN, ±inf, -0.0, subnormals, all ones),
any size (empty, one element, odd byte counts), identical, sparse, completely different and unrelated versions.

    decode(base, encode(base, new))                   == new, bit for bit (in place too)
    decode(v0, compose(v0→v1, …, vk-1→vk))            == vk
    decode(base, assemble(every part's frame, any order)) == new
    a payload with one byte changed, any header or segment field set to any value, cut short, or applied to
    another base: bit-exact or ProtocolError
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch
import xxhash
import zstandard
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rlctl.errors import ProtocolError
from rlctl.transport import InprocTransport
from rlctl.transport.framing import dtypes
from rlctl.weights import chunks, delta, delta_parts
from rlctl.weights.encoder import DeviceEncoder, Piece
from rlctl.weights.root import RootNode
from rlctl.weights.versions import Subscribe, WeightSyncConfig
from tests.unit.props import props

PROPS = props(120)
CPU = torch.device("cpu")
DTYPES = sorted(dtypes())  # every dtype that may travel: the codec sees their bytes
WIDTHS = [1, 2, 4, 8]  # the element widths the codec compares in (`delta._INT`)
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _specials(name: str) -> list[int]:
    """Bit patterns worth hitting in a dtype: 0, 1, all ones, the sign bit alone, and for floats NaN (quiet,
    negative, signalling), ±inf, -0.0, the smallest subnormal and the largest finite value."""
    dt = dtypes()[name]
    width = dt.itemsize
    bits = 8 * width
    out = {0, 1, (1 << bits) - 1, 1 << (bits - 1)}
    if dt.is_floating_point or dt.is_complex:
        real = {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dt, dt)
        info = torch.finfo(real)
        vals = [float("nan"), -float("nan"), float("inf"), -float("inf"), -0.0, info.tiny / 2, info.max, 1.0]
        words = torch.tensor(vals, dtype=torch.float64).to(real).view(_signed(real.itemsize)).tolist()
        pats = [w & ((1 << (8 * real.itemsize)) - 1) for w in words]
        pats.append(pats[2] | 1)  # +inf with a mantissa bit: a signalling NaN
        if dt.is_complex:  # (re, im) pairs of those
            half = 8 * real.itemsize
            pats = [a | (b << half) for a in pats for b in pats[:3]]
        out.update(pats)
    return sorted(out)


def _signed(width: int) -> torch.dtype:
    return {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]


def _bytes_of(words: list[int], width: int) -> torch.Tensor:
    """Elements of `width` bytes (unsigned ints, little-endian) as a flat uint8 tensor."""
    raw = b"".join(w.to_bytes(width, "little") for w in words)
    out = torch.empty(len(raw), dtype=torch.uint8)
    out.numpy()[:] = np.frombuffer(raw, np.uint8)
    return out


@st.composite
def versions(draw: st.DrawFn, *, max_numel: int = 160) -> tuple[str, torch.Tensor, torch.Tensor]:
    """(dtype, base, new): two flat buffers of one dtype's elements, related by one of the ways versions are."""
    name = draw(st.sampled_from(DTYPES))
    width = dtypes()[name].itemsize
    numel = draw(st.one_of(st.just(0), st.just(1), st.integers(0, max_numel)))
    word = st.one_of(st.sampled_from(_specials(name)), st.integers(0, (1 << (8 * width)) - 1))
    base = draw(st.lists(word, min_size=numel, max_size=numel))
    how = draw(st.sampled_from(["same", "sparse", "all", "unrelated"]))
    if how == "same":
        new = list(base)
    elif how == "unrelated":
        new = draw(st.lists(word, min_size=numel, max_size=numel))
    elif how == "all":  # every element differs
        other = draw(st.lists(word, min_size=numel, max_size=numel))
        new = [w if w != b else b ^ 1 for w, b in zip(other, base, strict=True)]
    else:
        new = list(base)
        for i in draw(st.lists(st.integers(0, max(numel - 1, 0)), max_size=numel)) if numel else []:
            new[i] = draw(word)
    return name, _bytes_of(base, width), _bytes_of(new, width)


def _changed(base: torch.Tensor, new: torch.Tensor, eb: int) -> int:
    a, b = base.numpy().view(_UINT[eb]), new.numpy().view(_UINT[eb])
    return int((a != b).sum())


def _zstd_bound(n: int) -> int:
    """ZSTD_COMPRESSBOUND: the most zstd makes of n bytes."""
    return n + (n >> 8) + (((128 << 10) - n) >> 11 if n < (128 << 10) else 0)


def _xxh3(t: torch.Tensor) -> int:
    return xxhash.xxh3_64_intdigest(t.numpy().tobytes())


# -- encode / decode ---------------------------------------------------------------------------------------------
@PROPS
@given(v=versions(), element_bytes=st.sampled_from(WIDTHS), base_version=st.integers(-(2**63), 2**63 - 1))
def test_decode_of_encode_is_the_new_version_bit_for_bit(v, element_bytes: int, base_version: int) -> None:
    """Only the changed elements travel: one segment (a buffer under `PIECE_ELEMENTS`; none for an empty one)
    whose count is the number of elements that differ, its planes no more than zstd's bound of theirs; identical
    versions cost the header, the table and two empty frames whatever their size."""
    _, base, new = v
    enc = delta.encode(base, new, base_version=base_version, element_bytes=element_bytes)
    assert delta.base_version_of(enc) == base_version
    assert torch.equal(delta.decode(base, enc), new)
    in_place = base.clone()
    assert delta.decode(in_place, enc, out=in_place).data_ptr() == in_place.data_ptr()
    assert torch.equal(in_place, new)

    eb = delta.element_bytes_for(new.numel(), element_bytes)
    raw = enc.numpy().tobytes()
    *_, head_eb, segments = delta.HEADER.unpack_from(raw)
    assert (head_eb, segments) == (eb, 1 if new.numel() else 0)
    if not new.numel():
        assert enc.numel() == delta.HEADER.size
        return
    first, count, gap_bytes, gz, vz = delta.SEGMENT.unpack_from(raw, delta.HEADER.size)
    assert (first, count, gap_bytes) == (0, _changed(base, new, eb), 4)
    assert gz <= _zstd_bound(4 * count) and vz <= _zstd_bound(eb * count)
    assert enc.numel() == delta.HEADER.size + delta.SEGMENT.size + gz + vz
    if count == 0:
        empty = len(zstandard.ZstdCompressor(level=1).compress(b""))
        assert enc.numel() == delta.HEADER.size + delta.SEGMENT.size + 2 * empty


@PROPS
@given(
    v=versions(max_numel=60),
    element_bytes=st.sampled_from(WIDTHS),
    at=st.one_of(st.integers(0, delta.HEADER.size + delta.SEGMENT.size - 1), st.integers(0, 2**16)),  # header often
    mask=st.integers(1, 255),
)
@example(
    v=("uint8", torch.zeros(6, dtype=torch.uint8), torch.ones(6, dtype=torch.uint8)), element_bytes=2, at=31, mask=6
)
@example(
    v=("uint8", torch.zeros(6, dtype=torch.uint8), torch.ones(6, dtype=torch.uint8)), element_bytes=2, at=76, mask=192
)
def test_any_one_byte_changed_in_a_payload_decodes_bit_exact_or_raises_protocol_error(
    v, element_bytes: int, at: int, mask: int
) -> None:
    """`decode`'s contract: bit-exact or ProtocolError (the caller then fetches the version in full). A changed
    base_version is the caller's to check, so that byte may decode fine; anything else that decodes is `new`.
    The examples: the header's element width 2 made 4 (byte 31), which does not divide the 6-byte buffer; the gaps'
    zstd frame descriptor (byte 76) saying an 8-byte content size, the next bytes read as exabytes."""
    _, base, new = v
    enc = delta.encode(base, new, base_version=3, element_bytes=element_bytes)
    at %= enc.numel()
    bad = enc.clone()
    bad[at] ^= mask
    try:
        got = delta.decode(base, bad)
    except ProtocolError:
        return
    assert torch.equal(got, new), f"byte {at} changed, decoded into something else"


# (byte offset, bytes) of every number a payload's header and its first segment's entry hold (big-endian)
FIELDS = {
    "base_version": (4, 8),
    "raw_len": (12, 8),
    "target_xxh3": (20, 8),
    "element_bytes": (28, 4),
    "segments": (32, 4),
    "first": (36, 8),
    "count": (44, 8),
    "gap_bytes": (52, 4),
    "gaps_zlen": (56, 8),
    "values_zlen": (64, 8),
}


def test_the_fields_are_where_the_formats_put_them() -> None:
    assert delta.HEADER.size == FIELDS["first"][0] and delta.SEGMENT.size == 72 - FIELDS["first"][0]
    raw = delta.HEADER.pack(delta.MAGIC, 1, 2, 3, 4, 5) + delta.SEGMENT.pack(6, 7, 8, 9, 10)
    assert [int.from_bytes(raw[at : at + n], "big") for at, n in FIELDS.values()] == list(range(1, 11))


@PROPS
@given(
    v=versions(max_numel=60),
    field=st.sampled_from(sorted(FIELDS)),
    value=st.one_of(st.integers(0, 16), st.integers(0, 2**64 - 1)),  # small ones often: widths, counts
)
@example(
    v=("uint8", torch.zeros(6, dtype=torch.uint8), torch.ones(6, dtype=torch.uint8)), field="element_bytes", value=4
)
def test_any_header_or_segment_field_set_to_any_value_decodes_bit_exact_or_raises_protocol_error(
    v, field: str, value: int
) -> None:
    """Sizes, counts, positions and widths as a peer may send them (lengths past the payload, counts past the
    buffer, a table longer than the payload): refused, or harmless."""
    _, base, new = v
    enc = delta.encode(base, new, base_version=3)
    at, size = FIELDS[field]
    raw = bytearray(enc.numpy().tobytes())
    if at + size > len(raw):
        return  # an empty buffer's payload has no segment entry
    raw[at : at + size] = (value % (1 << (8 * size))).to_bytes(size, "big")
    try:
        got = delta.decode(base, torch.frombuffer(raw, dtype=torch.uint8))
    except ProtocolError:
        return
    assert torch.equal(got, new)


@settings(PROPS, max_examples=60)
@given(v=versions(max_numel=60), data=st.data())
def test_a_payload_cut_short_or_applied_to_another_base_raises_protocol_error(v, data) -> None:
    _, base, new = v
    enc = delta.encode(base, new, base_version=0)
    short = data.draw(st.integers(0, enc.numel() - 1))
    with pytest.raises(ProtocolError):
        delta.decode(base, enc[:short].clone())
    if base.numel():
        other = base.clone()
        other[data.draw(st.integers(0, base.numel() - 1))] ^= data.draw(st.integers(1, 255))
        with pytest.raises(ProtocolError, match="checksum"):
            delta.decode(other, enc)
    with pytest.raises(ProtocolError, match="byte buffer"):
        delta.decode(torch.zeros(base.numel() + 2, dtype=torch.uint8), enc)


# -- segments, frames and parts ----------------------------------------------------------------------------------
@PROPS
@given(
    v=versions(max_numel=120),
    element_bytes=st.sampled_from(WIDTHS),
    parts=st.integers(1, 6),
    piece_elements=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_parts_frames_in_any_order_assemble_into_a_payload_that_decodes_to_the_new_version(
    v, element_bytes: int, parts: int, piece_elements: int, seed: int
) -> None:
    """Each part encodes its `part_range` of the buffer (its own slices, located at their offset) in pieces of
    any size; its segments survive a frame; the frames, gathered in any order, are one payload."""
    _, base, new = v
    eb = delta.element_bytes_for(new.numel(), element_bytes)
    frames = []
    for part in range(parts):
        lo, hi = delta_parts.part_range(new.numel() // eb, part=part, parts=parts)
        segs = delta.encode_segments(
            base[lo * eb : hi * eb], new[lo * eb : hi * eb], element_bytes=eb, piece_elements=piece_elements, offset=lo
        )
        assert sum(s.count for s in segs) == _changed(base[lo * eb : hi * eb], new[lo * eb : hi * eb], eb)
        assert delta.from_frame(delta.to_frame(segs)) == segs
        frames.append(delta.to_frame(segs))
    random.Random(seed).shuffle(frames)
    payload = delta_parts.assemble(
        frames, raw_len=new.numel(), base_version=1, element_bytes=eb, target_xxh3=_xxh3(new)
    )
    assert torch.equal(delta.decode(base, payload), new)


@st.composite
def chains(draw: st.DrawFn) -> list[torch.Tensor]:
    """Versions v0..vk of one buffer, each a few changes from the last; some changes put an element back."""
    width = draw(st.sampled_from(WIDTHS))
    numel = draw(st.integers(0, 80))
    word = st.integers(0, (1 << (8 * width)) - 1)
    words = draw(st.lists(word, min_size=numel, max_size=numel))
    out = [list(words)]
    for _ in range(draw(st.integers(1, 5))):
        nxt = list(out[-1])
        for i in draw(st.lists(st.integers(0, numel - 1), max_size=numel)) if numel else []:
            nxt[i] = draw(st.one_of(word, st.sampled_from([w[i] for w in out])))  # new, or an older value back
        out.append(nxt)
    return [_bytes_of(w, width) for w in out]


@PROPS
@given(vs=chains(), element_bytes=st.sampled_from(WIDTHS))
def test_a_composed_chain_of_deltas_turns_its_first_base_into_its_last_version(
    vs: list[torch.Tensor], element_bytes: int
) -> None:
    """Its base is the first delta's, its checksum the last's; an element changed back is dropped."""
    steps = [
        delta.encode(a, b, base_version=k, element_bytes=element_bytes)
        for k, (a, b) in enumerate(itertools.pairwise(vs))
    ]
    composed = delta.compose(steps)
    assert delta.base_version_of(composed) == 0
    assert torch.equal(delta.decode(vs[0], composed), vs[-1])
    eb = delta.element_bytes_for(vs[0].numel(), element_bytes)
    count = delta.SEGMENT.unpack_from(composed.numpy().tobytes(), delta.HEADER.size)[1]
    assert count == _changed(vs[0], vs[-1], eb)


# -- the trainer ranks' encoders ---------------------------------------------------------------------------------
@st.composite
def state_dicts(draw: st.DrawFn) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Two versions of a state dict of tensors of any dtype and shape (odd byte counts, empty, 0-dim)."""
    names = draw(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=5, unique=True))
    old, new = {}, {}
    for name in names:
        dtype = dtypes()[draw(st.sampled_from(DTYPES))]
        shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
        numel = int(np.prod(shape, dtype=np.int64))
        nbytes = numel * dtype.itemsize
        raw = draw(st.binary(min_size=nbytes, max_size=nbytes))
        flips = draw(st.lists(st.integers(0, max(nbytes - 1, 0)), max_size=4)) if nbytes else []
        changed = bytearray(raw)
        for i in flips:
            changed[i] ^= draw(st.integers(1, 255))
        old[name] = torch.frombuffer(bytearray(raw) or bytearray(1), dtype=torch.uint8)[:nbytes].view(dtype).view(shape)
        new[name] = torch.frombuffer(changed or bytearray(1), dtype=torch.uint8)[:nbytes].view(dtype).view(shape)
    return old, new


def _check_encoders(encoders: list[DeviceEncoder], old, new, seed: int) -> None:
    layout = encoders[0].layout
    for e in encoders:
        e.reset(e.snapshot(old))
    frames = [e.encode(e.snapshot(new)) for e in encoders]
    random.Random(seed).shuffle(frames)
    payload = delta_parts.assemble(frames, raw_len=layout.total_bytes, base_version=0)
    prev, want = chunks.flatten(old, layout), chunks.flatten(new, layout)
    assert torch.equal(delta.decode(prev, payload, verify=False), want)
    # segments that overlap (ranks sharing an element) compose as they decode: a root composes such payloads
    assert torch.equal(delta.decode(prev, delta.compose([payload]), verify=False), want)


@PROPS
@given(sds=state_dicts(), parts=st.integers(1, 7), seed=st.integers(0, 2**32 - 1))
def test_whole_replica_parts_cover_every_tensor_byte_once_and_their_deltas_rebuild_the_version(
    sds, parts: int, seed: int
) -> None:
    old, new = sds
    layout = chunks.layout_of(old)
    encoders = [DeviceEncoder.for_part(layout, part=r, parts=parts, device=CPU) for r in range(parts)]
    for s in layout.slots:  # every byte of every tensor in exactly one part, none of the padding
        got = sorted((p.start, p.start + p.nbytes) for e in encoders for p in e.pieces if p.name == s.name)
        ends = [s.offset] + [hi for _, hi in got]
        assert [lo for lo, _ in got] == ends[:-1] and ends[-1] == s.offset + s.nbytes
        assert all(p.at == p.start - s.offset for e in encoders for p in e.pieces if p.name == s.name)
    _check_encoders(encoders, old, new, seed)


@PROPS
@given(sds=state_dicts(), ranks=st.integers(1, 5), data=st.data())
def test_shards_cut_at_any_byte_rebuild_the_version(sds, ranks: int, data) -> None:
    """FSDP2-like shards: each tensor's bytes cut into consecutive pieces at any byte (mid-element too), one per
    rank; the ranks sharing an element each encode their own byte of it."""
    old, new = sds
    layout = chunks.layout_of(old)
    pieces: list[list[Piece]] = [[] for _ in range(ranks)]
    for s in layout.slots:
        cuts = sorted(data.draw(st.lists(st.integers(0, s.nbytes), min_size=ranks - 1, max_size=ranks - 1)))
        for r, (lo, hi) in enumerate(itertools.pairwise([0, *cuts, s.nbytes])):
            if lo < hi:
                pieces[r].append(Piece(s.name, s.offset + lo, lo, hi - lo))
    encoders = [DeviceEncoder(layout, p, device=CPU) for p in pieces if p]
    if encoders:
        _check_encoders(encoders, old, new, data.draw(st.integers(0, 2**32 - 1)))


# -- a root's composed deltas ------------------------------------------------------------------------------------
@settings(PROPS, max_examples=25)
@given(
    steps=st.lists(st.tuples(st.sampled_from(["delta", "delta", "payload", "anchor"]), st.integers(0, 40)), max_size=6),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_root_serves_every_base_a_payload_that_rebuilds_its_current_version(steps, seed: int) -> None:
    """Whatever a root published (deltas from state dicts, payloads encoded elsewhere, anchors), a child at any
    earlier version gets a delta that rebuilds the current one from its base (checked against the target
    checksum the root set), or the version in full."""
    rng = np.random.default_rng(seed)
    sd = {"w": torch.from_numpy(rng.integers(0, 2**16, 700, dtype=np.uint16).view(np.int16)).view(torch.bfloat16)}
    t = InprocTransport(secret=b"job")
    root = RootNode(t, "inproc://", WeightSyncConfig(chunk_bytes=256, bucket_bytes=1024), keep_deltas=3)
    try:
        root.publish(0, sd)
        flats = [chunks.flatten(sd, chunks.layout_of(sd))]
        for version, (how, num_changed) in enumerate(steps, start=1):
            sd = {"w": sd["w"].clone()}
            where = torch.from_numpy(rng.integers(0, 700, num_changed))
            sd["w"].view(torch.int16)[where] ^= torch.from_numpy(rng.integers(1, 2**15, num_changed, dtype=np.int16))
            flat = chunks.flatten(sd, chunks.layout_of(sd))
            if how == "payload":  # encoded on the trainer's device: the root sets its target checksum
                data = delta.encode(flats[-1], flat, base_version=version - 1, target_xxh3=0)
                root.publish(version, delta_payload=data)
            else:
                root.publish(version, sd, anchor=how == "anchor")
            flats.append(flat)
        cur = root.store.current
        assert cur is not None and torch.equal(cur.weights, flats[-1])
        anchored = max([v for v, (how, _) in enumerate(steps, start=1) if how == "anchor"], default=0)
        for base, flat in enumerate(flats[:-1]):
            pl = root._payload_for(cur, Subscribe(version=cur.version, base_version=base), conn=None)  # type: ignore[arg-type]
            if pl.encoding == "full":
                assert torch.equal(pl.data, flats[-1])
                # a few sparse steps since the last full version, all kept: their composition is smaller
                assert base < anchored or base < cur.version - 3, base
            else:
                assert pl.base_version == base and torch.equal(delta.decode(flat, pl.data), flats[-1])
    finally:
        root.close()
