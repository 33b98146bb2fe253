"""Weight plane over the inproc transport: relays, deltas, anchors, fallback to full, flips."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from bench.netem.bcast_agent import synthetic_weights
from rlctl.errors import TransportError
from rlctl.transport import InprocTransport
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
    with WeightNode(t, "inproc://", quick) as root, WeightNode(t, "inproc://", quick) as a:
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


def test_a_version_the_holder_moved_past_is_refused_at_once_or_replaced_by_its_newest(nodes):
    """A newcomer asking a fast trainer for a version it already dropped hears so immediately (no
    wait for a version that cannot come), and with newer_ok gets the holder's current version."""
    root, a, b, _ = nodes
    for v in (1, 2, 3):  # keep_versions 2: v1 is gone
        root.publish(v, _sd(v))
    t0 = time.monotonic()
    with pytest.raises(TransportError, match="does not hold v1"):
        a.fetch(1, [root.address])
    assert time.monotonic() - t0 < 0.5 * CFG.chunk_timeout_s
    hv = b.fetch(1, [root.address], newer_ok=True)
    assert hv.version == 3 and b.current()[0] == 3
    assert all(torch.equal(b.current()[1][k], v) for k, v in _sd(3).items())


def test_a_relay_still_moving_the_previous_version_keeps_its_children_for_the_next():
    """Relay `a` is still pulling v2 from the root (paced: ≈ 2 s, the chunk timeout is 1 s) when `b` asks it for
    v3, which `a` was told it will fetch next: `a` answers `waiting` while its chunks move, then forwards v3 as
    it arrives. v3 crosses from the root once (to `a`); `b` never walks to the root."""
    t = InprocTransport(secret=b"job")
    cfg = WeightSyncConfig(chunk_bytes=64 << 10, bucket_bytes=256 << 10, delta=False, chunk_timeout_s=1.0)
    sd = {v: synthetic_weights(1 << 19, version=v, seed=3, change_frac=0.01) for v in (1, 2, 3)}
    size = sum(x.numel() * x.element_size() for x in sd[1].values())
    root = WeightNode(t, "inproc://", WeightSyncConfig(**{**cfg.__dict__, "send_bytes_per_s": size / 2.0}))
    a, b = WeightNode(t, "inproc://", cfg), WeightNode(t, "inproc://", cfg)
    try:
        root.publish(1, sd[1])
        a.fetch(1, [root.address])
        b.fetch(1, [a.address, root.address])
        root.publish(2, sd[2])
        relay = threading.Thread(target=lambda: (a.fetch(2, [root.address]), a.fetch(3, [root.address])))
        relay.start()
        time.sleep(0.3)  # a is moving v2
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
