"""AppliedLog: when a version's row is written (every live unit reported it or a newer one; a unit that never
does holds it FLUSH_AFTER_S at most), and `unit_rows` giving back the per-unit rows, older jobs' rows as they are."""

from __future__ import annotations

from typing import Any

from rlctl.agents.appliedlog import AppliedLog, unit_rows


class _Events:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def __call__(self, kind: str, **fields: Any) -> None:
        self.rows.append({"t": 100.0, "event": kind, **fields})


def _fields(source: str, fetch_s: float, **more: Any) -> dict[str, Any]:
    return {"source": source, "encoding": "delta", "base": 1, "bytes": 10, "fetch_s": fetch_s, "xxh3": "ab", **more}


def test_a_version_waits_for_each_live_unit_or_its_bound() -> None:
    events = _Events()
    log = AppliedLog(events, flush_after_s=10.0)
    log.add("weights_applied", "r0", 2, _fields("trainer-0", 0.5), now=0.0)
    log.add("weights_applied", "r1", 2, _fields("r0", 0.25), now=1.0)
    log.flush(["r0", "r1", "r2"], now=1.0)
    assert events.rows == []  # r2 has not reported v2
    log.add("weights_applied", "r2", 3, _fields("trainer-0", 0.5, bytes=30), now=2.0)  # a newer one: v2 skipped by it
    log.flush(["r0", "r1", "r2"], now=2.0)
    (v2,) = events.rows
    assert v2["version"] == 2 and set(v2["units"]) == {"r0", "r1"}
    assert {k: v2[k] for k in ("encoding", "base", "bytes", "xxh3")} == {
        "encoding": "delta",
        "base": 1,
        "bytes": 10,
        "xxh3": "ab",
    }
    assert "source" not in v2 and v2["units"]["r1"]["source"] == "r0"  # what differs stays with each unit
    log.flush(["r0", "r1", "r2"], now=11.9)
    assert len(events.rows) == 1  # v3: r0 and r1 have not reported it, 9.9 s
    log.flush(["r0", "r1", "r2"], now=12.0)
    assert [e["version"] for e in events.rows] == [2, 3]  # its bound passed
    log.add("weights_applied", "r0", 3, _fields("r2", 0.1), now=13.0)  # late: a second row of v3
    log.flush(["r0"], now=13.0)  # r1 and r2 gone: forgotten
    assert [(e["version"], list(e["units"])) for e in events.rows[1:]] == [(3, ["r2"]), (3, ["r0"])]
    assert log.pending == {} and log.latest == {"r0": 3}


def test_unit_rows_are_the_rows_per_unit_as_written_before() -> None:
    events = _Events()
    log = AppliedLog(events)
    before = []
    for unit, source, fetch_s in [("r0", "trainer-0", 0.5), ("r1", "r0", 0.25)]:
        log.add("weights_skipped", unit, 4, _fields(source, fetch_s), now=0.0)
        t = log.pending[(4, "weights_skipped")].units[unit]["t"]
        before.append({"t": t, "event": "weights_skipped", "agent": unit, "version": 4, **_fields(source, fetch_s)})
    log.flush_all()
    old = {"t": 1.0, "event": "weights_applied", "agent": "r0", "version": 3, "source": "trainer-0"}  # an older job's
    other = {"t": 2.0, "event": "trained", "version": 4}
    assert unit_rows([old, other, *events.rows]) == [old, other, *before]
