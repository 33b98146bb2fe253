"""A fetch that every holder refuses for good (this node's credentials, a manifest it cannot hold, a subscribe the
parent cannot read) fails at once, naming the parent and why; a holder that is gone, restarting or behind is tried
again as before. Real loopback sockets (TCP): the refusal of credentials is the handshake's verdict."""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from unittest import mock

import pytest
import torch

from rlctl.agents.rollout import RolloutAgent
from rlctl.errors import TransportError
from rlctl.transport import Message, TcpTransport
from rlctl.weights.node import WeightNode
from rlctl.weights.versions import WeightSyncConfig

SECRET = b"the-jobs-secret"
CFG = WeightSyncConfig(chunk_bytes=1024, bucket_bytes=4096, connect_timeout_s=2.0, chunk_timeout_s=2.0)
# the fetching nodes' bounds: every answer here comes at once, or at the holder's pace (a holder behind answers
# `does not hold` at 0.8 × its chunk timeout, 1.6 s), so a fetcher waiting as long as the holders (2 s) had 0.4 s for a
# loaded machine to run the holder's thread late, and a late answer read as a timeout, not the holder's word
FETCH = replace(CFG, connect_timeout_s=30.0, chunk_timeout_s=30.0)
NEVER = "which no retry changes"  # how a final refusal reads


def _weights() -> dict[str, torch.Tensor]:
    return {"w": torch.arange(1000, dtype=torch.float32)}


@pytest.fixture
def roots() -> Iterator[list[WeightNode]]:
    """Two trainer roots of the job, holding v1."""
    made = [WeightNode(TcpTransport(secret=SECRET), "tcp://127.0.0.1:0", CFG) for _ in range(2)]
    for root in made:
        root.publish(1, _weights())
    yield made
    for root in made:
        root.close()


