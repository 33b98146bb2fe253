"""What one node of the weight plane holds: weight versions, each as full and/or delta payloads.

    HeldVersion v7
    ├── layout, weights_xxh3               (names/dtypes/shapes; checksum of the full flat buffer)
    ├── payloads["full"]  data = the flat weights, per-chunk xxh3, have-bitmap (filled as chunks land)
    ├── payloads["delta"] data = encoded delta vs v6 (the root's delta vs its previous version, or the
    │                      delta this version travelled as)
    ├── deltas_by_base     on-demand deltas vs older held bases {5: ...}, encoded for a child that skipped v6
    ├── received_encoding, received_base, received_bytes  (what the fetch of this version took off the wire)
    └── complete                            (every chunk verified and the weights rebuilt + checked)

One condition variable per node guards all of it: receivers set `have[i]` and notify; the
serving threads of the node's children wait on it, which is what lets a relay forward chunk k
while chunk k+1 is still arriving.

The headers of the weight plane's messages are typed here too (`Subscribe`, `Manifest`, `ChunkHead`,
`Resend`): a receiver converts each before use (`framing.to_struct`, a ProtocolError otherwise), and a
manifest is checked against the receiver's `max_weights_bytes` before anything is allocated for it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec
import torch

from rlctl.errors import ProtocolError
from rlctl.weights import chunks, manifest
from rlctl.weights.chunks import ChunkRef, Layout

NonNegInt = Annotated[int, msgspec.Meta(ge=0)]


@dataclass(frozen=True)
class WeightSyncConfig:
    chunk_bytes: int = 4 << 20
    bucket_bytes: int = manifest.BUCKET_BYTES
    delta: bool = True
    # None = no periodic anchors: every version is published with a delta vs the previous one and
    # a full copy goes only to a receiver that needs one (joins, resumes, fails verification);
    # K = the old periodic behaviour, a full anchor (no delta) every K versions (1 = always full)
    anchor_every: int | None = None
    delta_level: int = 1  # zstd level of delta payloads (3 compresses no better on weight XORs, and slower)
    connect_timeout_s: float = 10.0
    chunk_timeout_s: float = 30.0  # silence from a parent this long = parent dead, re-attach
    max_chunk_retries: int = 3  # re-sends of one chunk before giving up on that parent
    attach_passes: int = 3  # passes over parent + fallbacks before the fetch fails
    send_bytes_per_s: float | None = None  # pace each child stream (leave room for other traffic)
    # complete versions a node keeps; a child whose base is among them gets an on-demand delta
    # (a rollout unit that skipped versions), otherwise a full copy. Each one is a copy of the weights.
    keep_versions: int = 2
    served_log: int = 4096  # (version, encoding, bytes, child) records a node keeps in `served`
    # the most a received manifest may make this node allocate for one version (weights, and a delta payload)
    max_weights_bytes: int = 1 << 40

    def __post_init__(self) -> None:
        if not 0 < self.chunk_bytes <= self.bucket_bytes:
            raise ValueError(f"need 0 < chunk_bytes ≤ bucket_bytes, got {self.chunk_bytes} and {self.bucket_bytes}")
        if (self.anchor_every is not None and self.anchor_every < 1) or self.keep_versions < 2:
            raise ValueError("anchor_every must be None or ≥ 1 and keep_versions ≥ 2 (a delta needs its base)")
        if self.served_log < 1:
            raise ValueError(f"served_log must be ≥ 1, got {self.served_log}")


@dataclass
class Payload:
    encoding: str  # "full" | "delta"
    data: torch.Tensor  # flat uint8
    refs: list[ChunkRef]
    sums: list[int]
    have: list[bool]
    base_version: int | None = None

    @property
    def num_have(self) -> int:
        return sum(self.have)

    @property
    def done(self) -> bool:
        return all(self.have)

    def manifest(self, hv: HeldVersion, cfg: WeightSyncConfig) -> dict[str, Any]:
        return {
            "version": hv.version,
            "encoding": self.encoding,
            "base_version": self.base_version,
            "payload_bytes": self.data.numel(),
            "bucket_bytes": cfg.bucket_bytes,
            "chunk_bytes": cfg.chunk_bytes,
            "sums": self.sums,
            "weights_bytes": hv.layout.total_bytes,
            "weights_xxh3": hv.weights_xxh3,
            "anchor": hv.anchor,
            "layout": hv.layout.to_wire(),
        }


def full_payload(weights: torch.Tensor, cfg: WeightSyncConfig, *, have: bool) -> Payload:
    refs = chunks.cut(weights.numel(), bucket_bytes=cfg.bucket_bytes, chunk_bytes=cfg.chunk_bytes)
    sums = chunks.chunk_checksums(weights, refs) if have else []
    return Payload("full", weights, refs, sums, [have] * len(refs))


class Subscribe(msgspec.Struct):
    """child → parent: the version it wants, what it holds, where it listens."""

    version: NonNegInt
    base_version: int | None = None
    encoding: Literal["full", "delta"] | None = None
    have: bytes | None = None  # one byte per chunk of the payload it holds part of (0/1)
    have_sums: int | None = None  # `chunks.sums_digest` of that payload: `have` counts only for the same chunks
    from_: str | None = msgspec.field(default=None, name="from")


class Manifest(msgspec.Struct):
    """parent → child: what the chunks that follow make up (see `Payload.manifest`)."""

    version: NonNegInt
    encoding: Literal["full", "delta"]
    base_version: int | None
    payload_bytes: NonNegInt
    bucket_bytes: Annotated[int, msgspec.Meta(ge=1)]
    chunk_bytes: Annotated[int, msgspec.Meta(ge=1)]
    sums: list[NonNegInt]
    weights_bytes: NonNegInt
    weights_xxh3: NonNegInt
    layout: list[tuple[str, str, list[NonNegInt], NonNegInt, NonNegInt]]
    anchor: bool = False

    def check(self, max_bytes: int, *, peer: str) -> None:
        """ProtocolError unless every size is within `max_bytes` and the checksums match the chunking."""
        where = f"{peer}: manifest of v{self.version}"
        if self.chunk_bytes > self.bucket_bytes:
            raise ProtocolError(f"{where}: chunk_bytes {self.chunk_bytes} > bucket_bytes {self.bucket_bytes}")
        if max(self.weights_bytes, self.payload_bytes) > max_bytes:
            raise ProtocolError(f"{where}: {max(self.weights_bytes, self.payload_bytes)} bytes exceed {max_bytes}")
        if self.encoding == "full" and self.payload_bytes != self.weights_bytes:
            raise ProtocolError(f"{where}: full payload of {self.payload_bytes} bytes, weights of {self.weights_bytes}")
        whole, rest = divmod(self.payload_bytes, self.bucket_bytes)
        n = whole * -(-self.bucket_bytes // self.chunk_bytes) + -(-rest // self.chunk_bytes)
        if len(self.sums) != n:  # before chunks.cut: the count is bounded by the header, not by payload_bytes
            raise ProtocolError(f"{where}: {len(self.sums)} checksums for {n} chunks")


class ChunkHead(msgspec.Struct):
    """parent → child: the header of one chunk (its bytes are the message's one tensor)."""

    version: NonNegInt
    bucket: NonNegInt
    index: NonNegInt
    offset: NonNegInt
    length: NonNegInt
    xxh3: NonNegInt


class Resend(msgspec.Struct):
    """child → parent: chunk `index` failed its checksum, send it again."""

    index: NonNegInt


def payload_from_manifest(m: Manifest, data: torch.Tensor) -> Payload:
    """The (empty) payload a checked manifest describes, receiving into `data`."""
    refs = chunks.cut(m.payload_bytes, bucket_bytes=m.bucket_bytes, chunk_bytes=m.chunk_bytes)
    return Payload(m.encoding, data, refs, list(m.sums), [False] * len(refs), m.base_version)


@dataclass
class HeldVersion:
    version: int
    layout: Layout
    weights_xxh3: int
    weights: torch.Tensor  # flat uint8; valid once `complete` (or chunk by chunk for a full payload)
    payloads: dict[str, Payload] = field(default_factory=dict)
    deltas_by_base: dict[int, Payload] = field(default_factory=dict)  # on-demand deltas, by base version
    complete: bool = False
    finishing: bool = False  # all chunks in, being decoded/verified
    anchor: bool = False  # published as a forced/periodic anchor: every child gets it in full
    received_encoding: str | None = None  # "full" | "delta" as fetched (None: published here)
    received_base: int | None = None  # the version a fetched delta applied onto
    received_bytes: int = 0  # payload bytes this node took off the wire for this version (resends included)

    def delta_for(self, base_version: int | None) -> Payload | None:
        """The delta payload held for `base_version` (published, received or encoded on demand)."""
        if base_version is None:
            return None
        d = self.payloads.get("delta")
        if d is not None and d.base_version == base_version:
            return d
        return self.deltas_by_base.get(base_version)


@dataclass
class Served:
    """One child connection served: which payload, and the payload bytes sent so far (re-sends included).

    Recorded before the manifest goes out and counted before each chunk is sent, so once a child holds
    the version its record is final."""

    version: int
    encoding: str  # "full" | "delta"
    base_version: int | None  # the delta's base
    child: str  # the child's listening address when it said so, else its connection's peer
    bytes: int = 0


class VersionStore:
    """Versions held by one node; `current` flips only to a complete, verified version."""

    def __init__(self, keep_versions: int) -> None:
        self.cv = threading.Condition()
        self.versions: dict[int, HeldVersion] = {}
        self.current: HeldVersion | None = None
        self.keep_versions = keep_versions
        self.expected = -1  # the newest version this node was told it will fetch (`WeightNode.expect`)
        self.progress = 0  # counts every chunk this node took in (and every `waiting` its parent sent)

    def moved(self) -> None:
        """A fetch here made progress (a chunk in, or the parent's word that it is completing the version)."""
        with self.cv:
            self.progress += 1

    def add(self, hv: HeldVersion) -> None:
        with self.cv:
            self.versions[hv.version] = hv
            self.cv.notify_all()

    def flip(self, hv: HeldVersion) -> None:
        """Make `hv` current (it must be complete); forget versions beyond `keep_versions`, and incomplete ones older
        than the current one (their fetch failed: nobody asks for them again). A child streaming a forgotten version
        keeps its buffer alive until that stream ends (`WeightNode._stream` ends it when it waits for a chunk)."""
        assert hv.complete
        with self.cv:
            if self.current is None or hv.version >= self.current.version:
                self.current = hv
            cur = self.current.version
            done = sorted(v for v, h in self.versions.items() if h.complete)
            drop = [v for v in done[: max(0, len(done) - self.keep_versions)] if v != cur]
            drop += [v for v, h in self.versions.items() if not h.complete and v < cur]
            for v in drop:
                del self.versions[v]
            self.cv.notify_all()

    def wait_for(self, version: int, timeout_s: float) -> HeldVersion | None:
        with self.cv:
            # a version older than the current one that is not held will never arrive: answer now
            self.cv.wait_for(
                lambda: version in self.versions or (self.current is not None and self.current.version > version),
                timeout=timeout_s,
            )
            return self.versions.get(version)
