"""Weight plane without periodic anchors: deltas every version, on-demand deltas and full copies, byte accounting."""

from __future__ import annotations

import threading

import pytest
import torch

from bench.netem.bcast_agent import synthetic_weights
from rlctl.transport import InprocTransport
from rlctl.weights import delta
from rlctl.weights.node import WeightNode
from rlctl.weights.versions import Served, WeightSyncConfig

SIZE = 1 << 20


def _cfg(**kw) -> WeightSyncConfig:
    return WeightSyncConfig(**{"chunk_bytes": 64 << 10, "bucket_bytes": 256 << 10, "chunk_timeout_s": 5, **kw})


def _sd(version: int) -> dict[str, torch.Tensor]:
    return synthetic_weights(SIZE, version=version, seed=3, change_frac=0.01)


@pytest.fixture
def make():
    t = InprocTransport(secret=b"job")
    made: list[WeightNode] = []

    def node(**kw) -> WeightNode:
        made.append(WeightNode(t, "inproc://", _cfg(**kw)))
        return made[-1]

    yield node
    for n in made:
        n.close()


def _exact(node: WeightNode, version: int) -> bool:
    held = node.current()
    assert held is not None and held[0] == version
    want = _sd(version)
    return all(torch.equal(held[1][k], want[k]) for k in want)


def test_default_config_publishes_a_delta_every_version_and_never_an_anchor(make):
    root, a = make(), make()
    assert root.cfg.anchor_every is None
    for v in range(1, 21):
        hv = root.publish(v, _sd(v))
        assert sorted(hv.payloads) == (["full"] if v == 1 else ["delta", "full"])
        assert not hv.anchor
        got = a.fetch(v, [root.address])
        assert got.received_encoding == ("full" if v == 1 else "delta") and _exact(a, v)
        assert got.received_base == (None if v == 1 else v - 1)
    assert [s.encoding for s in root.served] == ["full"] + ["delta"] * 19


def test_a_receiver_that_skipped_versions_gets_a_delta_against_its_held_base(make, monkeypatch):
    encodes: list[int] = []
    real_encode = delta.encode

    def counting_encode(prev, new, *, base_version, **kw):
        encodes.append(base_version)
        return real_encode(prev, new, base_version=base_version, **kw)

    monkeypatch.setattr(delta, "encode", counting_encode)
    root, a, b = make(keep_versions=3), make(), make()
    root.publish(1, _sd(1))
    a.fetch(1, [root.address])
    b.fetch(1, [root.address])
    root.publish(2, _sd(2))
    root.publish(3, _sd(3))
    assert encodes == [1, 2]  # publish: v2 vs v1, v3 vs v2
    got = a.fetch(3, [root.address])  # a skipped v2; the root still holds v1 (keep_versions=3)
    assert got.received_encoding == "delta" and got.payloads["delta"].base_version == 1 and _exact(a, 3)
    assert got.received_base == 1  # what the unit reports with `weights_applied`
    assert got.received_bytes == got.payloads["delta"].data.numel() < SIZE // 10
    b.fetch(3, [root.address])  # same base: the cached on-demand delta, not a second encode
    assert encodes == [1, 2, 1] and _exact(b, 3)
    assert [(s.version, s.encoding, s.base_version, s.child) for s in root.served][-2:] == [
        (3, "delta", 1, a.address),
        (3, "delta", 1, b.address),
    ]


def test_a_receiver_whose_base_is_no_longer_held_gets_the_full_version(make):
    root, a = make(), make()  # keep_versions=2: publishing v3 drops v1
    root.publish(1, _sd(1))
    a.fetch(1, [root.address])
    root.publish(2, _sd(2))
    root.publish(3, _sd(3))
    assert sorted(root.store.versions) == [2, 3]
    got = a.fetch(3, [root.address])
    assert got.received_encoding == "full" and got.received_bytes == got.weights.numel() and _exact(a, 3)
    assert got.received_base is None
    assert root.served[-1] == Served(3, "full", None, a.address, got.weights.numel())


def test_a_relay_serves_an_on_demand_delta_to_a_leaf_that_skipped_a_version(make):
    root, relay, leaf = make(keep_versions=3), make(keep_versions=3), make()
    for v in (1, 2, 3):
        root.publish(v, _sd(v))
        relay.fetch(v, [root.address])
        if v == 1:
            leaf.fetch(1, [relay.address])
    assert relay.store.versions[3].received_encoding == "delta"  # the relay got v3 as a delta vs v2
    got = leaf.fetch(3, [relay.address])
    assert got.received_encoding == "delta" and got.received_base == 1 and _exact(leaf, 3)
    s = relay.served[-1]
    assert (s.version, s.encoding, s.base_version, s.child) == (3, "delta", 1, leaf.address)
    assert s.bytes == got.received_bytes == got.payloads["delta"].data.numel()