def _dead_address() -> str:
    """A loopback port nobody listens on (connection refused): a holder that is gone, or restarting."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def test_a_node_without_the_jobs_secret_fails_its_fetch_at_once_naming_the_parent(roots: list[WeightNode]) -> None:
    holders = [r.address for r in roots]
    with WeightNode(TcpTransport(secret=b"another-secret"), "tcp://127.0.0.1:0", FETCH) as node:
        with pytest.raises(TransportError) as e:
            node.fetch(1, holders)
        assert len(node.attempts) == len(holders), node.attempts  # one pass: not attach_passes of them
    line = str(e.value)
    assert line.startswith(f"v1: the parent refused this node, {NEVER} (and the 1 other holder(s) likewise): "), line
    assert f"{holders[0]}: refused our credentials" in line and "\n" not in line, line


def test_a_manifest_over_the_nodes_size_bound_fails_the_fetch_for_good(roots: list[WeightNode]) -> None:
    small = replace(FETCH, max_weights_bytes=1000)
    with WeightNode(TcpTransport(secret=SECRET), "tcp://127.0.0.1:0", small) as node:
        with pytest.raises(TransportError) as e:
            node.fetch(1, [roots[0].address])
        assert len(node.attempts) == 1, node.attempts
    assert NEVER in str(e.value) and f"{roots[0].address}: manifest of v1: " in str(e.value)
    assert str(e.value).endswith("bytes exceed 1000"), e.value


def test_a_subscribe_the_parent_cannot_read_is_refused_in_so_many_words(roots: list[WeightNode]) -> None:
    """A child of another protocol (its subscribe does not type here) hears why, rather than a closed connection."""
    conn = TcpTransport(secret=SECRET).connect(roots[0].address, timeout_s=5)
    try:
        conn.send(Message("subscribe", {"version": "latest"}))
        reply = conn.recv(timeout_s=5)
    finally:
        conn.close()
    assert reply.kind == "error" and reply.header["refused"] is True, reply
    assert reply.header["error"].startswith(f"{roots[0].address} refused: "), reply.header


def test_transient_failures_are_not_final(roots: list[WeightNode]) -> None:
    """A refusing holder beside a live one: the live one delivers. Beside a dead one (it may come back): every pass
    is tried and the fetch fails as before, not for good."""
    refusing = WeightNode(TcpTransport(secret=b"another-secret"), "tcp://127.0.0.1:0", CFG)
    refusing.publish(1, _weights())
    try:
        with WeightNode(TcpTransport(secret=SECRET), "tcp://127.0.0.1:0", FETCH) as node:
            assert node.fetch(1, [refusing.address, roots[0].address]).version == 1
        with WeightNode(TcpTransport(secret=SECRET), "tcp://127.0.0.1:0", FETCH) as node:
            holders = [refusing.address, _dead_address()]
            with pytest.raises(TransportError) as e:
                node.fetch(1, holders)
            assert len(node.attempts) == CFG.attach_passes * len(holders), node.attempts
        assert NEVER not in str(e.value) and str(e.value).startswith("v1: no holder could deliver it"), e.value
    finally:
        refusing.close()


def test_a_holder_that_is_behind_is_not_a_final_refusal() -> None:
    """A relay that does not hold the version yet says so (`error`, no `refused`): tried again, never final."""
    with (
        WeightNode(TcpTransport(secret=SECRET), "tcp://127.0.0.1:0", CFG) as behind,
        WeightNode(TcpTransport(secret=SECRET), "tcp://127.0.0.1:0", FETCH) as node,
    ):
        behind.publish(1, _weights())
        with pytest.raises(TransportError) as e:
            node.fetch(2, [behind.address])
        assert len(node.attempts) == CFG.attach_passes, node.attempts
    assert NEVER not in str(e.value) and "does not hold v2" in str(e.value), e.value


def _fetcher(node: WeightNode) -> RolloutAgent:
    """A rollout unit reduced to what its fetch thread uses (no engine, no controller)."""
    agent = RolloutAgent.__new__(RolloutAgent)
    agent.name, agent.node, agent.inbox = "rollout-0", node, queue.Queue()
    agent.announced, agent.announced_cv, agent.fetching = [], threading.Condition(), True
    return agent


def test_a_rollout_unit_every_holder_refuses_stops_fetching_and_ends_with_that_line(roots: list[WeightNode]) -> None:
    """Its fetch thread hands the main loop one message naming the parent and why, and ends (it retried every
    FETCH_RETRY_S for ever); the main loop ends the unit with that line (exit 1)."""
    with WeightNode(TcpTransport(secret=b"another-secret"), "tcp://127.0.0.1:0", FETCH) as node:
        agent = _fetcher(node)
        holders = [r.address for r in roots]
        agent.announced.append(Message("weights_available", {"version": 1, "holders": holders}))
        fetch = threading.Thread(target=agent._fetch_newest, daemon=True)
        fetch.start()
        try:
            msg = agent.inbox.get(timeout=30)
        except queue.Empty:
            pytest.fail(f"no word from the fetch thread; it retried: {list(node.attempts)}")
        finally:
            with agent.announced_cv:
                agent.fetching = False
                agent.announced_cv.notify_all()
        fetch.join(timeout=30)
        assert not fetch.is_alive()
    assert msg.kind == "weights_refused", msg
    line = msg.header["error"]
    assert line.startswith("rollout-0: fetching weights: v1: the parent refused this node"), line
    assert f"{holders[0]}: refused our credentials" in line, line


def test_the_main_loop_ends_the_unit_with_the_refusal_line() -> None:
    """The fetch thread's `weights_refused` ends the unit: its parts closed, state "failed", the line raised (the
    agent's entry point logs it and exits 1)."""
    agent = _fetcher(mock.MagicMock())
    agent.engine, agent.watchdog, agent.link = mock.MagicMock(), mock.MagicMock(), mock.MagicMock()
    agent.listener, agent.flight, agent.samples_sent, agent.busy_s = mock.MagicMock(), mock.MagicMock(), 0, 0.0
    agent.engine.has_work.return_value = False
    agent.inbox.put(Message("weights_refused", {"error": "rollout-0: fetching weights: v1: the parent refused"}))
    with pytest.raises(TransportError) as e:
        agent.run()
    assert str(e.value) == "rollout-0: fetching weights: v1: the parent refused"
    assert agent.state == "failed" and not agent.fetching
    agent.node.close.assert_called_once()
