"""Weight plane over the inproc transport: relays, deltas, anchors, fallback to full, flips."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest
import torch

from bench.netem.bcast_agent import synthetic_weights
from rlctl.errors import TransportError
from rlctl.transport import InprocTransport, Message
from rlctl.weights.node import WeightNode
from rlctl.weights.versions import WeightSyncConfig

CFG = WeightSyncConfig(chunk_bytes=64 << 10, bucket_bytes=256 << 10, anchor_every=3, chunk_timeout_s=5)


@pytest.fixture
def nodes():
    t = InprocTransport(secret=b"job")
    made = [WeightNode(t, "inproc://", CFG) for _ in range(4)]
    yield made
    for n in made:
        n.close()


def _sd(version: int) -> dict[str, torch.Tensor]:
    return synthetic_weights(1 << 20, version=version, seed=3, change_frac=0.01)


def _fetch_all(pairs):
    errors = []

    def run(node, holders, v):
        try:
            node.fetch(v, holders)
        except TransportError as e:
            errors.append(e)

    ths = [threading.Thread(target=run, args=p) for p in pairs]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    assert not errors


def test_chain_delivers_full_then_deltas_then_an_anchor(nodes):
    root, a, b, c = nodes
    encodings = []
    for v in range(1, 6):
        sd = _sd(v)
        hv = root.publish(v, sd)
        encodings.append(sorted(hv.payloads))
        _fetch_all([(a, [root.address], v), (b, [a.address, root.address], v), (c, [b.address, root.address], v)])
        for n in (a, b, c):
            version, got = n.current()
            assert version == v and all(torch.equal(got[k], sd[k]) for k in sd)
            assert n.store.current.weights_xxh3 == hv.weights_xxh3
    # K=3: v1 anchor, v2-v3 deltas, v4 anchor, v5 delta
    assert encodings == [["full"], ["delta", "full"], ["delta", "full"], ["full"], ["delta", "full"]]
    assert sorted(c.store.current.payloads) == ["delta"]  # the leaf got v5 as a delta through two relays


def test_receiver_without_the_base_gets_the_full_version(nodes):
    root, a, b, _ = nodes
    root.publish(1, _sd(1))
    a.fetch(1, [root.address])
    root.publish(2, _sd(2))
    a.fetch(2, [root.address])
    assert sorted(a.store.current.payloads) == ["delta"]
    b.fetch(2, [a.address])  # b never had v1: a serves the weights it rebuilt from the delta
    assert b.current()[0] == 2 and sorted(b.store.current.payloads) == ["full"]
    assert all(torch.equal(b.current()[1][k], v) for k, v in _sd(2).items())


def test_previous_version_stays_current_until_the_new_one_is_verified():
    t = InprocTransport(secret=b"job")
    quick = WeightSyncConfig(chunk_bytes=64 << 10, bucket_bytes=256 << 10, chunk_timeout_s=0.2, attach_passes=1)
    # the root says it does not hold v7 at 0.8 × its chunk timeout (0.16 s); `a` waits for that word as long as a
    # loaded machine may take to run the root's thread (at 0.2 s, 0.04 s late read as a's timeout, not the refusal)
    patient = replace(quick, chunk_timeout_s=30.0)
    with WeightNode(t, "inproc://", quick) as root, WeightNode(t, "inproc://", patient) as a:
        root.publish(1, _sd(1))
        a.fetch(1, [root.address])
        with pytest.raises(TransportError, match="does not hold v7"):
            a.fetch(7, [root.address])  # nobody holds v7: the fetch fails, v1 stays in service
        version, sd = a.current()
        assert version == 1 and all(torch.equal(sd[k], v) for k, v in _sd(1).items())


def test_dead_first_holder_falls_through_to_the_next(nodes):
    root, a, b, _ = nodes
    root.publish(1, _sd(1))
    a.close()
    b.fetch(1, [a.address, root.address])
    assert b.current()[0] == 1


def test_a_version_the_holder_moved_past_is_refused_at_once_or_replaced_by_its_newest():
    """A newcomer asking a fast trainer for a version it already dropped hears so immediately (no
    wait for a version that cannot come), and with newer_ok gets the holder's current version.

    The nodes' chunk timeout is 60 s: a holder that waited for v1 would answer at 48 s (0.8 ×), and the bound on
    the refusal (30 s) leaves a loaded machine room to run the holder's thread late (at 5 s: 2.5 s)."""
    t = InprocTransport(secret=b"job")
    cfg = replace(CFG, chunk_timeout_s=60.0)
    root, a, b = (WeightNode(t, "inproc://", cfg) for _ in range(3))
    try:
        for v in (1, 2, 3):  # keep_versions 2: v1 is gone
            root.publish(v, _sd(v))
        t0 = time.monotonic()
        with pytest.raises(TransportError, match="does not hold v1"):
            a.fetch(1, [root.address])
        assert time.monotonic() - t0 < 0.5 * cfg.chunk_timeout_s
        hv = b.fetch(1, [root.address], newer_ok=True)
        assert hv.version == 3 and b.current()[0] == 3
        assert all(torch.equal(b.current()[1][k], v) for k, v in _sd(3).items())
    finally:
        for n in (root, a, b):
            n.close()


