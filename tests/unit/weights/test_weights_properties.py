"""Properties of the weight plane's bookkeeping over arbitrary inputs: how a buffer is laid out and cut into
checksummed chunks (`chunks`, `manifest`), what a manifest lets a receiver rebuild (`versions`), which versions a
node keeps (`versions.VersionStore`), and the broadcast tree (`plan`). The delta codec's are in
test_weights_delta_properties.py.

    flatten → cut → chunks in any order → the same buffer → unflatten: the same tensors, bit for bit
    any one byte changed: exactly its chunk's checksum changes
    flip: the current version only moves forward; the newest `keep_versions` complete ones stay
    plan: a tree over every node; one copy into each host and across each link used, over the fewest links
"""

from __future__ import annotations

import itertools
import random
from collections import Counter, deque
from urllib.parse import urlsplit

import msgspec
import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rlctl.errors import PlanError, ProtocolError
from rlctl.transport.framing import dtypes, to_struct
from rlctl.weights import chunks, manifest
from rlctl.weights.plan import BroadcastPlan, Endpoint, plan_broadcast
from rlctl.weights.versions import (
    HeldVersion,
    Manifest,
    VersionStore,
    WeightSyncConfig,
    full_payload,
    payload_from_manifest,
)
from tests.unit.props import props
from tests.unit.weights.test_weights_plan import _descendants

PROPS = props(150)
DTYPES = sorted(dtypes())


# -- chunks ------------------------------------------------------------------------------------------------------
@st.composite
def cuts(draw: st.DrawFn, *, max_total: int = 6000) -> tuple[int, int, int]:
    """(total_bytes, bucket_bytes, chunk_bytes) with 0 < chunk_bytes ≤ bucket_bytes."""
    chunk = draw(st.integers(1, 300))
    bucket = draw(st.one_of(st.just(chunk), st.integers(chunk, 4 * chunk), st.integers(1, 8).map(lambda k: k * chunk)))
    total = draw(st.one_of(st.just(0), st.integers(0, 3 * bucket), st.integers(0, max_total)))
    return total, bucket, chunk


@PROPS
@given(c=cuts())
def test_chunks_cover_every_byte_once_in_order_each_inside_one_bucket(c: tuple[int, int, int]) -> None:
    """Indices count up from 0; chunks follow each other from byte 0 to the end; a chunk never spans two buckets,
    is never empty nor longer than `chunk_bytes`, and only the last one of a bucket is short; `manifest.chunk_count`
    and `Manifest.check` count as many."""
    total, bucket, chunk = c
    refs = chunks.cut(total, bucket_bytes=bucket, chunk_bytes=chunk)
    assert [r.index for r in refs] == list(range(len(refs)))
    assert [r.offset for r in refs] == [0, *(r.offset + r.length for r in refs)][: len(refs)]
    assert sum(r.length for r in refs) == total
    for r, nxt in itertools.pairwise([*refs, None]):
        assert 0 < r.length <= chunk and r.offset // bucket == r.bucket == (r.offset + r.length - 1) // bucket
        end_of_bucket = nxt is None or nxt.bucket != r.bucket
        assert r.length == chunk or end_of_bucket, r
        assert nxt is None or nxt.bucket in (r.bucket, r.bucket + 1)
    assert manifest.chunk_count(total, bucket_bytes=bucket, chunk_bytes=chunk) == len(refs)


@PROPS
@given(
    total=st.integers(0, 1 << 44),
    chunk=st.integers(1, 1 << 30),
    extra=st.integers(0, 1 << 30),
    off_by=st.sampled_from([-1, 0, 1]),
)
def test_a_manifest_is_checked_against_the_chunk_count_however_large(
    total: int, chunk: int, extra: int, off_by: int
) -> None:
    """`Manifest.check` counts a payload's chunks as `cut` would, before anything of that size exists."""
    bucket = chunk + extra
    n = manifest.chunk_count(total, bucket_bytes=bucket, chunk_bytes=chunk)
    if n + off_by < 0 or n + off_by > 1000:
        return
    m = Manifest(
        version=1,
        encoding="full",
        base_version=None,
        payload_bytes=total,
        bucket_bytes=bucket,
        chunk_bytes=chunk,
        sums=[0] * (n + off_by),
        weights_bytes=total,
        weights_xxh3=0,
        layout=[],
    )
    if off_by:
        with pytest.raises(ProtocolError, match="checksums for"):
            m.check(1 << 45, peer="p")
    else:
        m.check(1 << 45, peer="p")
        if n <= 1000 and total <= 1 << 20:
            assert n == len(chunks.cut(total, bucket_bytes=bucket, chunk_bytes=chunk))


