"""The controller writes one `weights_applied` (or `weights_skipped`) event per weight version listing its units,
versus one per unit and version: the rows that made events.jsonl grow by 64 rows a version with 64 units
(rlctl.agents.appliedlog). `unit_rows` gives its readers the rows per unit as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlctl.agents.messages import make
from tests.unit.controller_harness import HandledController, small_job

TRANSFER = {"holder": "w-trainer-0", "encoding": "full", "wire_bytes": 1000, "xxh3": "00000000deadbeef"}


def _rows(r: HandledController, kind: str = "weights_applied") -> list[dict[str, Any]]:
    return [e for e in r.jd.read_lines(r.jd.events) if e["event"] == kind]


def test_a_version_applied_by_every_unit_is_one_event_listing_them(tmp_path: Path) -> None:
    r = HandledController(tmp_path, small_job("applied", iterations=3), listen="inproc://controller-applied-1")
    try:
        r.feed("rollout-0", make("weights_applied", {"version": 1, **TRANSFER, "fetch_s": 0.25}))
        assert _rows(r) == []  # was: rollout-0's row at once, then rollout-1's
        r.feed("rollout-1", make("weights_applied", {"version": 1, **TRANSFER, "fetch_s": 0.5}))
        (row,) = _rows(r)
        assert row["version"] == 1 and (row["source"], row["encoding"], row["bytes"]) == ("trainer-0", "full", 1000)
        assert {u: f["fetch_s"] for u, f in row["units"].items()} == {"rollout-0": 0.25, "rollout-1": 0.5}
        assert all(isinstance(f["t"], float) for f in row["units"].values())  # when each report came
        # a skipped version (fetched, overtaken) is its own kind's row, written once both units reported v1 or newer
        r.feed("rollout-0", make("weights_skipped", {"version": 1, **TRANSFER, "fetch_s": 0.1}))
        assert [e["units"].keys() for e in _rows(r, "weights_skipped")] == [{"rollout-0": 0}.keys()]
    finally:
        r.close()


def test_the_versions_still_held_are_written_when_the_controller_ends(tmp_path: Path) -> None:
    r = HandledController(tmp_path, small_job("applied", iterations=3), listen="inproc://controller-applied-2")
    try:
        r.feed("rollout-0", make("weights_applied", {"version": 1, **TRANSFER}))
        assert _rows(r) == []  # rollout-1 has not reported v1
        r.ctl.applied.flush_all()  # (`_shutdown`'s, before job_end)
        assert [list(e["units"]) for e in _rows(r)] == [["rollout-0"]]
        lines = r.jd.events.read_text().splitlines()
        assert all(json.loads(line)["event"] != "weights_applied" or "units" in line for line in lines)
    finally:
        r.close()


def test_the_versions_still_held_are_on_disk_before_the_ending_controller_waits_for_its_agents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_shutdown` waits for the agents' byes and a graceful stop's checkpoint (up to the stop's grace), and books no
    weight report meanwhile: a controller killed there (the grace's end, a time limit's SIGKILL after its SIGTERM)
    lost the reports it held, which were written only after that wait."""
    r = HandledController(tmp_path, small_job("applied", iterations=3), listen="inproc://controller-applied-3")
    try:
        r.feed("rollout-0", make("weights_applied", {"version": 1, **TRANSFER}))
        on_disk: list[list[list[str]]] = []

        def waiting(**_: float) -> bool:  # (the wait's first look: what a kill now leaves behind)
            on_disk.append([list(e["units"]) for e in _rows(r)])
            return False

        monkeypatch.setattr(r.ctl, "_waiting", waiting)
        r.ctl._shutdown()
        assert on_disk == [[["rollout-0"]]]  # was: [[]], the row written after the wait
        assert [list(e["units"]) for e in _rows(r)] == [["rollout-0"]]  # once
    finally:
        r.close()