def test_a_relay_still_moving_the_previous_version_keeps_its_children_for_the_next():
    """Relay `a` is still pulling v2 from the root (paced: ≈ 5 s, the chunk timeout is 2.5 s) when `b` asks it for
    v3, which `a` was told it will fetch next: `a` answers `waiting` while its chunks move, then forwards v3 as
    it arrives. v3 crosses from the root once (to `a`); `b` never walks to the root.

    `a` answers every 0.8 × chunk timeout (2 s), and the ≈ 5 s of v2 still to move when `b` asks make `a` answer
    `waiting` twice. `b` waits 30 s for each answer: waiting as long as `a` (2.5 s) left a thread on a loaded machine
    0.5 s to be late, and a late `waiting` read as `a` gone (b walked to the root)."""
    t = InprocTransport(secret=b"job")
    cfg = WeightSyncConfig(chunk_bytes=64 << 10, bucket_bytes=256 << 10, delta=False, chunk_timeout_s=2.5)
    sd = {v: synthetic_weights(1 << 19, version=v, seed=3, change_frac=0.01) for v in (1, 2, 3)}
    size = sum(x.numel() * x.element_size() for x in sd[1].values())
    root, a = (WeightNode(t, "inproc://", cfg) for _ in range(2))
    b = WeightNode(t, "inproc://", replace(cfg, chunk_timeout_s=30.0))
    try:
        root.publish(1, sd[1])
        a.fetch(1, [root.address])
        b.fetch(1, [a.address, root.address])
        root.cfg = replace(cfg, send_bytes_per_s=size / 6.0)  # slow from v2 on: 8 chunks, one per 0.75 s
        root.publish(2, sd[2])
        moved = a.store.progress
        relay = threading.Thread(target=lambda: (a.fetch(2, [root.address]), a.fetch(3, [root.address])))
        relay.start()
        with a.store.cv:  # a is moving v2: its first chunk is in
            assert a.store.cv.wait_for(lambda: a.store.progress > moved, timeout=10)
        root.publish(3, sd[3])
        a.expect(3)  # the announcement of v3 reached a (its fetcher takes it once v2 is in)
        t0 = time.monotonic()
        b.fetch(3, [a.address, root.address])
        waited = time.monotonic() - t0
        relay.join(timeout=30)
        assert b.current()[0] == 3 and all(torch.equal(b.current()[1][k], x) for k, x in sd[3].items())
        assert [(v, addr, r) for v, addr, r in b.attempts if v == 3] == [(3, a.address, "ok")]
        assert [s.child for s in root.served if s.version == 3] == [a.address]  # one copy from the root
        assert waited > cfg.chunk_timeout_s  # longer than one chunk timeout: `waiting` kept b with its relay
    finally:
        for n in (root, a, b):
            n.close()


