"""What the controller keeps of its metrics rows (metrics.jsonl holds them all): the figures `status` and
summary.json read, as running totals — the reward curve, the sums of the means, samples per staleness gap — and the
last rows, so that a run of a hundred thousand iterations keeps a few MB, not every row it wrote.

    rows a resume kept ─▶ RowBook(rows, kept=…) (or .add_kept each as `cut_metrics` reads it) ─▶ .add(row) per
    trained iteration ─▶ views.status / views.summary
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import Any, TypeGuard

from rlctl.launch.jobdir import event_time

# the figures summary.json averages over every iteration (views.summary)
MEANS = ("t_gen_s", "t_train_s", "delta_s")
PACE_ROWS = 20  # `status` estimates the time left from the pace of this many last iterations
TAIL_ROWS = 4  # the last rows of any run kept whole (the summary's throughput reads the iterations the core has)


class RowBook:
    """Every metrics row's figures that the views read. The first `kept` rows are a resumed run's earlier ones (their
    times are not this run's pace); this run's rows start past them and past the last place where a new run begins:
    its `resumes` (the resumes before the row's run) changes, or wall_s goes back (in rows written when it counted
    from their own controller's start; it continues across resumes now)."""

    def __init__(self, rows: Iterable[dict[str, Any]] = (), *, kept: int = 0) -> None:
        self.kept = kept
        self.count = 0
        self.reward_curve: list[float] = []
        self.sums = dict.fromkeys(MEANS, 0.0)
        self.counts = dict.fromkeys(MEANS, 0)  # the rows with a number for each (a kept row may have null there)
        self.staleness: dict[str, int] = {}  # samples per staleness gap (versions behind, as a string key)
        self.tail: deque[dict[str, Any]] = deque(maxlen=TAIL_ROWS)
        self.pace: deque[dict[str, Any]] = deque(maxlen=PACE_ROWS + 1)  # this run's last rows
        for row in rows:
            self.add(row)

    def add(self, row: dict[str, Any]) -> None:
        """Count one more row (the newest). A figure a kept row has no number for (null, text, missing: a row of an
        older version, an edited one) is left out of its curve, mean or counts, as `event_time` passes over a time."""
        if self.count >= max(self.kept, 1) and self.tail and _new_run(self.tail[-1], row):
            self.pace.clear()  # a new run began at this row
        if self.count >= self.kept:
            self.pace.append(row)
        self.count += 1
        if _number(row.get("reward_mean")):
            self.reward_curve.append(row["reward_mean"])
        for key in MEANS:
            if _number(row.get(key)):
                self.sums[key] += row[key]
                self.counts[key] += 1
        staleness = row.get("staleness")
        for gap, n in staleness.items() if isinstance(staleness, dict) else ():
            if isinstance(n, int) and not isinstance(n, bool):  # samples: a count
                self.staleness[gap] = self.staleness.get(gap, 0) + n
        self.tail.append(row)

    def add_kept(self, row: dict[str, Any]) -> None:
        """Count one more of the rows a resume kept (the runs' before this one: none is this run's pace), as
        `RowBook(rows, kept=len(rows))` counts each, versus `kept` known only once every row was read."""
        assert self.count == self.kept, "the rows a resume kept come before this run's"
        self.kept += 1
        self.add(row)

    @property
    def last(self) -> dict[str, Any] | None:
        """The newest row, None before the first."""
        return self.tail[-1] if self.tail else None

    def rate(self, key: str) -> float | None:
        """Per-second figure `key` of the rows (samples_per_s, tokens_per_s) over this run's last PACE_ROWS rows:
        what they did in all over the time they took. One row's own is its iteration's: in async mode iterations
        end in bursts, a gap of milliseconds between two (3,836 samples/s once, where the run did 76). None before
        the first row."""
        rows = list(self.pace)[-PACE_ROWS:]
        span = sum(float(r.get("period_s") or 0.0) for r in rows)
        if span <= 0:
            return None
        return round(sum(float(r.get(key) or 0.0) * float(r.get("period_s") or 0.0) for r in rows) / span, 2)

    def mean(self, key: str) -> float | None:
        """The mean of figure `key` (one of MEANS) over every row with a number for it, None before the first."""
        return round(self.sums[key] / self.counts[key], 4) if self.counts[key] else None


def _new_run(before: dict[str, Any], row: dict[str, Any]) -> bool:
    """Whether `row` is the first of a run after `before`'s: its `resumes` differs, or its wall_s is below `before`'s
    (rows written before they continued across resumes; within a run wall_s never goes back)."""
    if row.get("resumes", 0) != before.get("resumes", 0):
        return True
    was, at = before.get("wall_s"), row.get("wall_s")
    return was is not None and at is not None and at < was


def _number(value: Any) -> TypeGuard[int | float]:
    """Whether `value` is a finite number (not a bool, null or text)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def timed(row: dict[str, Any]) -> bool:
    """Whether a kept row says when the job's first controller started (`job_start_offset`): a number for its `t`
    and its `wall_s`."""
    return _number(row.get("t")) and _number(row.get("wall_s"))


def job_start_offset(kept: Iterable[dict[str, Any]], events: list[dict[str, Any]], *, now: float) -> float:
    """Seconds from the job's first controller start to `now` (time.time() when a resumed run's controller started),
    which its rows' wall_s adds: from the rows the resume kept (a row's t − wall_s is when the job's first controller
    started: their wall_s continued from it too, or they are the first run's), else from the job's first
    `controller_listening` event (a moment after that start); 0 when neither says. A row without a number for `t`
    or `wall_s` (null, text: an edited file) is passed over, as `event_time` reads one."""
    for r in kept:
        if timed(r):
            return round(max(0.0, now - (float(r["t"]) - float(r["wall_s"]))), 3)
    started = [event_time(e) for e in events if e.get("event") == "controller_listening" and event_time(e) > 0]
    return round(max(0.0, now - min(started)), 3) if started else 0.0
