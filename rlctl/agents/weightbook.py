"""The controller's book of the weight plane: per version, who had it when, from whom, and what crossed
each inter-datacenter link (for `rlctl status`, metrics and the tests that count copies).

    trained(v) ──▶ published(v, t)
    weights_applied / weights_skipped(unit, v, holder, encoding, bytes) ──▶ applied(…): the transfer
    weights_applied(unit, v) ──▶ reached(…): a unit at v also "has" every older open version it skipped;
    a unit (re)joining at v        ──▶ reached(…)   a version is delivered when every live unit has it
    a unit lost                    ──▶ settle(…)    (the live units left may all have it)
                                                   └─▶ seconds_to_last_unit(v)
    an agent gone (the metrics row after it written,
    or a new hello replacing its record) ──▶ forget(…): the weight nodes' addresses its hello said (a trainer's: every
                                                   rank's root) go once the open versions each held then (a
                                                   unit's: those it had; a root's: every one) are delivered
                                                   or let go (a unit that pulled from it may report late)

A transfer crosses a link when the holder it came from (a trainer rank's root or a relay unit) is in
another datacenter than the unit: its bytes and one copy are added to that link `dc-a->dc-b`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class VersionRecord:
    version: int
    published_at: float | None = None
    units: int = 0  # transfers (units that pulled this version)
    bytes: int = 0  # payload bytes pulled, every hop
    fetch_s: float = 0.0  # slowest unit's fetch
    encodings: dict[str, int] = field(default_factory=dict)
    links: dict[str, dict[str, int]] = field(default_factory=dict)  # "dc-a->dc-b" → {bytes, copies}
    had_it: set[str] = field(default_factory=set)
    last_unit_s: float | None = None  # publication → the last live unit had it

    def view(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "units": self.units,
            "bytes": self.bytes,
            "fetch_s": round(self.fetch_s, 4),
            "encodings": dict(self.encodings),
            "inter_dc": {k: dict(v) for k, v in self.links.items()},
            "seconds_to_last_unit": None if self.last_unit_s is None else round(self.last_unit_s, 4),
        }


@dataclass
class WeightNode:
    """A weight node's address as a hello said it: whose node it is and where, and whether it is gone for good."""

    agent: str
    datacenter: str
    owner: str  # the agent whose hello said it (the trainer's, rank 0's name, for every rank's root)
    root: bool = False  # a trainer rank's root: it held every version published
    held: set[int] | None = None  # gone for good: the open versions it held as it went (kept while one is open)


class WeightBook:
    def __init__(self, *, keep_versions: int = 8) -> None:
        self.keep_versions = keep_versions
        self.nodes: dict[str, WeightNode] = {}  # weight-node address → its node
        self.versions: dict[int, VersionRecord] = {}
        self.totals: dict[str, dict[str, int]] = {}  # link → {bytes, copies}, over the whole job

    def node(self, address: str, *, agent: str, datacenter: str, root: bool = False, owner: str = "") -> None:
        """`agent`'s weight node at `address`: a rollout unit's, or (`root`) a trainer rank's root, which holds every
        version the trainer published. `owner` (`agent` where not given) is the agent whose hello said it, the one
        `forget` names: the trainer's ranks each have a root, and rank 0 says them all. A new agent at a gone one's
        address is a new node."""
        if address:
            self.nodes[address] = WeightNode(agent, datacenter, owner or agent, root)

    def forget(self, agent: str) -> None:
        """`agent` is gone for good: the weight nodes' addresses its hello said (a trainer's: every rank's root) go
        once every version each held as it went that was open (one not every live unit has yet) is delivered or let
        go (`keep_versions`), so that a run whose units come and go for weeks keeps those of the agents it has, each
        gone one for at most `keep_versions` versions. Until then a unit that pulled such a version from it and
        reports after it went still has its transfer booked on the link it crossed (dropped at once, its bytes were
        on no link). A unit held the versions it had; a trainer rank's root, every one (no version's `had_it` names a
        trainer rank). An address gone already keeps what it held when it went (a new agent of its name is not it)."""
        open_versions = {v for v, rec in self.versions.items() if rec.last_unit_s is None}
        for node in self.nodes.values():
            if node.owner != agent or node.held is not None:
                continue
            node.held = {v for v in open_versions if node.root or node.agent in self.versions[v].had_it}
        self._drop_gone()

    def _drop_gone(self) -> None:
        open_versions = {v for v, rec in self.versions.items() if rec.last_unit_s is None}
        for address in [a for a, n in self.nodes.items() if n.held is not None and not n.held & open_versions]:
            del self.nodes[address]

    def _record(self, version: int) -> VersionRecord:
        rec = self.versions.get(version)
        if rec is None:
            rec = self.versions[version] = VersionRecord(version)
            for v in sorted(self.versions)[: -self.keep_versions]:
                del self.versions[v]
            self._drop_gone()  # (a version let go is no longer open)
        return rec

    def published(self, version: int, t: float) -> None:
        self._record(version).published_at = t

    def applied(
        self,
        unit: str,
        *,
        datacenter: str,
        version: int,
        holder: str,
        encoding: str,
        wire_bytes: int,
        fetch_s: float,
    ) -> str | None:
        """Record one unit's transfer; returns the inter-DC link it crossed, if any."""
        rec = self._record(version)
        rec.units += 1
        rec.bytes += wire_bytes
        rec.fetch_s = max(rec.fetch_s, fetch_s)
        rec.encodings[encoding] = rec.encodings.get(encoding, 0) + 1
        src = self.nodes.get(holder)
        if src is None or src.datacenter == datacenter:
            return None
        link = f"{src.datacenter}->{datacenter}"
        for book in (rec.links, self.totals):
            entry = book.setdefault(link, {"bytes": 0, "copies": 0})
            entry["bytes"] += wire_bytes
            entry["copies"] += 1
        return link

    def reached(self, unit: str, version: int, live: set[str], t: float) -> list[float]:
        """`unit` now holds `version` (and so every older version); returns the publication-to-last-unit
        seconds of the versions this completes."""
        for v, rec in self.versions.items():
            if v <= version and rec.last_unit_s is None:
                rec.had_it.add(unit)
        return self.settle(live, t)

    def settle(self, live: set[str], t: float) -> list[float]:
        """The versions not yet delivered that some unit had and every unit of `live` has now (one reached them,
        or the units they waited on were lost): their publication-to-last-unit seconds, in version order."""
        done = []
        for v in sorted(self.versions):
            rec = self.versions[v]
            if rec.last_unit_s is None and rec.published_at is not None and rec.had_it and live <= rec.had_it:
                rec.last_unit_s = t - rec.published_at
                done.append(rec.last_unit_s)
        if done:
            self._drop_gone()
        return done

    def view(self, last: int = 4) -> list[dict[str, Any]]:
        return [self.versions[v].view() for v in sorted(self.versions)[-last:]]