def _dies_after(node: WeightNode, num_chunks: int) -> None:
    """`node` closes each child's stream after sending it `num_chunks` chunks (a parent dying mid-version)."""
    real_send = node._send_chunk
    sent: dict[object, int] = {}

    def send_chunk(conn, hv, pl, i, record):
        sent[conn] = sent.get(conn, 0) + 1
        if sent[conn] > num_chunks:
            conn.close()
        return real_send(conn, hv, pl, i, record)

    node._send_chunk = send_chunk


def test_a_version_whose_fetch_failed_is_dropped_once_a_newer_one_is_current():
    """A unit whose parent dies mid-v2 holds an incomplete v2 (a full-size buffer): once v3 is current it goes,
    and a child streaming it from this node is closed at once rather than left waiting for chunks."""
    t = InprocTransport(secret=b"job")
    cfg = WeightSyncConfig(chunk_bytes=64 << 10, bucket_bytes=256 << 10, delta=False, attach_passes=1)
    root, dying, a, leaf = (WeightNode(t, "inproc://", cfg) for _ in range(4))
    try:
        root.publish(1, _sd(1))
        a.fetch(1, [root.address])
        dying.publish(2, _sd(2))
        _dies_after(dying, 3)
        with pytest.raises(TransportError, match="closed"):
            a.fetch(2, [dying.address])
        held = a.store.versions[2]
        assert not held.complete and held.payloads["full"].num_have == 3
        child: list[BaseException] = []
        streaming = threading.Thread(target=lambda: _record_failure(child, leaf.fetch, 2, [a.address]))
        streaming.start()  # the leaf waits on a's v2, whose chunk 3 will never arrive
        while not a.served:
            with a.store.cv:
                a.store.cv.wait(timeout=0.01)
        root.publish(2, _sd(2))
        root.publish(3, _sd(3))
        a.fetch(3, [root.address])
        assert sorted(a.store.versions) == [1, 3]
        assert a.host_bytes() == 2 * held.weights.numel()
        streaming.join(timeout=0.5 * cfg.chunk_timeout_s)  # well within the leaf's chunk timeout
        assert not streaming.is_alive() and child and "closed" in str(child[0])
    finally:
        for n in (root, dying, a, leaf):
            n.close()


def _record_failure(out: list[BaseException], fn, *args) -> None:
    try:
        fn(*args)
    except TransportError as e:
        out.append(e)


