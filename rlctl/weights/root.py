"""A trainer rank's weight node: its newest version in one host buffer, updated in place, and recent deltas.

A relay (`WeightNode`) holds each version it fetched in a buffer of its own. A root may not: its host holds
what the trainer's GPUs do not, and one buffer per kept version is several copies of the model per rank. So:

    version v+1 arrives as              the root, under the buffer's write lock
      a delta (encoded on the trainer's   applies it in place (XOR of the changed elements), hashes the
      device: rlctl.weights.encoder)      result, and sets the delta's target checksum to it
      a full state dict                   flattens it and encodes the delta vs the buffer here (CPU trainers;
                                          one transient copy), then copies it in
    ─▶ holds v+1 only: its full payload IS the buffer; its delta from v; the deltas of the versions before
       (`keep_deltas`), from which a delta from an older base is composed for a child that skipped versions

Children reading the buffer as a full payload hold its read lock for their stream; the next version waits
for them (a joiner's full copy completes before the buffer changes). A child asking for a version the root
has moved past hears the current one (it fetches that instead: `WeightNode.fetch(newer_ok=True)`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator

import torch

from rlctl.transport.base import Connection, Transport
from rlctl.weights import chunks, delta
from rlctl.weights.node import WeightNode
from rlctl.weights.versions import HeldVersion, Payload, Subscribe, WeightSyncConfig, full_payload

log = logging.getLogger(__name__)


class RootNode(WeightNode):
    """The weight node of a trainer rank: one full version in host memory (see the module docstring)."""

    def __init__(
        self, transport: Transport, listen_address: str, config: WeightSyncConfig | None = None, *, keep_deltas: int = 3
    ) -> None:
        super().__init__(transport, listen_address, config)
        self._rw = threading.Condition()
        self._readers = 0
        self._writing = False
        self._chain: deque[tuple[int, Payload]] = deque(maxlen=keep_deltas)  # (its version, its delta), oldest first
        self.peak_host_bytes = 0  # the most this node held at once, transients included

    # -- publishing ----------------------------------------------------------------------------------
    def publish(
        self,
        version: int,
        state_dict: dict[str, torch.Tensor] | None = None,
        *,
        anchor: bool = False,
        encode: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor] | None = None,
        delta_payload: torch.Tensor | None = None,
    ) -> HeldVersion:
        """Hold `version` instead of the current one: from `state_dict` (full tensors), or from `delta_payload`,
        a delta from the current version encoded elsewhere (its target checksum is set here). With delta sync a
        state dict is encoded against the current version (`encode(prev, new, base)`, default `delta.encode`),
        unless an anchor is due (`anchor`, or `anchor_every`)."""
        cur = self.store.current
        every = self.cfg.anchor_every
        due = anchor or (every is not None and (self._last_anchor is None or version - self._last_anchor >= every))
        if delta_payload is not None:
            assert cur is not None and not due, "a delta needs the version it applies to, and no anchor due"
            return self._apply(version, cur, delta_payload)
        assert state_dict is not None
        layout = chunks.layout_of(state_dict)
        if not (self.cfg.delta and cur is not None and cur.layout == layout and not due):
            return self._replace(version, state_dict, layout, anchor=due)
        new = chunks.flatten(state_dict, layout)  # the one transient copy of the CPU path
        self._note_peak(extra=new.numel() + _nbytes(state_dict))
        data = (encode or self._encode)(cur.weights, new, cur.version)
        with self._exclusive():
            cur.weights.copy_(new)
            return self._hold(version, cur.weights, layout, data, base=cur)

    def _encode(self, prev: torch.Tensor, new: torch.Tensor, base_version: int) -> torch.Tensor:
        return delta.encode(prev, new, base_version=base_version, level=self.cfg.delta_level)

    def _apply(self, version: int, cur: HeldVersion, data: torch.Tensor) -> HeldVersion:
        with self._exclusive():
            delta.decode(cur.weights, data, out=cur.weights, verify=False)
            delta.set_target(data, chunks.checksum(cur.weights))
            return self._hold(version, cur.weights, cur.layout, data, base=cur)

    def _replace(
        self, version: int, sd: dict[str, torch.Tensor], layout: chunks.Layout, *, anchor: bool
    ) -> HeldVersion:
        """A full version: into the current buffer when the layout is the same, else a new one."""
        cur = self.store.current
        buffer = cur.weights if cur is not None and cur.layout == layout else None
        with self._exclusive() if buffer is not None else contextlib.nullcontext():
            weights = chunks.flatten(sd, layout, out=buffer)
            self._note_peak(extra=_nbytes(sd) + (0 if buffer is not None else weights.numel()))
            self._last_anchor = version
            self._chain.clear()  # older bases cannot be composed across a full version
            return self._hold(version, weights, layout, None, base=None, anchor=anchor)

    def _hold(
        self,
        version: int,
        weights: torch.Tensor,
        layout: chunks.Layout,
        data: torch.Tensor | None,
        *,
        base: HeldVersion | None,
        anchor: bool = False,
    ) -> HeldVersion:
        hv = HeldVersion(version, layout, chunks.checksum(weights), weights, complete=True, anchor=anchor)
        hv.payloads["full"] = full_payload(weights, self.cfg, have=True)
        if data is not None and base is not None and data.numel() < weights.numel():
            p = full_payload(data, self.cfg, have=True)
            d = Payload("delta", data, p.refs, p.sums, p.have, base.version)
            hv.payloads["delta"] = d
            self._chain.append((version, d))
        elif base is not None:  # no gain from a delta: children take the full version
            self._last_anchor = version
            self._chain.clear()
        with self.store.cv:
            self.store.versions = {version: hv}  # the buffer now holds this version only
            self.store.current = hv
            self.store.cv.notify_all()
        self._note_peak()
        return hv

    # -- serving -------------------------------------------------------------------------------------
    def _payload_for(self, hv: HeldVersion, req: Subscribe, conn: Connection) -> Payload | None:
        """The delta from the child's base (published, or composed from the deltas kept), else the full buffer."""
        del conn
        base = req.base_version
        d = hv.delta_for(base)
        if d is None and base is not None and not hv.anchor:
            d = self._composed(hv, base)
        return d if d is not None else hv.payloads["full"]

    def _composed(self, hv: HeldVersion, base: int) -> Payload | None:
        """The delta from `base` to `hv` composed from the kept chain (cached on `hv`), or None: none kept, or the
        composition no smaller than the full version (a child then takes that, as for a published delta)."""
        steps, at = [], base
        for version, d in list(self._chain):
            if d.base_version == at:
                steps.append(d)
                at = version
        if not steps or at != hv.version:
            return None
        data = delta.compose([d.data for d in steps])
        if data.numel() >= hv.weights.numel():
            log.info(
                "v%d: a delta from v%d composed of %d is no smaller than the version: sent in full",
                hv.version,
                base,
                len(steps),
            )
            return None
        p = full_payload(data, self.cfg, have=True)
        out = Payload("delta", data, p.refs, p.sums, p.have, base)
        with self.store.cv:
            hv.deltas_by_base[base] = out
        log.info("v%d: composed a delta from v%d out of %d (%d bytes)", hv.version, base, len(steps), data.numel())
        self._note_peak()
        return out

    @contextlib.contextmanager
    def _serving(self, hv: HeldVersion, pl: Payload) -> Iterator[bool]:
        """A full payload is the buffer itself: read-locked for the stream; False when the buffer has moved on
        (the child is told the current version instead)."""
        if pl.encoding != "full":
            yield True
            return
        with self._rw:
            while self._writing:
                self._rw.wait()
            if self.store.current is not hv:
                yield False
                return
            self._readers += 1
        try:
            yield True
        finally:
            with self._rw:
                self._readers -= 1
                self._rw.notify_all()

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """The buffer's write lock: no full stream reads it meanwhile (new ones wait, running ones finish). Held
        until the new version is current (`_hold`): until then `store.current` is the old version, whose
        checksums no longer match the buffer, and a stream of it starting in between would fail them."""
        with self._rw:
            self._writing = True
            while self._readers:
                self._rw.wait()
        try:
            yield
        finally:
            with self._rw:
                self._writing = False
                self._rw.notify_all()

    def host_bytes(self) -> int:
        """The held version's buffer and payloads, and the older deltas kept for composing."""
        older = sum(
            d.data.untyped_storage().nbytes()
            for v, d in list(self._chain)
            if v != getattr(self.store.current, "version", None)
        )
        return super().host_bytes() + older

    def _note_peak(self, *, extra: int = 0) -> None:
        self.peak_host_bytes = max(self.peak_host_bytes, self.host_bytes() + extra)


def _nbytes(sd: dict[str, torch.Tensor]) -> int:
    """Host bytes of a state dict (the snapshot a full version arrives as, held until it is flattened)."""
    return sum(t.numel() * t.element_size() for t in sd.values() if t.device.type == "cpu")
