"""The weight plane seam: how a trainer's new policy version reaches rollout agents, along the
broadcast plan (StreamRL §6 "Weights transmission").

Every trainer rank holds the versions it publishes in a `rlctl.weights.node.WeightNode` (chunked,
checksummed, full or delta payloads per the job's `weight_sync`) and is a root of the broadcast; every
rollout unit holds one too and serves the versions it has to the units below it. For each version,
rank 0 plans the tree (`rlctl.weights.plan.plan_broadcast`) over the live units and their
datacenters, and tells each unit whom to pull from: its planned parent first, then its fallbacks.

    trainer step v ─▶ WeightPublisher.publish(v, sd) ─queue─▶ publisher thread: node.publish(v, sd)
       plan(v): roots = trainer ranks, receivers = rollout units (in the last plan's order, see below)
                          └── weights_available{v, holders=[parent, fallbacks…]} ──▶ rollout i
    rollout fetch thread: fetch_weights(node, msg) ◀── chunks ── parent's node (a relay forwards chunk k
                          while k+1 arrives) ─▶ inbox: weights(v) ─▶ swapped in between engine steps

    DC-A: trainer-0 ─▶ rollout-0 ─▶ …           one copy per inter-DC link:
          trainer-0 ══════════════▶ DC-B: rollout-2 (relay) ─▶ rollout-3 ─▶ rollout-4 (chain by host)

A unit whose parent dies re-attaches to the next holder of its list; a version is applied only once
every chunk and the rebuilt weights are verified (WeightNode.fetch).

Relays are stable: each plan keeps the previous plan's order of units (`receiver_order`), and the first
unit of a datacenter is its relay. A unit that joins (`rlctl scale`, the rebalance rule) goes below the
units of its datacenter — right after its host's units, else at the end — so while a version is in
flight it pulls from units that hold or fetch it, and no second copy crosses the inter-DC link; a lost
relay is replaced by the next unit of its datacenter (its children re-attach along their fallbacks).

    units b0 b1 on host h1, b2 on h2:   trainer ══▶ b0 ─▶ b1 ─▶ b2
    + b3 on h1, b4 on h0 (sorts first): trainer ══▶ b0 ─▶ b1 ─▶ b3 ─▶ b2 ─▶ b4   (b0 stays the relay)
    − b0 (lost):                        trainer ══▶ b1 ─▶ b3 ─▶ b2 ─▶ b4

Every root holds the whole version, so any root can stand in for a lost parent. Disjoint tensor subsets
per root would not fit: a version is one flat buffer under one xxh3, one manifest and one delta base,
and `weights_available` names holders of all of it; a unit would need one node (or part id) per root,
a holder list per part, and the same version for every part (`newer_ok` could mix them). What the ranks
split is the delta *encoding*, the costly part of publishing (rlctl.weights.delta_parts):

    rank r: encode_part(prev, new, r of P) ─all-gather over the trainer's weights group─▶ every frame
            assemble(frames) ─▶ the same delta payload on every root ─▶ node.publish(v, sd, encode=…)

For that every rank encodes every version, in order (`group`: no coalescing of versions, at most
`SPLIT_QUEUE` waiting, then `publish` blocks the trainer); if the group fails, this rank encodes alone
from then on (a root's delta need not be byte-equal to another's: units verify the rebuilt weights).
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import torch
import torch.distributed as dist

from rlctl.agents.messages import make
from rlctl.config.job import WeightSync
from rlctl.errors import PlanError, TransportError
from rlctl.transport import Connection, Message, Transport
from rlctl.weights import chunks, delta
from rlctl.weights.delta_parts import assemble, encode_part, part_range
from rlctl.weights.node import WeightNode
from rlctl.weights.plan import BroadcastPlan, Endpoint, plan_broadcast
from rlctl.weights.versions import WeightSyncConfig

log = logging.getLogger(__name__)

SPLIT_QUEUE = 2  # versions waiting for the split encoding before `publish` blocks
# delta mode: complete versions a node keeps, so a unit one version behind (it skipped one) still gets
# an on-demand delta against its base rather than a full copy. Each is a host-memory copy of the
# weights; full mode never encodes deltas, so there the third copy would buy nothing and it keeps 2.
DELTA_KEEP_VERSIONS = 3


@dataclass(frozen=True)
class Target:
    """A rollout unit as the weight plane sees it."""

    address: str  # where it hears `weights_available`
    weights: str  # its weight node: what the units below it pull from
    datacenter: str = ""


def weight_node(transport: Transport, listen: str, sync: WeightSync, *, timeout_s: float) -> WeightNode:
    cfg = WeightSyncConfig(
        chunk_bytes=sync.chunk_bytes,
        delta=sync.mode == "delta",
        anchor_every=sync.anchor_every,
        connect_timeout_s=timeout_s,
        chunk_timeout_s=timeout_s,
        keep_versions=DELTA_KEEP_VERSIONS if sync.mode == "delta" else 2,
    )
    return WeightNode(transport, listen, cfg)


def announce(conn: Connection, version: int, holders: list[str]) -> None:
    conn.send(make("weights_available", {"version": version, "holders": holders}))


def host_of(address: str) -> str:
    return urlsplit(address).hostname or address


def natural_key(text: str) -> tuple[int | str, ...]:
    """Sort key under which runs of digits compare as numbers: "rollout-2" < "rollout-10"."""
    # split on a captured group: text and digit runs alternate, so equal positions hold equal types
    return tuple(int(p) if i % 2 else p for i, p in enumerate(re.split(r"(\d+)", text)))


def receiver_order(targets: dict[str, Target], previous: list[str]) -> list[str]:
    """The units in plan order: those of `previous` (the last plan's order) keep it; each newcomer, in
    (datacenter, host, name) order, goes right after the last unit on its host in its datacenter, else
    after its datacenter's last unit, else at the end. With no previous plan this is (datacenter, host,
    name) order, so that a chain visits each host's units together and one copy reaches each host."""

    def key(name: str) -> tuple[tuple[int | str, ...], ...]:
        t = targets[name]
        return natural_key(t.datacenter), natural_key(host_of(t.weights)), natural_key(name)

    order = [n for n in previous if n in targets]
    for name in sorted((n for n in targets if n not in order), key=key):
        dc, host = targets[name].datacenter, host_of(targets[name].weights)
        same_dc = [i for i, n in enumerate(order) if targets[n].datacenter == dc]
        same_host = [i for i in same_dc if host_of(targets[order[i]].weights) == host]
        below = same_host or same_dc
        order.insert(below[-1] + 1 if below else len(order), name)
    return order


