"""The metrics rows `rlctl report` holds: every one of a run of up to REPORT_ROWS iterations, else runs of k
consecutive ones, each merged into one row (`merged`, `Run.row`), so that what the report reads, holds and draws
follows REPORT_ROWS, not the job's age.

    metrics.jsonl (10⁵ rows after weeks, a few kB each: its agents' figures) ─▶ count_lines ─▶ k = ⌈rows / REPORT_ROWS⌉
        ─▶ each row as it is read ─▶ Run.add ─▶ every k: Run.row ─▶ the report's rows (≤ REPORT_ROWS)

A merged row reads as the iterations it stands for: the time they took, the means of their figures, their rates over
that time, each agent's busy seconds at their end; `MERGED` says how many (the busy panel draws it that wide).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the most metrics rows the report holds and draws: every one parsed held some 31 kB a row of 64 agents (GBs after
# weeks), and the busy panel drew a bar per agent and iteration
REPORT_ROWS = 2000


def count_lines(path: Path) -> int:
    """The lines of `path` (its newlines), read in pieces of 64 KiB."""
    with path.open("rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 16), b""))


MERGED = "merged_iterations"  # in a row the report holds: how many metrics rows it stands for (`merged`; absent: 1)
MEAN_FIGURES = ("reward_mean", "t_gen_s", "t_train_s", "delta_s", "delta_prime_s")  # over the rows merged
RATES = ("samples_per_s", "tokens_per_s")  # over the time the rows merged took


def merged(rows: Iterable[dict[str, Any]], every: int) -> Iterator[dict[str, Any]]:
    """`rows` (metrics rows, in order) in runs of `every` consecutive ones (the last may be shorter), each one row
    (`Run.row`), taken in as they are read: nothing but the run's sums and its agents is held."""
    run = Run()
    for row in rows:
        run.add(row)
        if run.count == every:
            yield run.row()
            run = Run()
    if run.count:
        yield run.row()


@dataclass
class Run:
    """Consecutive metrics rows merged into one (`row`)."""

    count: int = 0
    last: dict[str, Any] = field(default_factory=dict)
    period_s: float = 0.0
    sums: dict[str, float] = field(default_factory=dict)  # figure → its sum over the rows with a number for it
    numbers: dict[str, int] = field(default_factory=dict)  # figure → the rows with a number for it
    rates: dict[str, float | None] = field(default_factory=dict)  # rate → its sum × period_s (None: one not a number)
    agents: dict[str, Any] = field(default_factory=dict)  # agent → as the run last listed it

    def add(self, row: dict[str, Any]) -> None:
        self.count, self.last = self.count + 1, row
        period = float(row["period_s"])
        self.period_s += period
        for key in MEAN_FIGURES:
            if row.get(key) is not None:
                self.sums[key] = self.sums.get(key, 0.0) + float(row[key])
                self.numbers[key] = self.numbers.get(key, 0) + 1
        for key in RATES:
            x, total = row.get(key), self.rates.get(key, 0.0)
            if x is not None and (isinstance(x, bool) or not isinstance(x, int | float)):
                self.rates[key] = None  # (edited into text: the last row's stays)
            elif total is not None:
                self.rates[key] = total + float(x or 0.0) * period
        self.agents.update(row.get("agents") or {})

    def row(self) -> dict[str, Any]:
        """The last row's (its iteration, units, times), with the time the run took (`period_s`), the means of its
        figures (`MEAN_FIGURES`: null where none has a number), its rates over that time, each agent as it last
        listed it (its busy seconds count on: `busy_fractions` reads what it did over the time merged) and how many
        rows it merged (`MERGED`). A run of one is that row."""
        if self.count == 1:
            return self.last
        out = {**self.last, "period_s": self.period_s, MERGED: self.count, "agents": self.agents}
        for key in MEAN_FIGURES:
            out[key] = self.sums[key] / self.numbers[key] if key in self.sums else None
        for key, total in self.rates.items():
            if total is not None and self.period_s > 0 and key in self.last:
                out[key] = total / self.period_s
        return out