class _SaysWhenWaiting(threading.Condition):
    """A node's condition variable that tells the test when a thread starts waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)


def test_a_relay_woken_by_a_resend_request_sends_only_chunks_it_holds():
    """Relay `a` holds chunk 0 of v1 only (the rest still arriving) when its child asks for chunk 0 again (its first
    copy arrived corrupted): `a` re-sends chunk 0 and waits for chunk 1, never sending bytes it does not hold."""
    t = InprocTransport(secret=b"job")
    cfg = WeightSyncConfig(chunk_bytes=64 << 10, bucket_bytes=256 << 10, delta=False, attach_passes=1)
    root, a, leaf = (WeightNode(t, "inproc://", cfg) for _ in range(3))
    try:
        hv = root.publish(1, _sd(1))
        full = hv.payloads["full"]
        a.store.cv = _SaysWhenWaiting()
        _, pl = a._adopt(full.manifest(hv, cfg))  # v1's manifest has reached the relay
        sends: list[tuple[int, bool]] = []  # (chunk, held by `a` when sent)
        resent = threading.Event()
        real_send = a._send_chunk

        def send_chunk(conn, hv_, pl_, i, record):
            sends.append((i, pl_.have[i]))
            if len(sends) == 1:  # chunk 0's first copy is corrupted on the way
                r = pl_.refs[i]
                bad = pl_.data[r.offset : r.offset + r.length].clone()
                bad[7] ^= 1
                head = {"version": 1, "bucket": r.bucket, "index": i, "offset": r.offset, "length": r.length}
                conn.send(Message("chunk", {**head, "xxh3": pl_.sums[i]}, [bad]))
                return r.length
            n = real_send(conn, hv_, pl_, i, record)
            if len(sends) == 2:  # the re-send: from here on, note when the stream waits next
                a.store.cv.waiting.clear()
                resent.set()
            return n

        a._send_chunk = send_chunk

        def arrive(i: int) -> None:
            r = pl.refs[i]
            pl.data[r.offset : r.offset + r.length] = full.data[r.offset : r.offset + r.length]
            with a.store.cv:
                pl.have[i] = True
                a.store.cv.notify_all()

        arrive(0)
        fetched: list[BaseException] = []
        th = threading.Thread(target=lambda: _record_failure(fetched, leaf.fetch, 1, [a.address]))
        th.start()
        assert resent.wait(10) and a.store.cv.waiting.wait(10)  # re-sent chunk 0, then waited for chunk 1
        for i in range(1, len(pl.refs)):
            arrive(i)
        th.join(timeout=10)
        assert not fetched and leaf.current()[0] == 1 and [x[2] for x in leaf.attempts] == ["ok"]
        assert sends == [(0, True), (0, True), *((i, True) for i in range(1, len(pl.refs)))]
    finally:
        for n in (root, a, leaf):
            n.close()


def test_a_unit_resuming_a_delta_keeps_its_chunks_only_with_a_holder_of_the_same_bytes():
    """Two holders may encode one delta (version, base) into different bytes (here zstd levels; in a job a root's
    composed delta and a relay's on-demand one). A unit re-attaching mid-delta gets only its missing chunks from a
    holder of the same bytes, and every chunk from the other: that one must not skip the chunks the unit drops."""
    t = InprocTransport(secret=b"job")
    cfg = WeightSyncConfig(chunk_bytes=1 << 10, bucket_bytes=4 << 10, chunk_timeout_s=1, attach_passes=1)
    first, same = (WeightNode(t, "inproc://", cfg) for _ in range(2))
    # the units wait 30 s for each chunk (the holders' answers come at once, or as `waiting` every 0.25 s while they
    # encode): at the holders' 1 s, a loaded machine running a holder's thread late failed the unit's one pass
    unit, unit2 = (WeightNode(t, "inproc://", replace(cfg, chunk_timeout_s=30.0)) for _ in range(2))
    other = WeightNode(t, "inproc://", replace(cfg, delta_level=19))
    try:
        for holder in (first, same, other):
            for v in (1, 2):
                holder.publish(v, _sd(v))
        d, d_other = first.store.current.payloads["delta"], other.store.current.payloads["delta"]
        assert d.sums == same.store.current.payloads["delta"].sums and d.sums != d_other.sums
        for u in (unit, unit2):
            u.fetch(1, [first.address])
        _dies_after(first, 2)
        for u, holder in ((unit, same), (unit2, other)):
            got = u.fetch(2, [first.address, holder.address])  # `first` dies after two chunks of the delta
            assert (got.received_encoding, got.received_base) == ("delta", 1) and u.current()[0] == 2
            assert [(v, at, r == "ok") for v, at, r in u.attempts][1:] == [
                (2, first.address, False),
                (2, holder.address, True),
            ]
        resumed, restarted = same.served[-1], other.served[-1]
        assert resumed.bytes == d.data.numel() - 2 * cfg.chunk_bytes  # the two chunks it had are not sent again
        assert restarted.bytes == d_other.data.numel()
    finally:
        for n in (first, same, other, unit, unit2):
            n.close()