def plan_version(
    roots: list[str],
    datacenter: str,
    targets: dict[str, Target],
    *,
    previous: BroadcastPlan | None = None,
    dc_links: set[frozenset[str]] | None = None,
    fanout: int = 1,
) -> BroadcastPlan:
    """The broadcast tree of one version: `roots` are the trainer ranks' weight nodes (in `datacenter`).

    Units are planned in `receiver_order` after `previous` (the plan of the version before), so the
    first unit of a datacenter, its relay, stays the relay while it lives. `dc_links`: the inter-DC links
    between datacenters (None = every pair linked)."""
    names = receiver_order(targets, [e.name for e in previous.receivers] if previous is not None else [])
    receivers = [Endpoint(n, targets[n].datacenter, targets[n].weights) for n in names]
    root_eps = [Endpoint(f"trainer-{i}", datacenter, a) for i, a in enumerate(roots)]
    return plan_broadcast(root_eps, receivers, dc_links=dc_links, fanout=fanout)


def holders_for(plan: BroadcastPlan, name: str) -> list[str]:
    """Weight-node addresses `name` pulls from, best first: planned parent, fallbacks, then the roots."""
    names = [plan.parent[name], *plan.fallbacks[name], *(r.name for r in plan.roots)]
    return list(dict.fromkeys(plan.endpoint(n).address for n in names))


