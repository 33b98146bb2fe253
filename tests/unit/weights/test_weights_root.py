"""A trainer rank's root node: one host buffer updated in place, deltas from older bases composed, full streams
never torn by an update."""

from __future__ import annotations

import itertools
import threading

import pytest
import torch

import rlctl.weights.root as rootmod
from bench.netem.bcast_agent import synthetic_weights
from rlctl.transport import InprocTransport
from rlctl.weights import chunks, delta
from rlctl.weights.node import WeightNode
from rlctl.weights.root import RootNode
from rlctl.weights.versions import WeightSyncConfig

CFG = WeightSyncConfig(chunk_bytes=64 << 10, bucket_bytes=256 << 10, chunk_timeout_s=5, keep_versions=3)
SIZE = 1 << 20


def sd(version: int) -> dict[str, torch.Tensor]:
    return synthetic_weights(SIZE, version=version, seed=3, change_frac=0.01)


@pytest.fixture
def pair():
    t = InprocTransport(secret=b"job")
    root, child = RootNode(t, "inproc://", CFG), WeightNode(t, "inproc://", CFG)
    yield root, child
    root.close()
    child.close()


def test_one_buffer_holds_the_newest_version(pair) -> None:
    root, child = pair
    first = root.publish(1, sd(1))
    storage = first.weights.data_ptr()
    for v in (2, 3, 4):
        hv = root.publish(v, sd(v))
        assert hv.weights.data_ptr() == storage and sorted(hv.payloads) == ["delta", "full"]
        assert list(root.store.versions) == [v]  # the older versions live on as deltas only
    model = chunks.layout_of(sd(4)).total_bytes
    # steady: the buffer and the deltas; at a publication from a state dict: the caller's snapshot and its flat
    # copy besides (the trainer publishes deltas encoded on its device instead: test_weights_encoder.py)
    assert root.host_bytes() < 1.25 * model and root.peak_host_bytes < 3.1 * model
    got = child.fetch(4, [root.address])  # a joiner: the buffer itself, in full
    assert got.received_encoding == "full" and torch.equal(got.weights, root.store.current.weights)


def test_a_child_that_skipped_versions_gets_a_composed_delta(pair) -> None:
    root, child = pair
    root.publish(1, sd(1))
    child.fetch(1, [root.address])
    for v in (2, 3, 4):
        root.publish(v, sd(v))
    got = child.fetch(4, [root.address])  # base v1: deltas 1→2, 2→3, 3→4 composed into one
    assert (got.received_encoding, got.received_base) == ("delta", 1)
    flat = chunks.flatten(sd(4), chunks.layout_of(sd(4)))
    assert torch.equal(got.weights, flat)
    one = root.store.current.deltas_by_base[1].data
    assert one.numel() < sum(d.data.numel() for _, d in root._chain)  # overlapping changes XOR once


