"""The scale events a run keeps for the status reply and summary.json: every one counted per direction, the latest
SCALE_EVENTS_KEPT listed, so that a run whose units come and go for weeks neither holds every event it had nor writes
them all into each summary.

    Scaler._scale_event ──▶ append(event) ──▶ counted (`totals`) ──▶ listed, the latest `keep` (older: counted only)
    a resumed run ──▶ ScaleLog(the scale events of the job's history it continues)
    status: latest(10);  summary.json: scale_events (listed), scale_events_unlisted, scale_totals
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Iterator
from typing import Any

# the scale events listed: the status reply shows the last 10; summary.json the rest of these (a run that added or
# removed more units than this says how many it left out, and counts every one per direction)
SCALE_EVENTS_KEPT = 256


class ScaleLog:
    """Scale events (dicts with a `direction`: out | in), counted per direction, the latest `keep` listed in order."""

    def __init__(self, events: Iterable[dict[str, Any]] = (), *, keep: int = SCALE_EVENTS_KEPT) -> None:
        self.keep = keep
        self.totals: Counter[str] = Counter()  # direction → events
        self._listed: deque[dict[str, Any]] = deque()
        for e in events:
            self.append(e)

    def append(self, event: dict[str, Any]) -> None:
        self.totals[str(event.get("direction", ""))] += 1
        self._listed.append(event)
        while len(self._listed) > self.keep:
            self._listed.popleft()  # counted still

    def latest(self, n: int | None = None) -> list[dict[str, Any]]:
        """The latest `n` listed (None: every one listed), oldest first."""
        listed = list(self._listed)
        return listed if n is None else listed[-n:] if n > 0 else []

    def unlisted(self) -> int:
        """The events counted that are no longer listed."""
        return sum(self.totals.values()) - len(self._listed)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._listed)

    def __len__(self) -> int:
        return len(self._listed)