@PROPS
@given(
    weights=st.integers(0, 1 << 50),
    bucket=st.one_of(st.integers(10, 30).map(lambda k: 1 << k), st.integers(1, 1 << 30)),
)
@example(weights=3 << 39, bucket=3 << 20)  # counted in 64 MiB buckets: 2 MiB chunks, 9 MiB of checksums in these
@example(weights=123456789012345, bucket=3 << 20)  # none fits: 4 MiB, past the bucket
def test_the_least_chunk_is_the_smallest_power_of_two_whose_manifest_fits_or_a_bucket(
    weights: int, bucket: int
) -> None:
    chunk = manifest.least_chunk_bytes(weights, bucket_bytes=bucket)

    def fits(c: int) -> bool:
        return manifest.manifest_bytes(weights, chunk_bytes=c, bucket_bytes=bucket) <= manifest.MANIFEST_BOUND

    assert chunk <= bucket and (fits(chunk) or chunk == bucket)
    smaller = 1 << ((chunk - 1).bit_length() - 1) if chunk > 1 else 0  # the power of two below it
    assert chunk & (chunk - 1) == 0 or chunk == bucket
    assert smaller < 1 << 10 or not fits(smaller)


@st.composite
def state_dicts(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    """Tensors of any dtype that may travel, any shape (0-dim, empty, odd byte counts), any bytes."""
    names = draw(st.lists(st.text(min_size=1, max_size=6), max_size=6, unique=True))
    out = {}
    for name in names:
        dtype = dtypes()[draw(st.sampled_from(DTYPES))]
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        raw = bytearray(draw(st.binary(min_size=nbytes, max_size=nbytes))) or bytearray(1)
        out[name] = torch.frombuffer(raw, dtype=torch.uint8)[:nbytes].view(dtype).view(shape)
    return out


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and a.reshape(-1).view(torch.uint8).tolist() == b.reshape(-1).view(torch.uint8).tolist()
    )


@PROPS
@given(sd=state_dicts(), chunk=st.integers(1, 200), buckets=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_chunks_arriving_in_any_order_rebuild_the_tensors_from_the_manifest_alone(
    sd: dict[str, torch.Tensor], chunk: int, buckets: int, seed: int
) -> None:
    """A version's manifest, through msgpack and its check, tells a receiver everything: the chunks, received
    in any order and each checked against its checksum, make the buffer again; its layout gives back the
    tensors bit for bit (NaNs, -0.0 and all). Every tensor is 64-byte aligned, the padding zero."""
    layout = chunks.layout_of(sd)
    flat = chunks.flatten(sd, layout)
    assert layout.total_bytes % chunks.ALIGN_BYTES == 0 and flat.numel() == layout.total_bytes
    used = torch.zeros(layout.total_bytes, dtype=torch.bool)
    for s in layout.slots:
        assert s.offset % chunks.ALIGN_BYTES == 0 and not used[s.offset : s.offset + s.nbytes].any()
        used[s.offset : s.offset + s.nbytes] = True
    assert not flat[~used].any()

    cfg = WeightSyncConfig(chunk_bytes=chunk, bucket_bytes=chunk * buckets)
    hv = HeldVersion(1, layout, chunks.checksum(flat), flat, complete=True)
    sent = full_payload(flat, cfg, have=True)
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(sent.manifest(hv, cfg)))
    m = to_struct(wire, Manifest, what="manifest")
    m.check(cfg.max_weights_bytes, peer="p")
    got = payload_from_manifest(m, torch.zeros(m.payload_bytes, dtype=torch.uint8))
    order = list(range(len(got.refs)))
    random.Random(seed).shuffle(order)
    for k, i in enumerate(order):
        assert not got.done
        r = sent.refs[i]
        got.data[r.offset : r.offset + r.length] = flat[r.offset : r.offset + r.length]
        assert chunks.checksum(got.data[r.offset : r.offset + r.length]) == got.sums[i]
        got.have[i] = True
        assert got.num_have == k + 1
    assert got.done and chunks.checksum(got.data) == m.weights_xxh3
    assert chunks.Layout.from_wire(m.layout, m.weights_bytes) == layout
    back = chunks.unflatten(got.data, chunks.Layout.from_wire(m.layout, m.weights_bytes))
    assert list(back) == list(sd) and all(_same_bits(back[k], sd[k]) for k in sd)


@st.composite
def layout_rows(draw: st.DrawFn) -> tuple[list[list], int]:
    """A manifest's layout as a peer may send it: mostly entries that fill their bytes, anywhere in the buffer."""
    total = draw(st.integers(0, 600))
    rows = []
    for _ in range(draw(st.integers(0, 4))):
        dtype = draw(st.sampled_from([*DTYPES, "float", ""]))
        shape = draw(st.lists(st.integers(-1, 5), max_size=4))
        itemsize = dtypes()[dtype].itemsize if dtype in dtypes() else 1
        numel = int(np.prod(shape, dtype=np.int64))
        nbytes = draw(st.one_of(st.just(numel * itemsize), st.integers(-1, 100)))
        offset = draw(st.one_of(st.integers(-1, total + 1), st.integers(0, 40).map(lambda k: 8 * k)))
        rows.append([draw(st.sampled_from("ab")), dtype, shape, offset, nbytes])
    return rows, total


