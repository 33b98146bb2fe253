"""The weight plane seam: how a trainer's new policy version reaches rollout agents.

The trainer holds every version it publishes in a `rlctl.transport.weights.WeightNode` (chunked,
checksummed, full or delta payloads per the job's `weight_sync`); rollout agents are told that a
version exists and pull it from the holders, verify it, and hand it to their main loop, which swaps
it in between engine steps. Everything weight-specific is in the three functions below.

    trainer step v ─▶ WeightPublisher.publish(v, sd) ─queue─▶ publisher thread: node.publish(v, sd)
                          └── weights_available{v, holders} ──▶ rollout i (one connection each)
    rollout reader thread: fetch_weights(node, msg) ── chunks ◀── trainer's node ─▶ inbox: weights(v)
"""

from __future__ import annotations

import logging
import queue
import threading
import time

import torch

from rlctl.agents.messages import make
from rlctl.config.job import WeightSync
from rlctl.errors import TransportError
from rlctl.transport import Connection, Message, Transport
from rlctl.transport.versions import WeightSyncConfig
from rlctl.transport.weights import WeightNode

log = logging.getLogger(__name__)


def weight_node(transport: Transport, listen: str, sync: WeightSync, *, timeout_s: float) -> WeightNode:
    cfg = WeightSyncConfig(
        chunk_bytes=sync.chunk_bytes,
        delta=sync.mode == "delta",
        anchor_every=sync.anchor_every,
        connect_timeout_s=timeout_s,
        chunk_timeout_s=timeout_s,
    )
    return WeightNode(transport, listen, cfg)


def announce(conn: Connection, version: int, holders: list[str]) -> None:
    conn.send(make("weights_available", {"version": version, "holders": holders}))


def fetch_weights(node: WeightNode, msg: Message) -> Message:
    """Pull the announced version into `node` (verified) and wrap it as the rollout loop's `weights` message."""
    t0 = time.monotonic()
    hv = node.fetch(int(msg.header["version"]), list(msg.header["holders"]), newer_ok=True)
    fetch_s = time.monotonic() - t0
    payload = hv.payloads.get("delta") or hv.payloads.get("full")
    wire_bytes = int(payload.data.numel()) if payload is not None else int(hv.weights.numel())
    held = node.current()
    assert held is not None
    version, sd = held
    names = list(sd)
    header = {"version": version, "names": names, "fetch_s": round(fetch_s, 4), "wire_bytes": wire_bytes}
    return make("weights", header, [sd[n].clone() for n in names])


def state_dict_of(msg: Message) -> tuple[int, dict[str, torch.Tensor]]:
    return int(msg.header["version"]), dict(zip(msg.header["names"], msg.tensors, strict=True))


class WeightPublisher:
    """Publishes each version into the trainer's weight node and tells every rollout agent, from one
    background thread so training overlaps the transfer."""

    def __init__(self, transport: Transport, *, listen: str, sync: WeightSync, timeout_s: float) -> None:
        self._transport = transport
        self._timeout_s = timeout_s
        self.node = weight_node(transport, listen, sync, timeout_s=timeout_s)
        self._conns: dict[str, tuple[str, Connection]] = {}
        self._targets: dict[str, str] = {}
        self._latest: tuple[int, dict[str, torch.Tensor]] | None = None
        self._held = -1
        self._told: dict[str, int] = {}
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._lock = threading.Lock()
        self.publish_s = 0.0
        self._thread = threading.Thread(target=self._run, name="weights-publisher", daemon=True)
        self._thread.start()

    def set_targets(self, targets: dict[str, str]) -> None:
        """Rollout agents changed (joined / lost); newcomers are told about the latest version."""
        with self._lock:
            self._targets = dict(targets)
        self._queue.put(0)

    def publish(self, version: int, state_dict: dict[str, torch.Tensor]) -> None:
        with self._lock:
            self._latest = (version, {k: v.detach().clone() for k, v in state_dict.items()})
        self._queue.put(version)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)
        for _, conn in self._conns.values():
            conn.close()
        self.node.close()

    def _run(self) -> None:
        while self._queue.get() is not None:
            with self._lock:
                latest, targets = self._latest, dict(self._targets)
            if latest is None:
                continue
            version, sd = latest
            if version > self._held:
                t0 = time.monotonic()
                self.node.publish(version, sd)
                self._held = version
                self.publish_s += time.monotonic() - t0
            for name, address in targets.items():
                if self._told.get(name, -1) >= version:
                    continue
                try:
                    announce(self._connection(name, address), version, [self.node.address])
                except TransportError as e:  # that agent is gone; the controller notices it too
                    log.warning("weights v%d: cannot tell %s: %s", version, name, e)
                    self._conns.pop(name, None)
                    continue
                self._told[name] = version

    def _connection(self, name: str, address: str) -> Connection:
        held = self._conns.get(name)
        if held is not None and held[0] == address:
            return held[1]
        conn = self._transport.connect(address, timeout_s=self._timeout_s)
        self._conns[name] = (address, conn)
        return conn
