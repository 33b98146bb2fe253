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

Every root holds the whole version, so any root can stand in for a lost parent. In delta mode a root holds
it in one host buffer updated in place (`rlctl.weights.root.RootNode`): the version's bytes are built and
compared where the trainer computes, and only the changed elements reach the host:

    trainer step v+1 ─ publish_step(v+1, params) ─▶ DeviceEncoder.snapshot: this rank's part of the version,
                                                    on its device, in the wire dtype (a copy, at once)
       publisher thread ─▶ encode vs its previous part (on the device) ─▶ this rank's frame
                         ─all-gather over the trainer's weights group─▶ every frame ─▶ one delta payload
                         ─▶ RootNode.publish(v+1, delta_payload): applied in place to the host buffer

A rank's part is a range of the buffer (whole replicas: part r of P), or the rows of every tensor its FSDP2
shards hold: every rank encodes its own share, and no version is gathered on a device or copied whole to the
host. A full copy (`publish`: the first version, a resume, an anchor) is a host snapshot; it also restarts
the encoder's chain. Every rank processes every version in order (at most `SPLIT_QUEUE` waiting, then
`publish_step` blocks the trainer). In full mode a node keeps two versions (children stream each one whole,
so a buffer changing in place under them would stall the trainer).
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import torch
import torch.distributed as dist

from rlctl.agents.messages import make
from rlctl.checkpoint.trainer import HostPolicy
from rlctl.config.runtime import WeightSync
from rlctl.devices import as_dtensor
from rlctl.errors import PlanError, TransportError
from rlctl.models.hf import TinyGPTConfig
from rlctl.trainers.wire import all_gather_values
from rlctl.transport import Connection, Message, Transport
from rlctl.weights import chunks
from rlctl.weights.delta_parts import assemble
from rlctl.weights.encoder import DeviceEncoder
from rlctl.weights.node import WeightNode
from rlctl.weights.plan import BroadcastPlan, Endpoint, plan_broadcast
from rlctl.weights.root import RootNode
from rlctl.weights.versions import WeightSyncConfig

log = logging.getLogger(__name__)

SPLIT_QUEUE = 2  # versions waiting for their encoding before `publish_step` blocks
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
    """A relay's (a rollout unit's) node, or a full-mode root's."""
    return WeightNode(transport, listen, node_config(sync, timeout_s=timeout_s))


def node_config(sync: WeightSync, *, timeout_s: float) -> WeightSyncConfig:
    return WeightSyncConfig(
        chunk_bytes=sync.chunk_bytes,
        delta=sync.mode == "delta",
        anchor_every=sync.anchor_every,
        connect_timeout_s=timeout_s,
        chunk_timeout_s=timeout_s,
        keep_versions=DELTA_KEEP_VERSIONS if sync.mode == "delta" else 2,
    )


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
    dc_chains: int = 1,
) -> BroadcastPlan:
    """The broadcast tree of one version: `roots` are the trainer ranks' weight nodes (in `datacenter`).

    Units are planned in `receiver_order` after `previous` (the plan of the version before), so the
    first unit of a datacenter, its relay, stays the relay while it lives. `dc_links`: the inter-DC links
    between datacenters (None = every pair linked)."""
    names = receiver_order(targets, [e.name for e in previous.receivers] if previous is not None else [])
    receivers = [Endpoint(n, targets[n].datacenter, targets[n].weights) for n in names]
    root_eps = [Endpoint(f"trainer-{i}", datacenter, a) for i, a in enumerate(roots)]
    return plan_broadcast(root_eps, receivers, dc_links=dc_links, fanout=fanout, dc_chains=dc_chains)


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


class PublishedModel:
    """Version `version` as a trainer rank's weight node holds it, written as an HF checkpoint directory in the
    dtype it was published in: how a trainer whose policy is sharded (FSDP) checkpoints the policy without
    gathering it again (each rank's checkpoint shard holds its fp32 part, rlctl.checkpoint.trainer)."""

    def __init__(self, node: WeightNode, version: int, config: TinyGPTConfig, *, timeout_s: float) -> None:
        self.node, self.version, self.config, self.timeout_s = node, version, config, timeout_s

    def snapshot(self) -> HostPolicy:
        """The version copied out of the node (whose buffer the next version overwrites), once the publisher's
        thread holds it."""
        held = self.node.store.wait_for(self.version, self.timeout_s)  # the publisher thread may be applying it
        if held is None or held.version != self.version:
            raise TransportError(f"checkpoint v{self.version}: the weight node does not hold that version")
        return HostPolicy(chunks.unflatten(held.weights, held.layout), self.config)

    def save_pretrained(self, directory: str | Path, *, tokenizer_from: str | Path | None = None) -> Path:
        return self.snapshot().save_pretrained(directory, tokenizer_from=tokenizer_from)