@PROPS
@given(wire=layout_rows())
@example(wire=([["a", "bfloat16", [], 1, 2]], 3))  # a 2-byte element at an odd offset: torch cannot view it
def test_a_layout_off_the_wire_is_refused_or_unflattens(wire: tuple[list[list], int]) -> None:
    """`Layout.from_wire` refuses (ProtocolError) every entry `unflatten` would fail on later: what it takes
    gives each tensor its dtype and shape out of a buffer of `total_bytes`."""
    rows, total = wire
    try:
        layout = chunks.Layout.from_wire(rows, total)
    except ProtocolError:
        return
    out = chunks.unflatten(torch.zeros(total, dtype=torch.uint8), layout)
    for s in layout.slots:
        if s is [t for t in layout.slots if t.name == s.name][-1]:  # a repeated name: the last entry's tensor
            assert out[s.name].dtype == dtypes()[s.dtype] and tuple(out[s.name].shape) == s.shape


@PROPS
@given(sd=state_dicts(), chunk=st.integers(1, 200), at=st.integers(0, 1 << 16), mask=st.integers(1, 255))
def test_any_one_changed_byte_changes_exactly_its_chunks_checksum(
    sd: dict[str, torch.Tensor], chunk: int, at: int, mask: int
) -> None:
    flat = chunks.flatten(sd, chunks.layout_of(sd))
    if not flat.numel():
        return
    refs = chunks.cut(flat.numel(), bucket_bytes=3 * chunk, chunk_bytes=chunk)
    at %= flat.numel()
    bad = flat.clone()
    bad[at] ^= mask
    before, after = chunks.chunk_checksums(flat, refs), chunks.chunk_checksums(bad, refs)
    assert [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b] == [
        r.index for r in refs if r.offset <= at < r.offset + r.length
    ]
    assert chunks.sums_digest(before) != chunks.sums_digest(after)
    assert chunks.checksum(flat) != chunks.checksum(bad)


# -- versions a node keeps ---------------------------------------------------------------------------------------
@PROPS
@given(
    keep=st.integers(2, 4),
    ops=st.lists(st.tuples(st.sampled_from(["add", "flip", "flip"]), st.integers(0, 12)), max_size=40),
)
def test_flips_keep_the_newest_complete_versions_and_never_move_current_back(keep: int, ops) -> None:
    """Fetches start (`add`) and finish (`flip`) in any order, late ones too (a version older than the current
    one, or dropped meanwhile). After each flip: current is the newest version flipped, and held; at most
    `keep_versions` complete versions are held, and a complete one is dropped only for `keep` newer ones; an
    incomplete version older than current is dropped, a newer one (a fetch still running) kept."""
    store = VersionStore(keep)
    layout = chunks.Layout((), 0)
    made: dict[int, HeldVersion] = {}
    newest = -1
    for op, v in ops:
        if op == "add":
            if v not in made:
                made[v] = HeldVersion(v, layout, 0, torch.empty(0, dtype=torch.uint8))
                store.add(made[v])
            continue
        hv = made.get(v)
        if hv is None:
            continue
        before = dict(store.versions)
        hv.complete = True
        store.flip(hv)
        newest = max(newest, v)
        cur = store.current
        assert cur is not None and cur.version == newest and store.versions.get(newest) is cur
        held = store.versions
        complete = sorted(u for u, h in held.items() if h.complete)
        assert len(complete) <= keep
        for u, h in before.items():
            if u in held:
                continue
            if h.complete:
                assert sum(w > u for w in complete) >= keep, (u, complete)
            else:
                assert u < newest
        assert not [u for u, h in held.items() if not h.complete and u < newest]


# -- the broadcast plan ------------------------------------------------------------------------------------------
DCS = "ABCD"


@st.composite
def topologies(draw: st.DrawFn):
    """Roots and receivers over a few datacenters and hosts (some endpoints with no host), any links."""
    dcs = DCS[: draw(st.integers(1, 4))]
    source = draw(st.lists(st.sampled_from(dcs), min_size=1, max_size=2, unique=True))
    hosts = {dc: [f"{dc.lower()}{h}" for h in range(draw(st.integers(1, 3)))] for dc in dcs}

    def address(dc: str, port: int) -> str:
        return draw(
            st.one_of(
                st.sampled_from(hosts[dc]).map(lambda h: f"tcp://{h}:{port}"),
                st.sampled_from(["", "inproc://"]),
            )
        )

    roots = [
        Endpoint(f"r{i}", dc, address(dc, i))
        for i, dc in enumerate(draw(st.lists(st.sampled_from(source), min_size=1, max_size=4)))
    ]
    receivers = [
        Endpoint(f"u{i}", dc, address(dc, 100 + i))
        for i, dc in enumerate(draw(st.lists(st.sampled_from(dcs), max_size=14)))
    ]
    pairs = [frozenset(p) for p in itertools.combinations(dcs, 2)]
    links = draw(st.one_of(st.none(), st.sets(st.sampled_from(pairs)) if pairs else st.just(set())))
    return roots, receivers, links


