"""The controller's weight-transfer bookkeeping (`WeightBookkeeping`): each unit's fetch of a version booked
(bytes, the link it crossed), the versions every live unit holds timed, and a unit that holds a version asked for
its held-out evaluation."""

from __future__ import annotations

import time
from typing import Any

from rlctl.agents.controller_base import ControllerBase


class WeightBookkeeping(ControllerBase):
    """Which unit holds which version, and what its transfers cost."""

    def _transfer(self, who: str, version: int, header: dict[str, Any], *, applied: bool) -> None:
        """One unit fetched `version`: book its transfer (bytes, the link it crossed) and, when its engine applied
        it, whether every live unit now has that version (and the ones it skipped)."""
        wire = header.get("wire_bytes")
        wire_bytes = wire if isinstance(wire, int) else 0
        fetch = header.get("fetch_s")
        link = self.book.applied(
            who,
            datacenter=self.placement.datacenter(who),
            version=version,
            holder=str(header.get("holder", "")),
            encoding=str(header.get("encoding", "")),
            wire_bytes=wire_bytes,
            fetch_s=float(fetch) if isinstance(fetch, int | float) else 0.0,
        )
        self.metrics.weight_transfer_bytes.inc(wire_bytes)
        if link is not None:
            self.metrics.weight_inter_dc_bytes.labels(link).inc(wire_bytes)
            self.metrics.weight_inter_dc_copies.labels(link).inc()
        if applied:
            self._holds(who, version)

    def _flush_applied(self, now: float) -> None:
        """Write the units' weight-fetch reports of each version every live unit has reported (or waited long)."""
        self.applied.flush([u.name for u in self.core.units.values() if u.alive], now=now)

    def _holds(self, unit: str | None, version: int = -1) -> None:
        """`unit` holds `version` (applied, or (re)joined with it), or a unit was lost (None): the versions every
        live unit now has are delivered (the book times them)."""
        live = {u.name for u in self.core.units.values() if u.alive}
        now = time.monotonic()
        for seconds in self.book.settle(live, now) if unit is None else self.book.reached(unit, version, live, now):
            self.metrics.weight_transfer_seconds.observe(seconds)
            self.metrics.weight_last_unit_seconds.set(seconds)

    def _evaluate(self, unit: str, version: int) -> None:
        """`unit` holds `version`: it evaluates it when a version is due (and it takes work)."""
        u = self.core.units.get(unit)
        if self.evaluator is None or u is None or not u.alive or not u.reachable or u.draining:
            return
        if unit in self.core.isolating():
            return  # it runs a suspect prompt alone (or empties for one): the next unit to hold a version is asked
        self._send(self.evaluator.unit_at(unit, version))
