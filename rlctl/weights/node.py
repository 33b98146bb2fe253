"""The weight plane node: publishes (root), relays and fetches chunked weight versions.

Every node listens and serves the versions it holds to its children; a receiver fetches a
version from its planned parent, falling back to other holders (see `plan.py`) when the parent
dies. Per child connection:

    child                                      parent
    subscribe{version, base, encoding, have, have_sums, from} ─▶
                                             ◀─ waiting{version}   (while it completes the version,
                                                                    to serve a delta or full rebuilt; or,
                                                                    a relay not holding it yet, while its
                                                                    own fetches move: `_wait_for`)
                                             ◀─ manifest{encoding, sizes, per-chunk xxh3, layout}
                                                or error{error, current}: it does not hold it (re-attach)
                                                or error{error, refused}: it cannot read the subscribe
                                             ◀─ chunk{version, bucket, index, offset, length, xxh3} + bytes
    resend{index}   (checksum mismatch)     ─▶   (chunk sent again; at most max_chunk_retries times)
                                             ◀─ chunk ...
    complete        (every chunk verified)  ─▶

The parent sends chunk i as soon as it holds it (a relay forwards chunk k while k+1 arrives).
Which payload a child gets (`_payload_for`), given the base version it holds:

    base = the delta's base (root: previous version; relay: what it received)  → that delta, as it arrives
    base held complete here, same layout, not an anchor                        → delta vs base, encoded
                                                                                 once on demand, cached
    otherwise (joins, resumes, asked for full after a failed verification)     → full

There are no periodic anchors unless `anchor_every` asks for them: every applied version is
verified, so a full copy is sent only to a receiver that needs one. A delta payload is decoded
once complete; its result is checked against the version's xxh3 and on any mismatch the
receiver fetches the full version instead. Only then does the version become current; until
then the previous one stays in service. Every node counts what it serves (`served`) and what a
fetch took off the wire (`HeldVersion.received_encoding`, `received_base`, `received_bytes`).

A fetch that every holder refused for good in one pass (`Refused`: this node's credentials, a manifest
it cannot type or hold, a subscribe the parent cannot read) fails at once as `FetchRefused`, which its
owner treats as fatal; any other failure may pass (a peer restarting, behind, or gone): the next holder,
the next pass, the owner's next try.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch

from rlctl.errors import PeerTimeout, ProtocolError, Refused, TransportError
from rlctl.transport.base import Connection, Message, TensorSpec, Transport
from rlctl.transport.framing import to_struct
from rlctl.weights import chunks, delta
from rlctl.weights.versions import (
    ChunkHead,
    HeldVersion,
    Manifest,
    Payload,
    Resend,
    Served,
    Subscribe,
    VersionStore,
    WeightSyncConfig,
    full_payload,
    payload_from_manifest,
)

log = logging.getLogger(__name__)
ATTEMPTS_KEPT = 64  # the last fetches a node remembers (`WeightNode.attempts`)


class FormatRefused(ProtocolError, Refused):
    """A message of the weight protocol that one side will never accept, however often it comes: a manifest this node
    cannot type or hold (over its `max_weights_bytes`), a subscribe the parent cannot read (another rlctl version)."""


class FetchRefused(Refused):
    """Every holder of a fetch refused this node for good (credentials, format, size): no retry can succeed."""


class Superseded(ProtocolError):
    """The holder no longer has the asked version: it has moved on to `current`."""

    def __init__(self, message: str, current: int) -> None:
        super().__init__(message)
        self.current = current


class WeightNode:
    """One holder of weight versions: serves children, and publishes (root) or fetches (receiver)."""

    def __init__(self, transport: Transport, listen_address: str, config: WeightSyncConfig | None = None) -> None:
        self.cfg = config or WeightSyncConfig()
        self.transport = transport
        self.store = VersionStore(self.cfg.keep_versions)
        self._listener = transport.listen(listen_address)
        self.address = self._listener.address
        self._closing = threading.Event()
        self._last_anchor: int | None = None
        self._conns: set[Connection] = set()
        # (version, holder address, "ok" | error) of the last fetches (one a version: a job runs for weeks)
        self.attempts: deque[tuple[int, str, str]] = deque(maxlen=ATTEMPTS_KEPT)
        self._served: deque[Served] = deque(maxlen=self.cfg.served_log)  # one record per child connection
        self._served_lock = threading.Lock()
        self._encode_lock = threading.Lock()  # one on-demand delta encode at a time (CPU-bound anyway)
        self._accepter = threading.Thread(target=self._accept_loop, name="weights-accept", daemon=True)
        self._accepter.start()

    # -- root side ----------------------------------------------------------------------
    def publish(
        self,
        version: int,
        state_dict: dict[str, torch.Tensor],
        *,
        anchor: bool = False,
        encode: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor] | None = None,
    ) -> HeldVersion:
        """Hold `version`: a full payload (for receivers that need one), plus a delta vs the previous
        version whenever the layouts match and no anchor is due.

        `anchor=True` forces a full anchor now (no delta for anyone), e.g. after a resume; with
        `anchor_every=K` one is also due every K versions. `encode(prev, new, base_version)` makes that
        delta instead of `delta.encode` (the trainer ranks' split encoding, rlctl.agents.weights)."""
        layout = chunks.layout_of(state_dict)
        weights = chunks.flatten(state_dict, layout)
        hv = HeldVersion(version, layout, chunks.checksum(weights), weights, complete=True)
        hv.payloads["full"] = full_payload(weights, self.cfg, have=True)
        prev = self.store.current
        every = self.cfg.anchor_every
        periodic_due = every is not None and (self._last_anchor is None or version - self._last_anchor >= every)
        if self.cfg.delta and prev is not None and prev.layout == layout and not (anchor or periodic_due):
            d = self._encode_delta(prev, hv, encode)
            if d is not None:
                hv.payloads["delta"] = d
        if "delta" not in hv.payloads:
            self._last_anchor = version
            hv.anchor = anchor or periodic_due
        self.store.add(hv)
        self.store.flip(hv)
        return hv

    def _encode_delta(
        self,
        base: HeldVersion,
        hv: HeldVersion,
        encode: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor] | None = None,
    ) -> Payload | None:
        """A delta payload turning complete `base` into complete `hv`; None when it is not smaller than full."""
        if encode is not None:
            data = encode(base.weights, hv.weights, base.version)
        else:
            data = delta.encode(base.weights, hv.weights, base_version=base.version, level=self.cfg.delta_level)
        if data.numel() >= hv.weights.numel():
            return None
        p = full_payload(data, self.cfg, have=True)
        return Payload("delta", data, p.refs, p.sums, p.have, base.version)

    # -- receiver side ------------------------------------------------------------------
    def fetch(
        self, version: int, holders: list[str], *, want_full: bool = False, newer_ok: bool = False
    ) -> HeldVersion:
        """Fetch `version` from the first live address in `holders` (planned parent first) and flip to it.

        `newer_ok`: a holder that has moved past `version` (and dropped it) gives its current version
        instead — what a rollout engine wants, since only the newest weights matter to it."""
        if not holders:
            raise ValueError("fetch needs at least one holder address")
        self.expect(version)
        hv = self.store.versions.get(version)
        if hv is not None and hv.complete:
            self.store.flip(hv)
            return hv
        attempts: list[str] = []
        for _ in range(self.cfg.attach_passes):
            refused: dict[str, Refused] = {}  # this pass's holders that refused this node for good
            for addr in holders:
                try:
                    while True:
                        try:
                            hv = self._fetch_from(addr, version, want_full=want_full)
                            break
                        except Superseded as e:
                            if not newer_ok:
                                raise
                            log.info("v%d is superseded at %s: fetching its v%d", version, addr, e.current)
                            version = e.current
                    if not self._finish(hv):
                        log.warning("v%d delta is unusable here; falling back to a full transfer", version)
                        want_full = True
                        hv = self._fetch_from(addr, version, want_full=True)
                        if not self._finish(hv):
                            raise ProtocolError(f"{addr}: full v{version} could not be verified")
                    self.attempts.append((version, addr, "ok"))
                    return hv
                except TransportError as e:
                    self.attempts.append((version, addr, str(e)))
                    attempts.append(f"{addr}: {e}")
                    log.warning("v%d from %s failed, re-attaching to the next holder: %s", version, addr, e)
                    if isinstance(e, Refused):
                        refused[addr] = e
            if set(refused) == set(holders):
                raise _refused_by_all(version, holders, refused)
        raise TransportError(f"v{version}: no holder could deliver it; tried: " + "; ".join(attempts[-4:]))

    def _fetch_from(self, addr: str, version: int, *, want_full: bool) -> HeldVersion:
        cur = self.store.current
        with self.transport.connect(addr, self.cfg.connect_timeout_s) as conn:
            hv = self.store.versions.get(version)
            held = None if hv is None else hv.payloads.get("full" if want_full else "delta") or hv.payloads.get("full")
            conn.send(
                Message(
                    "subscribe",
                    {
                        "version": version,
                        "base_version": None if want_full or cur is None else cur.version,
                        "encoding": None if held is None else held.encoding,
                        "have": None if held is None else bytes(held.have),
                        "have_sums": None if held is None else chunks.sums_digest(held.sums),
                        "from": self.address,
                    },
                )
            )
            reply = self._recv(conn, f"the manifest of v{version}")
            while reply.kind == "waiting":  # the holder is still completing the version for us
                self.store.moved()  # (progress, for the children waiting on this node in turn)
                reply = self._recv(conn, f"the manifest of v{version} (the holder said it is completing it)")
            if reply.kind != "manifest":
                err = f"{addr}: {reply.header.get('error', reply.kind)}"
                current = reply.header.get("current")
                if isinstance(current, int) and current > version:
                    raise Superseded(err, current)
                if reply.header.get("refused") is True:  # the parent cannot read our subscribe: it never will
                    raise FormatRefused(err)
                raise ProtocolError(err)
            hv, pl = self._adopt(reply.header, peer=addr)
            hv.received_encoding, hv.received_base = pl.encoding, pl.base_version
            retries = [0] * len(pl.refs)
            while not pl.done:
                what = f"chunks of v{version} ({pl.num_have} of {len(pl.refs)} held)"
                msg = self._recv(conn, what, into=self._chunk_buffers(pl, hv.version, addr))
                if msg.kind != "chunk":
                    raise ProtocolError(f"{addr}: unexpected {msg.kind[:40]!r} during v{version}")
                hv.received_bytes += sum(t.numel() * t.element_size() for t in msg.tensors)
                i = to_struct(msg.header, ChunkHead, what=f"{addr}: chunk header").index  # checked by the provider
                if pl.have[i]:
                    continue
                if chunks.checksum(msg.tensors[0]) == pl.sums[i]:
                    with self.store.cv:
                        pl.have[i] = True
                        self.store.progress += 1
                        self.store.cv.notify_all()
                    continue
                retries[i] += 1
                if retries[i] > self.cfg.max_chunk_retries:
                    raise ProtocolError(f"{addr}: chunk {i} of v{version} failed its checksum {retries[i]} times")
                log.warning("v%d chunk %d from %s failed its checksum; asking again", version, i, addr)
                conn.send(Message("resend", {"index": i}))
            conn.send(Message("complete", {"version": version}))
        return hv

    def _recv(self, conn: Connection, what: str, *, into: Any = None) -> Message:
        """The parent's next message within chunk_timeout_s; a PeerTimeout says what this node waited for."""
        try:
            return conn.recv(self.cfg.chunk_timeout_s, into=into)
        except PeerTimeout as e:
            raise PeerTimeout(f"{e}, waiting for {what}") from e

    def _adopt(self, header: dict[str, Any], *, peer: str = "") -> tuple[HeldVersion, Payload]:
        """The local HeldVersion/Payload that chunks described by the manifest `header` land in; the manifest
        is typed and checked (sizes within `max_weights_bytes`) before anything is allocated for it."""
        try:  # the same manifest comes from every holder: what this node cannot type or hold, it never will
            m = to_struct(header, Manifest, what=f"{peer}: manifest")
            m.check(self.cfg.max_weights_bytes, peer=peer)
        except ProtocolError as e:
            raise FormatRefused(str(e)) from e
        version, enc = m.version, m.encoding
        with self.store.cv:
            hv = self.store.versions.get(version)
            if hv is not None and hv.weights_xxh3 != m.weights_xxh3:
                raise ProtocolError(f"v{version}: holders disagree on its content (xxh3 differs)")
            if hv is None:
                layout = chunks.Layout.from_wire(m.layout, m.weights_bytes)
                weights = torch.empty(layout.total_bytes, dtype=torch.uint8)
                hv = HeldVersion(version, layout, m.weights_xxh3, weights, anchor=m.anchor)
            pl = hv.payloads.get(enc)
            if pl is None or pl.sums != m.sums:
                data = hv.weights if enc == "full" else torch.empty(m.payload_bytes, dtype=torch.uint8)
                pl = payload_from_manifest(m, data)
                if enc == "full" and pl.data.numel() != hv.weights.numel():
                    raise ProtocolError(f"v{version}: full payload size differs from its layout")
                hv.payloads[enc] = pl
            self.store.versions[version] = hv
            self.store.cv.notify_all()
        return hv, pl

    def _chunk_buffers(self, pl: Payload, version: int, peer: str) -> Any:
        def provide(kind: str, header: dict[str, Any], specs: list[TensorSpec]) -> list[torch.Tensor]:
            if kind != "chunk":
                return [torch.empty(s.shape, dtype=s.dtype) for s in specs]
            head = to_struct(header, ChunkHead, what=f"{peer}: chunk header")
            i = head.index
            if (
                head.version != version
                or not 0 <= i < len(pl.refs)
                or len(specs) != 1
                or specs[0].nbytes != pl.refs[i].length
            ):
                raise ProtocolError(f"{peer}: chunk {i} of v{head.version} does not match the manifest of v{version}")
            if pl.have[i]:  # a duplicate must not overwrite bytes children are being served from
                return [torch.empty(pl.refs[i].length, dtype=torch.uint8)]
            r = pl.refs[i]
            return [pl.data[r.offset : r.offset + r.length]]

        return provide

    def _finish(self, hv: HeldVersion) -> bool:
        """Rebuild (delta) and verify the weights; flip to them. False = delta unusable."""
        hv.finishing = True  # children waiting for this version count the decode as progress
        try:
            return self._rebuild(hv)
        finally:
            hv.finishing = False

    def _rebuild(self, hv: HeldVersion) -> bool:
        if hv.complete:
            self.store.flip(hv)
            return True
        full = hv.payloads.get("full")
        if full is None or not full.done:
            d = hv.payloads["delta"]
            base = self.store.versions.get(d.base_version) if d.base_version is not None else None
            if base is None or not base.complete:
                return False
            try:
                delta.decode(base.weights, d.data, out=hv.weights)
            except ProtocolError as e:
                log.warning("v%d: %s", hv.version, e)
                del hv.payloads["delta"]
                return False
        if chunks.checksum(hv.weights) != hv.weights_xxh3:
            hv.payloads.pop("full", None)
            raise ProtocolError(f"v{hv.version}: rebuilt weights fail the version checksum")
        with self.store.cv:
            hv.complete = True
        self.store.flip(hv)
        return True

    def host_bytes(self) -> int:
        """Bytes this node holds in host memory: every held version's buffer and payloads (each storage once)."""
        with self.store.cv:
            tensors = [
                t
                for hv in self.store.versions.values()
                for t in (hv.weights, *(p.data for p in (*hv.payloads.values(), *hv.deltas_by_base.values())))
            ]
        seen: dict[int, int] = {}
        for t in tensors:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        return sum(seen.values())

    def current(self) -> tuple[int, dict[str, torch.Tensor]] | None:
        """(version, state dict of views into the held buffer) of the current version, if any."""
        hv = self.store.current
        return None if hv is None else (hv.version, chunks.unflatten(hv.weights, hv.layout))

    # -- serving children ---------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                conn = self._listener.accept(timeout_s=0.1)
            except PeerTimeout:
                continue
            except TransportError as e:
                if self._closing.is_set():
                    return
                log.warning("weights listener %s: %s", self.address, e)
                continue
            self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="weights-serve", daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        try:
            self._serve_one(conn)
        except TransportError as e:
            log.info("child %s left: %s", conn.peer, e)
        finally:
            self._conns.discard(conn)
            conn.close()

    def _serve_one(self, conn: Connection) -> None:
        msg = conn.recv(self.cfg.chunk_timeout_s)
        try:
            if msg.kind != "subscribe":
                raise ProtocolError(f"{conn.peer}: expected subscribe, got {msg.kind[:40]!r}")
            req = to_struct(msg.header, Subscribe, what=f"{conn.peer}: subscribe")
        except ProtocolError as e:  # the child speaks another protocol (another rlctl version): say so, for good
            conn.send(Message("error", {"error": f"{self.address} refused: {e}", "refused": True}))
            raise
        version = req.version
        hv = self._wait_for(version, conn)
        pl = None if hv is None else self._payload_for(hv, req, conn)
        if hv is None or pl is None:
            cur = self.store.current
            error = {"error": f"{self.address} does not hold v{version}", "current": cur and cur.version}
            conn.send(Message("error", error))
            return
        with self._serving(hv, pl) as still_held:
            if not still_held:  # gone while this child asked (a root's buffer moved on): say what is current
                cur = self.store.current
                conn.send(
                    Message("error", {"error": f"{self.address} moved past v{version}", "current": cur and cur.version})
                )
                return
            record = Served(hv.version, pl.encoding, pl.base_version, req.from_ or conn.peer)
            with self._served_lock:
                self._served.append(record)
            conn.send(Message("manifest", pl.manifest(hv, self.cfg)))
            self._stream(conn, hv, pl, req, record)

    def _wait_for(self, version: int, conn: Connection) -> HeldVersion | None:
        """`version` once this node holds it (its manifest in), or None. A relay is often asked before that: it
        may still be moving the previous version. It answers within the child's chunk timeout either way —
        `waiting` while it expects the version (`expect`) and its fetches move (a chunk in since the last
        answer), so a version that takes minutes to cross still crosses once; "not here" (None) once they stall
        or the version is not coming, so the child re-attaches to the next holder."""
        slice_s = 0.8 * self.cfg.chunk_timeout_s
        mark = self.store.progress
        hv = self.store.wait_for(version, slice_s)
        while hv is None and version <= self.store.expected and self.store.progress > mark:
            conn.send(Message("waiting", {"version": version}))
            mark = self.store.progress
            hv = self.store.wait_for(version, slice_s)
        return hv

    def expect(self, version: int) -> None:
        """This node will fetch `version` (announced to it): children asking for it wait while fetches move."""
        with self.store.cv:
            self.store.expected = max(self.store.expected, version)
            self.store.cv.notify_all()

    @contextlib.contextmanager
    def _serving(self, hv: HeldVersion, pl: Payload) -> Iterator[bool]:
        """Held while `pl` of `hv` streams to a child; yields whether it is still there to stream (a relay's
        buffers never change under a stream: always)."""
        del hv, pl
        yield True

    @property
    def served(self) -> list[Served]:
        """What this node served its children, oldest first (the last `served_log` connections)."""
        with self._served_lock:
            return list(self._served)

    def _stream(self, conn: Connection, hv: HeldVersion, pl: Payload, req: Subscribe, record: Served) -> None:
        """Send the chunks the child lacks as this node comes to hold them, then serve its re-send requests.

        Only held chunks go out (a relay's chunk still arriving has no valid bytes yet); a re-send of one not held
        goes once it is. A stream waiting for a chunk that will not arrive (the version or payload was dropped
        here: its fetch failed, or moved to another holder's bytes) ends, so the child re-attaches at once."""
        events: queue.Queue[tuple[str, int]] = queue.Queue()
        threading.Thread(target=self._read_child, args=(conn, events, len(pl.refs)), daemon=True).start()
        # the child's bitmap counts only for the very payload it describes: it keeps it only for the same chunk
        # checksums (`_adopt`), and two holders may encode one delta into different bytes
        same = req.encoding == pl.encoding and req.have_sums == chunks.sums_digest(pl.sums)
        have = req.have if same and req.have else b""
        todo = deque(i for i in range(len(pl.refs)) if not (i < len(have) and have[i]))
        asked: deque[int] = deque()  # re-sends the child asked for, oldest first
        t0, paced_bytes = time.monotonic(), 0
        while True:
            while not events.empty():
                kind, j = events.get()
                if kind == "closed":
                    return
                asked.append(j)
            for j in [j for j in asked if pl.have[j]]:
                asked.remove(j)
                self._send_chunk(conn, hv, pl, j, record)
            if todo and pl.have[todo[0]]:
                paced_bytes += self._send_chunk(conn, hv, pl, todo.popleft(), record)
                if self.cfg.send_bytes_per_s:
                    time.sleep(max(0.0, t0 + paced_bytes / self.cfg.send_bytes_per_s - time.monotonic()))
            elif todo or asked:  # the next chunk to send is still arriving here
                with self.store.cv:
                    while events.empty() and not pl.have[todo[0] if todo else asked[0]]:
                        if self.store.versions.get(hv.version) is not hv or hv.payloads.get(pl.encoding) is not pl:
                            log.info("v%d %s is no longer arriving here; closing its stream", hv.version, pl.encoding)
                            return
                        self.store.cv.wait(timeout=0.5)
            else:  # everything sent: serve re-send requests until the child is complete
                try:
                    kind, j = events.get(timeout=self.cfg.chunk_timeout_s)
                except queue.Empty:  # a child that neither confirms nor leaves does not hold this thread forever
                    log.warning(
                        "child %s did not confirm v%d within %.1f s of its last chunk; closing",
                        record.child,
                        hv.version,
                        self.cfg.chunk_timeout_s,
                    )
                    return
                if kind != "resend":
                    return
                asked.append(j)

    def _payload_for(self, hv: HeldVersion, req: Subscribe, conn: Connection) -> Payload | None:
        """The payload a child holding `req.base_version` gets (see the module docstring); None = gone."""
        base = req.base_version
        d = hv.delta_for(base)
        if d is not None:
            return d  # the delta it travelled as is forwarded chunk by chunk while it arrives
        if self._can_encode_for(hv, base):
            assert base is not None
            if not self._wait_complete(hv, conn):
                return None
            d = self._on_demand_delta(hv, base, conn)
            if d is not None:
                return d
        full = hv.payloads.get("full")
        if full is not None and (full.done or "delta" not in hv.payloads):
            return full  # a full payload still arriving is forwarded chunk by chunk
        if not self._wait_complete(hv, conn):  # held only as a delta: serve the rebuilt weights once complete
            return None
        with self.store.cv:
            if "full" not in hv.payloads or not hv.payloads["full"].done:
                hv.payloads["full"] = full_payload(hv.weights, self.cfg, have=True)
            return hv.payloads["full"]

    def _can_encode_for(self, hv: HeldVersion, base: int | None) -> bool:
        """Whether a delta vs `base` can be made here: base held complete, same layout, no anchor."""
        if not self.cfg.delta or hv.anchor or base is None or base == hv.version:
            return False
        b = self.store.versions.get(base)
        return b is not None and b.complete and b.layout == hv.layout

    def _wait_complete(self, hv: HeldVersion, conn: Connection) -> bool:
        """Wait until `hv` is complete here, telling the child so; False after chunk_timeout_s without progress."""
        timeout_s = self.cfg.chunk_timeout_s

        def progress() -> int:
            return sum(p.num_have for p in list(hv.payloads.values()))

        last, since = progress(), time.monotonic()
        while True:
            with self.store.cv:
                if self.store.cv.wait_for(lambda: hv.complete, timeout=0.25 * timeout_s):
                    return True
            now = progress()
            if now != last or hv.finishing:
                last, since = now, time.monotonic()
            elif time.monotonic() - since > timeout_s:
                return False
            conn.send(Message("waiting", {"version": hv.version}))

    def _on_demand_delta(self, hv: HeldVersion, base: int, conn: Connection) -> Payload | None:
        """Delta of complete `hv` vs held `base`, encoded once and cached (None: base gone or no gain).

        Encoding a large model takes a while: the child hears `waiting` meanwhile, and if it leaves
        the delta is still cached for whoever asks next."""
        result: list[Payload | None] = []
        worker = threading.Thread(target=lambda: result.append(self._encode_cached(hv, base)), daemon=True)
        worker.start()
        worker.join(timeout=0.25 * self.cfg.chunk_timeout_s)
        while worker.is_alive():
            conn.send(Message("waiting", {"version": hv.version}))
            worker.join(timeout=0.25 * self.cfg.chunk_timeout_s)
        return result[0] if result else None

    def _encode_cached(self, hv: HeldVersion, base: int) -> Payload | None:
        with self._encode_lock:  # one encode at a time: a second child for the same base finds it cached
            d = hv.delta_for(base)
            if d is not None:
                return d
            b = self.store.versions.get(base)
            if b is None or not b.complete:
                return None  # dropped (keep_versions) since the check
            d = self._encode_delta(b, hv)
            if d is None:
                return None
            with self.store.cv:
                hv.deltas_by_base[base] = d
                while len(hv.deltas_by_base) > self.cfg.keep_versions:
                    del hv.deltas_by_base[min(hv.deltas_by_base)]
            log.info("v%d: encoded a delta vs v%d on demand (%d bytes)", hv.version, base, d.data.numel())
            return d

    def _read_child(self, conn: Connection, events: queue.Queue[tuple[str, int]], num_chunks: int) -> None:
        try:
            while True:
                msg = conn.recv()
                if msg.kind == "resend":
                    try:
                        i = to_struct(msg.header, Resend, what=f"{conn.peer}: resend").index
                        if i >= num_chunks:
                            raise ProtocolError(f"{conn.peer}: resend of chunk {i}, the payload has {num_chunks}")
                    except ProtocolError as e:  # the child's mistake: drop the request, keep serving it
                        log.warning("dropped a malformed message: %s", e)
                        continue
                    with self.store.cv:  # the stream may be waiting for a chunk still arriving
                        events.put(("resend", i))
                        self.store.cv.notify_all()
                elif msg.kind == "complete":
                    break
        except TransportError:
            pass
        events.put(("closed", -1))
        with self.store.cv:
            self.store.cv.notify_all()

    def _send_chunk(self, conn: Connection, hv: HeldVersion, pl: Payload, i: int, record: Served) -> int:
        r = pl.refs[i]
        record.bytes += r.length  # before sending: the child may hold the version as soon as it is sent
        head = {"version": hv.version, "bucket": r.bucket, "index": i, "offset": r.offset, "length": r.length}
        head["xxh3"] = pl.sums[i]
        conn.send(Message("chunk", head, [pl.data[r.offset : r.offset + r.length]]))
        return r.length

    def close(self) -> None:
        self._closing.set()
        self._listener.close()
        for c in list(self._conns):
            c.close()
        self._accepter.join(timeout=5)

    def __enter__(self) -> WeightNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _refused_by_all(version: int, holders: list[str], refused: dict[str, Refused]) -> FetchRefused:
    """One line naming the planned parent (the first holder) and why it refused; the others refused too."""
    others = len(holders) - 1
    also = f" (and the {others} other holder(s) likewise)" if others else ""
    why = refused[holders[0]]
    return FetchRefused(f"v{version}: the parent refused this node, which no retry changes{also}: {why}")