def fetch_weights(node: WeightNode, msg: Message) -> Message:
    """Pull the announced version into `node` (verified) and wrap it as the rollout loop's `weights` message,
    with where it came from, what crossed the wire (for the controller's per-version figures) and the xxh3 of
    the bytes the engine gets (the trainer logs the one it published: the faults suite compares them)."""
    t0 = time.monotonic()
    hv = node.fetch(int(msg.header["version"]), list(msg.header["holders"]), newer_ok=True)
    fetch_s = time.monotonic() - t0
    encoding, wire_bytes = hv.received_encoding, hv.received_bytes
    holder = next((a for v, a, r in reversed(node.attempts) if v == hv.version and r == "ok"), "")
    held = node.store.current
    assert held is not None
    sd = chunks.unflatten(held.weights, held.layout)
    names = list(sd)
    tensors = [sd[n].clone() for n in names]
    header = {
        "version": held.version,
        "names": names,
        "fetch_s": round(fetch_s, 4),
        "wire_bytes": wire_bytes,
        "encoding": encoding,
        "base_version": hv.received_base if encoding == "delta" else None,
        "holder": holder,
        "xxh3": f"{chunks.checksum(held.weights):016x}",
    }
    return make("weights", header, tensors)


def state_dict_of(msg: Message) -> tuple[int, dict[str, torch.Tensor]]:
    return int(msg.header["version"]), dict(zip(msg.header["names"], msg.tensors, strict=True))