def _host(e: Endpoint) -> str:
    return (urlsplit(e.address).hostname if "://" in e.address else None) or f"?{e.name}"


def _hops(dcs: set[str], source: set[str], links) -> dict[str, int]:
    """Links crossed from the nearest source datacenter to each datacenter that holds a node (reachable ones)."""
    dist, todo = dict.fromkeys(source, 0), deque(source)
    while todo:
        here = todo.popleft()
        for other in sorted(dcs):
            if other not in dist and (links is None or frozenset((here, other)) in links):
                dist[other] = dist[here] + 1
                todo.append(other)
    return dist


@settings(PROPS, max_examples=400)
@given(topo=topologies(), fanout=st.integers(1, 3), dc_chains=st.integers(1, 3))
def test_a_plan_is_a_tree_with_one_copy_into_each_host_and_across_each_link_used(topo, fanout: int, dc_chains: int):
    """A PlanError exactly when a datacenter cannot be reached over the links; otherwise: a tree over every node
    (each after its parent); one copy into each receiving host without a root (none into a root's), one across
    each link, to a datacenter's first receiver, over the fewest links; a relay sends one copy out of its host per
    chain (fanout 1); fallbacks stay in the datacenter or its parent's, never self, parent or a descendant."""
    roots, receivers, links = topo
    dc_of = {e.name: e.datacenter for e in (*roots, *receivers)}
    source = {e.datacenter for e in roots}
    hops = _hops(set(dc_of.values()), source, links)
    if set(dc_of.values()) - set(hops):
        with pytest.raises(PlanError, match="no inter-DC link path"):
            plan_broadcast(roots, receivers, dc_links=links, fanout=fanout, dc_chains=dc_chains)
        return
    plan = plan_broadcast(roots, receivers, dc_links=links, fanout=fanout, dc_chains=dc_chains)
    names = [e.name for e in (*roots, *receivers)]
    assert sorted(plan.order) == sorted(names) and set(plan.parent) == {e.name for e in receivers}
    at = {n: i for i, n in enumerate(plan.order)}
    assert all(at[p] < at[c] for c, p in plan.parent.items())

    host = {e.name: _host(e) for e in (*roots, *receivers)}
    into = Counter(host[c] for c, p in plan.parent.items() if host[p] != host[c])
    root_hosts = {host[e.name] for e in roots}
    for h in {host[e.name] for e in receivers}:
        assert into[h] == (0 if h in root_hosts else 1), (h, into)

    inbound = Counter(dc_of[c] for _, c in plan.inter_dc_edges())
    first = {dc: next(e.name for e in receivers if e.datacenter == dc) for dc in {e.datacenter for e in receivers}}
    assert inbound == Counter(dc for dc in first if dc not in source)
    for p, c in plan.inter_dc_edges():
        assert c == first[dc_of[c]] and (links is None or frozenset((dc_of[p], dc_of[c])) in links)
        assert hops[dc_of[c]] == hops[dc_of[p]] + 1
    for e in receivers:
        assert sum(dc_of[a] != dc_of[b] for a, b in _path(plan, e.name)) == hops[e.datacenter]

    if fanout == 1:
        for dc, relay in first.items():
            if dc in source:
                continue
            out = {c for c, p in plan.parent.items() if host[p] == host[relay] != host[c] and dc_of[c] == dc}
            assert len(out) <= dc_chains, (relay, out)
        for h in root_hosts:
            out = {c for c, p in plan.parent.items() if host[p] == h != host[c] and dc_of[c] == dc_of[p]}
            assert len(out) <= 1, (h, out)

    dc_parent = {dc_of[c]: dc_of[p] for p, c in plan.inter_dc_edges()}
    for e in receivers:
        fb = plan.fallbacks[e.name]
        assert e.name not in fb and plan.parent[e.name] not in fb and not set(fb) & _descendants(plan, e.name)
        assert len(set(fb)) == len(fb)
        assert all(dc_of[n] in (e.datacenter, dc_parent.get(e.datacenter)) for n in fb), (e.name, fb)


def _path(plan: BroadcastPlan, name: str) -> list[tuple[str, str]]:
    out = []
    while name in plan.parent:
        out.append((plan.parent[name], name))
        name = plan.parent[name]
    return out
