"""The controller's weight-fetch events: one `weights_applied` (or `weights_skipped`) row per weight version listing
its units, versus one row per unit and version (64 units × 10⁵ versions: 6.4 million rows, some 1.4 GB).

    unit's weights_applied / weights_skipped(v, source, encoding, …) ──▶ AppliedLog.add ──▶ pending (kind, v)
    every live unit reported v or a newer version, FLUSH_AFTER_S since its first report, or the controller ends
        ──▶ one event: {"t", "event": kind, "version": v, <fields the same for all its units>,
                        "units": {unit: {"t": when its report came, <its other fields>}}}
    readers: unit_rows(events) ──▶ one row per unit as before ({"t", "event", "agent", "version", "source", …})

A unit that reports a version after its row was written (late, or a version kept waiting FLUSH_AFTER_S) is written in
a second row of that version: readers take every row (`unit_rows`), and rows of jobs written one per unit pass
through as they are. A controller killed outright loses the reports of the last FLUSH_AFTER_S at most.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

KINDS = ("weights_applied", "weights_skipped")
FLUSH_AFTER_S = 10.0  # a version's reports wait at most this long for the units still to report it

Writer = Callable[..., Any]  # JobDir.event: (kind, **fields)


@dataclass
class _Pending:
    since: float  # time.monotonic() of its first report
    units: dict[str, dict[str, Any]] = field(default_factory=dict)  # unit → {"t", field: value}


class AppliedLog:
    """The units' reports of a version, held until each live unit has reported it (or a newer one), then written as
    one event per version and kind (module docstring)."""

    def __init__(self, write: Writer, *, flush_after_s: float = FLUSH_AFTER_S) -> None:
        self.write, self.flush_after_s = write, flush_after_s
        self.pending: dict[tuple[int, str], _Pending] = {}  # (version, kind) → its reports so far
        self.latest: dict[str, int] = {}  # unit → the newest version it reported (live units only, `flush`)

    def add(self, kind: str, unit: str, version: int, fields: dict[str, Any], *, now: float) -> None:
        """`unit` reported `version` (`kind`: applied or skipped) with `fields` (source, encoding, bytes …)."""
        assert kind in KINDS, kind
        entry = self.pending.setdefault((version, kind), _Pending(since=now))
        entry.units[unit] = {"t": round(time.time(), 3), **fields}
        self.latest[unit] = max(version, self.latest.get(unit, version))

    def flush(self, live: Iterable[str], *, now: float) -> None:
        """Write the versions every unit of `live` has reported (it or a newer one), and those waiting since
        `flush_after_s`. Units not in `live` are forgotten."""
        names = set(live)
        for gone in [u for u in self.latest if u not in names]:
            del self.latest[gone]
        for key in sorted(self.pending):
            version, entry = key[0], self.pending[key]
            if now - entry.since >= self.flush_after_s or all(self.latest.get(u, -1) >= version for u in names):
                self._write(key)

    def flush_all(self) -> None:
        """Write every version still held (the controller ends)."""
        for key in sorted(self.pending):
            self._write(key)

    def _write(self, key: tuple[int, str]) -> None:
        (version, kind), units = key, self.pending.pop(key).units
        self.write(kind, version=version, **common(units), units=units)


def common(units: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The fields (but the time) every unit of `units` has with the same value, taken out of each: said once."""
    rows = list(units.values())
    same = {k: v for k, v in rows[0].items() if k != "t" and all(k in r and r[k] == v for r in rows[1:])}
    for r in rows:
        for k in same:
            del r[k]
    return same


def unit_rows(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """`events` with each per-version `weights_applied` / `weights_skipped` row as one row per unit in it, as the
    controller wrote them before (`agent`, `version`, `t` of its report and its fields); other rows as they are."""
    out: list[dict[str, Any]] = []
    for e in events:
        units = e.get("units") if e.get("event") in KINDS else None
        if not isinstance(units, dict):
            out.append(e)
            continue
        shared = {k: v for k, v in e.items() if k not in ("t", "event", "version", "units")}
        for name, fields in units.items():
            out.append(
                {"t": e.get("t"), "event": e["event"], "agent": name, "version": e.get("version"), **shared, **fields}
            )
    return out
