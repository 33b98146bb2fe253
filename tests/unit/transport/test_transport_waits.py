"""Every wait of the weight plane on a peer is bounded and says whom it waited for and what for: a holder that
takes the subscribe and never answers, a child that takes every chunk and never confirms."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch

from rlctl.errors import TransportError
from rlctl.transport import InprocTransport, Message
from rlctl.weights.node import WeightNode
from rlctl.weights.versions import WeightSyncConfig

QUICK = WeightSyncConfig(
    chunk_bytes=1024, bucket_bytes=4096, connect_timeout_s=1.0, chunk_timeout_s=0.3, attach_passes=1
)


def weights() -> dict[str, torch.Tensor]:
    return {"w": torch.arange(1000, dtype=torch.float32)}


def test_a_holder_that_never_answers_ends_the_fetch_naming_it_and_what_was_awaited() -> None:
    t = InprocTransport(secret=b"job")
    silent = t.listen("inproc://")
    held: list[object] = []

    def accept() -> None:
        conn = silent.accept(timeout_s=5)
        held.append(conn.recv(timeout_s=5))  # the subscribe; then nothing

    holder = threading.Thread(target=accept, daemon=True)
    holder.start()
    with WeightNode(t, "inproc://", QUICK) as node, pytest.raises(TransportError) as e:
        node.fetch(1, [silent.address])
    assert silent.address in str(e.value) and "waiting for the manifest of v1" in str(e.value)
    holder.join(timeout=10)  # a loaded machine may run it after the fetch gave up: the subscribe waits queued
    assert [getattr(m, "kind", None) for m in held] == ["subscribe"]
    silent.close()


def test_a_child_that_never_confirms_does_not_hold_its_server_thread(caplog: pytest.LogCaptureFixture) -> None:
    t = InprocTransport(secret=b"job")
    with WeightNode(t, "inproc://", QUICK) as root, caplog.at_level(logging.WARNING):
        root.publish(1, weights())
        child = t.connect(root.address, timeout_s=5)
        child.send(Message("subscribe", {"version": 1, "from": "inproc://child"}))
        manifest = child.recv(timeout_s=5)
        assert manifest.kind == "manifest"
        for _ in manifest.header["sums"]:
            assert child.recv(timeout_s=5).kind == "chunk"
        deadline = time.monotonic() + 10  # …and it never says `complete`, nor leaves
        while root._conns and time.monotonic() < deadline:  # the server lets it go after chunk_timeout_s
            time.sleep(0.05)
        assert not root._conns
        said = [r.getMessage() for r in caplog.records if "did not confirm" in r.getMessage()]
        assert said == ["child inproc://child did not confirm v1 within 0.3 s of its last chunk; closing"], said
        child.close()