class WeightPublisher:
    """Publishes each version into this trainer rank's weight node; on rank 0 it also plans the broadcast
    and tells every rollout unit whom to pull from — from one background thread, so training overlaps
    the transfer. Other ranks' nodes are extra roots (`set_roots`).

    `group`: the trainer ranks' own process group (every rank passes one, made for this), over which
    delta encoding is split (see the module docstring); None, or a group of one, encodes here alone."""

    def __init__(
        self,
        transport: Transport,
        *,
        listen: str,
        sync: WeightSync,
        timeout_s: float,
        fanout: int = 1,
        group: Any = None,
    ) -> None:
        self._transport = transport
        self._timeout_s = timeout_s
        self._fanout = fanout
        self.node = weight_node(transport, listen, sync, timeout_s=timeout_s)
        self._roots = [self.node.address]
        self._datacenter = ""
        self._dc_links: set[frozenset[str]] | None = None
        self._conns: dict[str, tuple[str, Connection]] = {}
        self._targets: dict[str, Target] = {}
        self._latest: tuple[int, dict[str, torch.Tensor]] | None = None
        self._held = -1
        self._told: dict[str, int] = {}
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._lock = threading.Lock()
        self.publish_s = 0.0
        self.encoded_bytes = 0  # bytes of XOR stream this rank compressed (its share, when split)
        self.plan: BroadcastPlan | None = None  # the newest version's plan (for logs and tests)
        split = group is not None and sync.mode == "delta" and dist.get_world_size(group) > 1
        self._group = group if split else None
        self._level = self.node.cfg.delta_level
        self._ordered: queue.Queue[tuple[int, dict[str, torch.Tensor]]] = queue.Queue(maxsize=SPLIT_QUEUE)
        self._thread = threading.Thread(target=self._run, name="weights-publisher", daemon=True)
        self._thread.start()

    def set_roots(self, addresses: list[str]) -> None:
        """Every trainer rank's weight node, rank 0 first (each rank publishes the same versions)."""
        with self._lock:
            self._roots = list(addresses)

    def set_targets(
        self, targets: dict[str, Target], *, datacenter: str = "", dc_links: set[frozenset[str]] | None = None
    ) -> None:
        """Rollout units changed (joined / lost); newcomers are told about the latest version.
        `datacenter`: the trainer's; `dc_links`: the inter-DC links (None = every pair of datacenters)."""
        with self._lock:
            self._targets = dict(targets)
            self._datacenter = datacenter
            self._dc_links = dc_links
        self._queue.put(0)

    def publish(self, version: int, state_dict: dict[str, torch.Tensor]) -> None:
        """Hold and announce `version`. The tensors are this publisher's from now on: pass a snapshot (the
        trainer's `wire_weights`), not the parameters the next optimizer step changes."""
        latest = (version, dict(state_dict))
        if self._group is not None:
            self._ordered.put(latest)  # every version, in order (blocks when the encoding lags)
        with self._lock:
            self._latest = latest
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
                latest, targets, roots = self._latest, dict(self._targets), list(self._roots)
                dc, links = self._datacenter, self._dc_links
            if latest is None:
                continue
            while self._group is not None and not self._ordered.empty():
                self._hold(*self._ordered.get())
            version, sd = latest
            self._hold(version, sd)
            todo = {n: t for n, t in targets.items() if self._told.get(n, -1) < version}
            if not todo:
                continue
            # after the last plan: relays stay, newcomers go below units that hold or fetch `version`
            try:
                plan = plan_version(roots, dc, targets, previous=self.plan, dc_links=links, fanout=self._fanout)
            except PlanError as e:  # the inventory's links leave a datacenter unreached: route as if all linked
                if links is not None:
                    log.warning("weights v%d: %s; planning as if every pair of datacenters were linked", version, e)
                    with self._lock:
                        self._dc_links = links = None
                plan = plan_version(roots, dc, targets, previous=self.plan, dc_links=None, fanout=self._fanout)
            self.plan = plan
            for name in plan.order:  # parents before children: relays start first
                if name not in todo:
                    continue
                try:
                    announce(self._connection(name, todo[name].address), version, holders_for(plan, name))
                except TransportError as e:  # that agent is gone; the controller notices it too
                    log.warning("weights v%d: cannot tell %s: %s", version, name, e)
                    self._conns.pop(name, None)
                    continue
                self._told[name] = version

    def _hold(self, version: int, sd: dict[str, torch.Tensor]) -> None:
        if version <= self._held:
            return
        t0 = time.monotonic()
        hv = self.node.publish(version, sd, encode=self._split_encode if self._group is not None else self._encode)
        self._held = version
        self.publish_s += time.monotonic() - t0
        log.info("weights v%d published: %d bytes, xxh3 %016x", version, hv.layout.total_bytes, hv.weights_xxh3)

    def _encode(self, prev: torch.Tensor, new: torch.Tensor, base_version: int) -> torch.Tensor:
        self.encoded_bytes += new.numel()
        return delta.encode(prev, new, base_version=base_version, level=self._level)

    def _split_encode(self, prev: torch.Tensor, new: torch.Tensor, base_version: int) -> torch.Tensor:
        """This rank's frame of the delta, every rank's frames gathered, the whole delta assembled."""
        rank, parts = dist.get_rank(self._group), dist.get_world_size(self._group)
        try:
            mine = encode_part(prev, new, part=rank, parts=parts, level=self._level)
            frames: list[Any] = [None] * parts
            dist.all_gather_object(frames, (base_version, mine), group=self._group)
        except Exception as e:  # noqa: BLE001 - a broken group must not stop publication
            log.warning("weights v%d: split delta encoding failed, encoding alone from now on: %s", base_version + 1, e)
            self._group = None
            return self._encode(prev, new, base_version)
        lo, hi = part_range(new.numel(), part=rank, parts=parts)
        self.encoded_bytes += hi - lo
        if any(base != base_version for base, _ in frames):  # the ranks disagree on what they encode
            log.warning("weights: ranks encoded deltas from different bases; encoding alone from now on")
            self._group = None
            return self._encode(prev, new, base_version)
        payload = assemble([f for _, f in frames], new=new, base_version=base_version)
        log.info(
            "weights: delta vs v%d encoded by %d ranks (this one: %d of %d bytes)",
            base_version,
            parts,
            hi - lo,
            new.numel(),
        )
        return payload

    def _connection(self, name: str, address: str) -> Connection:
        held = self._conns.get(name)
        if held is not None and held[0] == address:
            return held[1]
        conn = self._transport.connect(address, timeout_s=self._timeout_s)
        self._conns[name] = (address, conn)
        return conn