class WeightPublisher:
    """Publishes each version into this trainer rank's weight node; on rank 0 it also plans the broadcast
    and tells every rollout unit whom to pull from — from one background thread, so training overlaps
    the transfer. Other ranks' nodes are extra roots (`set_roots`).

    `group`: the trainer ranks' own process group (every rank passes one, made for this), over which the
    ranks' delta frames are gathered (see the module docstring); None: this rank encodes every delta alone.
    `holds`: this rank keeps the versions in host memory and serves them (one rank per host, the lowest: its
    node's root); a rank that does not still takes its part in every delta's encoding, and drops the rest."""

    def __init__(
        self,
        transport: Transport,
        *,
        listen: str,
        sync: WeightSync,
        timeout_s: float,
        fanout: int = 1,
        group: Any = None,
        holds: bool = True,
    ) -> None:
        self.holds = holds
        self._transport = transport
        self._timeout_s = timeout_s
        self._fanout = fanout
        self._sync = sync
        self.node: WeightNode = (
            RootNode(transport, listen, node_config(sync, timeout_s=timeout_s))
            if sync.mode == "delta"
            else weight_node(transport, listen, sync, timeout_s=timeout_s)
        )
        self._roots = [self.node.address]
        self._datacenter = ""
        self._dc_links: set[frozenset[str]] | None = None
        self._fell_back = -1  # the last version planned as if every pair of datacenters were linked (logged once)
        self._conns: dict[str, tuple[str, Connection]] = {}
        self._targets: dict[str, Target] = {}
        self._told: dict[str, int] = {}
        self._queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self._slots = threading.BoundedSemaphore(SPLIT_QUEUE)  # versions queued and not yet held
        self._lock = threading.Lock()
        self.publish_s = 0.0
        self.encoded_bytes = 0  # bytes of versions this rank compared for deltas (its part)
        self.plan: BroadcastPlan | None = None  # the newest version's plan (for logs and tests)
        several = group is not None and dist.get_world_size(group) > 1
        self._group = group if several else None
        self._encoder: DeviceEncoder | None = None
        self._last_full = -1
        self._held = -1
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
        self._queue.put(("announce",))

    def publish(
        self, version: int, state_dict: dict[str, torch.Tensor], *, params: Mapping[str, torch.Tensor] | None = None
    ) -> None:
        """Hold and announce `version` as a full copy. The tensors are this publisher's from now on: pass a
        snapshot (the trainer's `wire_weights`), not the parameters the next optimizer step changes. In delta
        mode `params` (the trainer's tensors, on its device) start the chain `publish_step` continues."""
        snapshot = None
        if self._sync.mode == "delta" and params is not None:
            if self._encoder is None:
                self._encoder = self._make_encoder(chunks.layout_of(state_dict), params)
            snapshot = self._encoder.snapshot(params)
        self._slots.acquire()
        self._queue.put(("full", version, dict(state_dict), snapshot))

    def publish_step(self, version: int, params: Mapping[str, torch.Tensor]) -> bool:
        """Delta mode: `version` as a delta from the previous one, this rank's part encoded on the trainer's device
        from `params` (every rank calls it for every version, in order). False where a full copy is due instead
        (no chain yet, full mode, an anchor): call `publish`."""
        every = self._sync.anchor_every
        if self._encoder is None or (every is not None and version - self._last_full >= every):
            return False
        snapshot = self._encoder.snapshot(params)
        self._slots.acquire()  # blocks the trainer when the encoding lags SPLIT_QUEUE versions behind
        self._queue.put(("delta", version, snapshot))
        return True

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)
        for _, conn in self._conns.values():
            conn.close()
        self.node.close()

    def _make_encoder(self, layout: chunks.Layout, params: Mapping[str, torch.Tensor]) -> DeviceEncoder:
        """This rank's part of every version: its FSDP2 shards' rows, else range `rank` of the ranks'."""
        device = next(iter(params.values())).device
        if any(as_dtensor(t) is not None for t in params.values()):
            return DeviceEncoder.for_shards(layout, params, device=device)
        rank, parts = (dist.get_rank(self._group), dist.get_world_size(self._group)) if self._group else (0, 1)
        return DeviceEncoder.for_part(layout, part=rank, parts=parts, device=device)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if item[0] != "announce":
                try:
                    self._hold(item)
                finally:
                    self._slots.release()
            with self._lock:
                targets, roots = dict(self._targets), list(self._roots)
                dc, links = self._datacenter, self._dc_links
            self._forget_gone(targets)
            if self._held >= 0:
                self._announce(self._held, targets, roots, dc, links)

    def _hold(self, item: tuple[Any, ...]) -> None:
        t0 = time.monotonic()
        kind, version = item[0], item[1]
        if kind == "full":
            _, _, sd, snapshot = item
            if self._encoder is not None and snapshot is not None:
                self._encoder.reset(snapshot)
            self._last_full = version
            if not self.holds:
                self._held = version
                return
            hv = self.node.publish(version, sd)
        else:
            assert self._encoder is not None
            frame = self._encoder.encode(item[2], level=self.node.cfg.delta_level)
            self.encoded_bytes += self._encoder.nbytes
            frames = [frame]
            if self._group is not None:  # every rank's frame, in rank order: the same payload on every root
                frames = all_gather_values(bytes(frame), bytes, group=self._group)
                log.info(
                    "weights: v%d's delta encoded by %d ranks (this one: %d of %d bytes%s)",
                    version,
                    len(frames),
                    self._encoder.nbytes,
                    self._encoder.layout.total_bytes,
                    "" if self.holds else "; this host's lowest rank holds the version",
                )
            if not self.holds:  # its part is in the frames every root applies
                self._held = version
                return
            held = self.node.store.current
            assert held is not None and isinstance(self.node, RootNode)
            payload = assemble(frames, raw_len=held.layout.total_bytes, base_version=held.version)
            hv = self.node.publish(version, delta_payload=payload)
        self._held = version
        self.publish_s += time.monotonic() - t0
        log.info(
            "weights v%d published: %d bytes, xxh3 %016x (%s)", version, hv.layout.total_bytes, hv.weights_xxh3, kind
        )

    def _forget_gone(self, targets: dict[str, Target]) -> None:
        """Units no longer among `targets` (lost, scaled in, silent): their connection is closed and what they were
        told forgotten, so that a trainer whose units are replaced for weeks holds its live units' connections (each
        its sockets and a 256 KiB read-ahead, 3 MiB more encrypted), not one for every unit it ever announced to; one
        that comes back is told the newest version again (it skips one it holds: `RolloutAgent._fetch_newest`)."""
        for name in [n for n in self._conns if n not in targets]:
            self._conns.pop(name)[1].close()
        for name in [n for n in self._told if n not in targets]:
            del self._told[name]

    def _announce(
        self,
        version: int,
        targets: dict[str, Target],
        roots: list[str],
        dc: str,
        links: set[frozenset[str]] | None,
    ) -> None:
        """Tell every unit not told yet about `version` whom to pull it from (the plan of this version)."""
        todo = {n: t for n, t in targets.items() if self._told.get(n, -1) < version}
        if not todo:
            return

        # after the last plan: relays stay, newcomers go below units that hold or fetch `version`
        def planned(dc_links: set[frozenset[str]] | None) -> BroadcastPlan:
            return plan_version(
                roots,
                dc,
                targets,
                previous=self.plan,
                dc_links=dc_links,
                fanout=self._fanout,
                dc_chains=self._sync.chains_per_datacenter,
            )

        try:
            plan = planned(links)
        except PlanError as e:
            # the declared links leave a datacenter unreached through datacenters with live units (its relay
            # datacenter's units are gone, or have not joined yet): this version only is routed as if every pair
            # were linked, and `self._dc_links` is left alone, so the next plan takes the declared links again (and
            # a members message that lands meanwhile keeps the links it brought)
            if links is None:
                raise
            if self._fell_back != version:  # one line per version, however often it is re-announced
                self._fell_back = version
                log.warning(
                    "weights v%d: %s; this version is routed as if every pair of datacenters were linked "
                    "(the next plans over the declared links again)",
                    version,
                    e,
                )
            plan = planned(None)
        self.plan = plan
        for name in plan.order:  # parents before children: relays start first
            if name not in todo:
                continue
            try:
                announce(self._connection(name, todo[name].address), version, holders_for(plan, name))
            except TransportError as e:  # that agent is gone; the controller notices it too
                log.warning("weights v%d: cannot tell %s: %s", version, name, e)
                broken = self._conns.pop(name, None)
                if broken is not None:
                    broken[1].close()
                continue
            self._told[name] = version

    def _connection(self, name: str, address: str) -> Connection:
        held = self._conns.get(name)
        if held is not None and held[0] == address:
            return held[1]
        conn = self._transport.connect(address, timeout_s=self._timeout_s)
        if held is not None:  # the unit came back at another address: its old connection leads nowhere
            held[1].close()
        self._conns[name] = (address, conn)
        return conn