def test_a_composed_delta_no_smaller_than_the_version_is_not_sent(pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deltas each smaller than the version can compose into one that is not (dense changes that do not overlap):
    the child takes the version in full, as it does where a published delta has no gain."""
    root, child = pair
    root.publish(1, sd(1))
    child.fetch(1, [root.address])
    for v in (2, 3):
        root.publish(v, sd(v))
    full = root.store.current.weights.numel()
    monkeypatch.setattr(rootmod.delta, "compose", lambda parts: torch.zeros(full, dtype=torch.uint8))
    got = child.fetch(3, [root.address])
    assert got.received_encoding == "full" and torch.equal(got.weights, root.store.current.weights)
    assert 1 not in root.store.current.deltas_by_base


def test_a_delta_encoded_on_the_trainers_device_is_applied_in_place(pair) -> None:
    """The GPU path: the trainer encodes against its own copy of the last version; the root applies the delta to
    its buffer, sets the target checksum, and children verify against it."""
    root, child = pair
    layout = chunks.layout_of(sd(1))
    root.publish(1, sd(1))
    child.fetch(1, [root.address])
    prev, new = chunks.flatten(sd(1), layout), chunks.flatten(sd(2), layout)
    payload = delta.encode(prev, new, base_version=1, target_xxh3=0)  # the trainer cannot hash what it has not
    hv = root.publish(2, delta_payload=payload)
    assert torch.equal(hv.weights, new) and hv.weights_xxh3 == chunks.checksum(new)
    got = child.fetch(2, [root.address])
    assert got.received_encoding == "delta" and torch.equal(got.weights, new)


def test_an_update_waits_for_a_full_stream_of_the_buffer(pair) -> None:
    root, _ = pair
    hv = root.publish(1, sd(1))
    before = hv.weights.clone()
    with root._serving(hv, hv.payloads["full"]) as held:  # a joiner streaming the buffer
        assert held
        t = threading.Thread(target=root.publish, args=(2, sd(2)))
        t.start()
        t.join(timeout=0.3)
        assert t.is_alive() and torch.equal(hv.weights, before)  # blocked: the stream reads version 1 throughout
    t.join(timeout=10)
    assert not t.is_alive() and root.store.current.version == 2
    with root._serving(hv, hv.payloads["full"]) as held:  # the old version's buffer has moved on
        assert not held


def test_composing_deltas_equals_applying_them_in_turn() -> None:
    g = torch.Generator().manual_seed(0)
    versions = [torch.randint(0, 256, (20_000,), dtype=torch.uint8, generator=g)]
    for _ in range(3):
        nxt = versions[-1].clone()
        idx = torch.randint(0, 20_000, (300,), generator=g)
        nxt[idx] ^= torch.randint(1, 256, (300,), dtype=torch.uint8, generator=g)
        versions.append(nxt)
    versions.append(versions[1].clone())  # the last step undoes two: those elements drop out of the composition
    steps = [delta.encode(a, b, base_version=i) for i, (a, b) in enumerate(itertools.pairwise(versions))]
    composed = delta.compose(steps[1:])
    assert delta.base_version_of(composed) == 1
    assert torch.equal(delta.decode(versions[1], composed), versions[-1])
    assert composed.numel() < 100  # versions[1] → … → versions[1]: no change left, only the header


def test_a_full_stream_asked_while_the_buffer_is_rewritten_gets_the_new_version(pair, monkeypatch) -> None:
    """The buffer already holds v2 while `_hold` still checksums it (store.current is v1 until then): a joiner
    asking for v1 meanwhile waits for the write to end and hears v2, never v2's bytes under v1's checksums."""
    root, child = pair
    root.publish(1, sd(1))
    in_window, release, asked = threading.Event(), threading.Event(), threading.Event()
    real_full_payload = rootmod.full_payload

    def paused_full_payload(*args, **kwargs):  # `_hold`, after the buffer was written
        if not in_window.is_set():
            in_window.set()
            assert release.wait(10)
        return real_full_payload(*args, **kwargs)

    real_serving = root._serving

    def serving(hv, pl):  # the joiner's request has reached the buffer's read lock
        asked.set()
        return real_serving(hv, pl)

    monkeypatch.setattr(rootmod, "full_payload", paused_full_payload)
    monkeypatch.setattr(root, "_serving", serving)
    publisher = threading.Thread(target=root.publish, args=(2, sd(2)))
    publisher.start()
    assert in_window.wait(10) and root.store.current.version == 1
    got: list[object] = []
    joiner = threading.Thread(target=lambda: got.append(child.fetch(1, [root.address], newer_ok=True)))
    joiner.start()
    assert asked.wait(10)
    release.set()
    publisher.join(timeout=10)
    joiner.join(timeout=10)
    assert got and child.current()[0] == 2
    assert torch.equal(child.store.current.weights, chunks.flatten(sd(2), chunks.layout_of(sd(2))))
    assert [a[2] for a in child.attempts] == ["ok"]  # no checksum failures, no re-attach
