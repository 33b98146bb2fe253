"""A summary.json that does not read, replaced by its repair (the launcher's: `update_summary`; a fetch of the
controller's copy: `fetch_record`): a reader at any moment finds the damaged file or the repair, versus the damaged
one moved aside before the repair was written, when `rlctl status` or the run's `wait` found no summary (its run's
end unknown). The damaged file is kept whole either way (rlctl.launch.summary.replace_damaged)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlctl.agents.messages import SIGTERM_FAILURE
from rlctl.launch.jobdir import JobDir
from rlctl.launch.record import fetch_record
from rlctl.ops.runstate import update_summary
from tests.unit.launch.test_stage import _controller_site

DAMAGED = '{"run": "r1", "state": "done", "iterations": 4, "heldout": {"prompts": 8, "greedy_rew'


def _watch_writes(monkeypatch: pytest.MonkeyPatch, summary: Path) -> list[bool]:
    """Whether `summary` was there as each file beside it was written (the aside's copy, the repair's temporary)."""
    there: list[bool] = []
    write_text, write_bytes, open_ = Path.write_text, Path.write_bytes, Path.open

    def noting(path: Path) -> None:
        if path.parent == summary.parent and path.name.startswith((".summary.json", "summary.json.")):
            there.append(summary.exists())

    def writing_text(path: Path, *args: Any, **kwargs: Any) -> int:
        noting(path)
        return write_text(path, *args, **kwargs)

    def writing_bytes(path: Path, data: Any) -> int:
        noting(path)
        return write_bytes(path, data)

    def opening(path: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if any(c in mode for c in "wxa"):
            noting(path)
        return open_(path, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", writing_text)
    monkeypatch.setattr(Path, "write_bytes", writing_bytes)
    monkeypatch.setattr(Path, "open", opening)
    return there


def test_the_launchers_repair_of_a_damaged_summary_never_leaves_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jd = JobDir.create("j", explicit=tmp_path / "job")
    jd.event("agent_started", agent="controller-0", run="r1")
    jd.event("job_end", state=f"failed: {SIGTERM_FAILURE}", iterations=4)
    jd.summary_json.write_text(DAMAGED)
    there = _watch_writes(monkeypatch, jd.summary_json)
    update_summary(jd, "r1", {"agent_exits": {"trainer-0": 3}})
    assert there and all(there), there
    assert (jd.path / "summary.json.damaged").read_text() == DAMAGED
    record = json.loads(jd.summary_json.read_text())
    assert (record["state"], record["iterations"], record["agent_exits"]) == (
        f"failed: {SIGTERM_FAILURE}",
        4,
        {"trainer-0": 3},
    )
    assert record["summary_damaged"].endswith("; kept as summary.json.damaged")


def test_a_fetch_over_a_damaged_summary_never_leaves_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, site, root = _controller_site(tmp_path)
    (root / "summary.json").write_text(json.dumps({"run": "r1", "state": "done", "iterations": 4}))
    (src / "summary.json").write_text(DAMAGED)
    there = _watch_writes(monkeypatch, src / "summary.json")
    fetch_record(src, site, "localhost", str(root))
    assert there and all(there), there
    assert (src / "summary.json.damaged").read_text() == DAMAGED
    record = json.loads((src / "summary.json").read_text())
    assert (record["run"], record["state"], record["iterations"]) == ("r1", "done", 4)
    assert record["summary_damaged"].endswith("; kept as summary.json.damaged")