def test_a_relay_asked_before_it_completed_the_version_serves_the_delta_once_complete(make):
    """The leaf (at v1) asks the relay for v3 while the relay still receives v3 as a delta vs v2:
    the relay cannot forward that delta, so it finishes v3 and then encodes one vs v1."""
    root, relay, leaf = make(keep_versions=3), make(keep_versions=3, chunk_timeout_s=2), make()
    for v in (1, 2):
        root.publish(v, _sd(v))
        relay.fetch(v, [root.address])
    leaf.fetch(1, [root.address])
    hv3 = root.publish(3, _sd(3))
    d3 = hv3.payloads["delta"]
    held, pl = relay._adopt(d3.manifest(hv3, root.cfg))  # v3's manifest has reached the relay, no chunk yet
    result: list[object] = []
    th = threading.Thread(target=lambda: result.append(leaf.fetch(3, [relay.address])))
    th.start()
    while not relay._conns and th.is_alive():  # the leaf has connected and asked
        with relay.store.cv:
            relay.store.cv.wait(timeout=0.01)
    for i, r in enumerate(pl.refs):  # the chunks arrive
        pl.data[r.offset : r.offset + r.length] = d3.data[r.offset : r.offset + r.length]
        with relay.store.cv:
            pl.have[i] = True
            relay.store.cv.notify_all()
    assert relay._finish(held)
    th.join(timeout=30)
    assert result and _exact(leaf, 3)
    assert leaf.store.current.received_encoding == "delta"
    assert leaf.store.current.payloads["delta"].base_version == 1


def test_many_versions_through_a_relay_with_skips_stay_bit_exact(make):
    root, relay, leaf = make(keep_versions=3), make(keep_versions=3), make()
    got_enc = []
    for v in range(1, 31):
        root.publish(v, _sd(v))
        relay.fetch(v, [root.address])
        assert relay.store.current.weights_xxh3 == root.store.current.weights_xxh3 and _exact(relay, v)
        if v % 3 != 2:  # the leaf skips every third version
            got_enc.append(leaf.fetch(v, [relay.address, root.address]).received_encoding)
            assert _exact(leaf, v)
    assert got_enc[0] == "full" and set(got_enc[1:]) == {"delta"}
    assert all(a[2] == "ok" for a in leaf.attempts)


def test_a_failed_verification_falls_back_to_full_and_both_transfers_are_counted(make):
    root, a = make(), make()
    root.publish(1, _sd(1))
    a.fetch(1, [root.address])
    a.store.current.weights[100] ^= 0xFF  # a's base silently differs from the root's v1
    hv2 = root.publish(2, _sd(2))
    got = a.fetch(2, [root.address])
    assert got.received_encoding == "full" and _exact(a, 2)
    assert got.received_bytes == hv2.payloads["delta"].data.numel() + hv2.weights.numel()
    assert [(s.version, s.encoding, s.bytes) for s in root.served][-2:] == [
        (2, "delta", hv2.payloads["delta"].data.numel()),
        (2, "full", hv2.weights.numel()),
    ]


def test_forced_and_periodic_anchors_still_go_out_in_full(make):
    root, a = make(keep_versions=3), make()
    root.publish(1, _sd(1))
    a.fetch(1, [root.address])
    hv = root.publish(2, _sd(2), anchor=True)  # e.g. after a resume
    assert hv.anchor and sorted(hv.payloads) == ["full"]
    assert a.fetch(2, [root.address]).received_encoding == "full"  # no on-demand delta for an anchor
    root3, b = make(anchor_every=2), make()
    encodings = []
    for v in range(1, 6):
        root3.publish(v, _sd(v))
        encodings.append(b.fetch(v, [root3.address]).received_encoding)
    assert encodings == ["full", "delta", "full", "delta", "full"]


def test_the_served_log_is_bounded(make):
    root, a = make(served_log=3), make()
    for v in range(1, 6):
        root.publish(v, _sd(v))
        a.fetch(v, [root.address])
    assert [s.version for s in root.served] == [3, 4, 5]


def test_anchor_every_validation():
    from pydantic import ValidationError

    from rlctl.config.runtime import WeightSync

    with pytest.raises(ValueError, match="anchor_every must be None or ≥ 1"):
        _cfg(anchor_every=0)
    assert WeightSync().anchor_every is None and WeightSync(anchor_every=4).anchor_every == 4
    with pytest.raises(ValidationError):
        WeightSync(anchor_every=0)


def test_an_on_demand_encode_longer_than_the_childs_timeout_keeps_the_child_attached(make, monkeypatch):
    """The holder says `waiting` while it encodes, so a slow encode is not mistaken for a dead parent.

    The holder says it every 0.25 s (a quarter of its 1 s chunk timeout); the leaf waits 2 s for each word, which
    leaves a loaded machine 1.75 s to run the holder's thread late (at the leaf's 1 s: 0.75 s)."""
    root, leaf = make(keep_versions=3, chunk_timeout_s=1), make(chunk_timeout_s=2)
    root.publish(1, _sd(1))
    leaf.fetch(1, [root.address])
    root.publish(2, _sd(2))
    root.publish(3, _sd(3))
    real_encode = delta.encode

    def slow_encode(prev, new, *, base_version, **kw):
        if base_version == 1:  # the on-demand one: twice the child's chunk timeout
            threading.Event().wait(4.0)
        return real_encode(prev, new, base_version=base_version, **kw)

    monkeypatch.setattr(delta, "encode", slow_encode)
    got = leaf.fetch(3, [root.address])
    assert got.received_encoding == "delta" and _exact(leaf, 3)
    assert [a[2] for a in leaf.attempts] == ["ok", "ok"]  # no timeout, no re-attach
