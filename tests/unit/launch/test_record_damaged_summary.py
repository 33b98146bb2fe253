"""A fetch of the controller site's record into a job dir whose summary.json does not read (cut short, edited): the
damaged file is kept aside whole (summary.json.damaged, then .damaged.2) and the fetched summary says where, versus
replaced by the controller's copy, the launcher's keys it held (held-out figures, agent exits) gone with it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rlctl.launch.record import fetch_record
from tests.unit.launch.test_stage import _controller_site


def test_a_fetch_over_a_damaged_summary_keeps_it_aside(tmp_path: Path) -> None:
    src, site, root = _controller_site(tmp_path)
    (root / "summary.json").write_text(json.dumps({"run": "r1", "state": "done", "iterations": 4}))
    damaged = '{"run": "r1", "state": "done", "iterations": 4, "heldout": {"prompts": 8, "greedy_rew'
    (src / "summary.json").write_text(damaged)
    fetch_record(src, site, "localhost", str(root))
    assert (src / "summary.json.damaged").read_text() == damaged
    record = json.loads((src / "summary.json").read_text())
    assert (record["run"], record["state"], record["iterations"]) == ("r1", "done", 4)
    assert record["summary_damaged"].startswith(f"{src / 'summary.json'}: not valid JSON")
    assert record["summary_damaged"].endswith("; kept as summary.json.damaged")
    fetch_record(src, site, "localhost", str(root))  # a fetch again of the same run still says where it is
    assert json.loads((src / "summary.json").read_text())["summary_damaged"] == record["summary_damaged"]
    (src / "summary.json").write_text("[]")  # damaged again: the first one kept stays as it is
    fetch_record(src, site, "localhost", str(root))
    assert (src / "summary.json.damaged").read_text() == damaged
    assert (src / "summary.json.damaged.2").read_text() == "[]"
    record = json.loads((src / "summary.json").read_text())
    assert record["summary_damaged"].endswith(": not a JSON object but list; kept as summary.json.damaged.2")


@pytest.mark.parametrize(
    ("theirs", "says"),
    [('{"run": "r1", "state": "done", "itera', "not valid JSON"), ("[]", "not a JSON object but list")],
)
def test_a_fetch_of_a_damaged_summary_keeps_the_one_here(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, theirs: str, says: str
) -> None:
    """The controller's copy that does not read is not written over the launcher's, which does (its held-out figures
    were lost with it); the skip is said once however often it is fetched."""
    src, site, root = _controller_site(tmp_path)
    (root / "summary.json").write_text(theirs)
    mine = json.dumps({"run": "r1", "state": "done", "heldout": {"prompts": 8}, "agent_exits": {"trainer-0": 0}})
    (src / "summary.json").write_text(mine)
    with caplog.at_level(logging.WARNING, logger="rlctl.launch.record"):
        assert "summary.json" not in fetch_record(src, site, "localhost", str(root))
        fetch_record(src, site, "localhost", str(root))
    assert (src / "summary.json").read_text() == mine
    assert [p.name for p in src.glob("summary.json.*")] == []
    said = [r.getMessage() for r in caplog.records if "summary" in r.getMessage()]
    assert len(said) == 1 and f"{root / 'summary.json'}: {says}" in said[0], said


@pytest.mark.parametrize(
    ("theirs", "says"),
    [('{"run": "r1", "state": "done", "itera', "not valid JSON"), ("[]", "not a JSON object but list")],
)
def test_fetches_of_a_damaged_summary_with_none_here_keep_nothing_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, theirs: str, says: str
) -> None:
    """The controller's copy that does not read is written in once where there is none here (the run's end is read
    from the events, the launcher's keys written with it); a fetch again leaves it as it is, versus moved it aside as
    damaged and wrote it in again: one more summary.json.damaged.N every `rlctl status`."""
    src, site, root = _controller_site(tmp_path)
    (root / "summary.json").write_text(theirs)
    with caplog.at_level(logging.WARNING, logger="rlctl.launch.record"):
        fetched = [fetch_record(src, site, "localhost", str(root)) for _ in range(3)]
    assert sorted(p.name for p in src.glob("summary.json*")) == ["summary.json"]
    assert (src / "summary.json").read_text() == theirs
    assert ["summary.json" in names for names in fetched] == [True, False, False]
    said = [r.getMessage() for r in caplog.records if "summary" in r.getMessage()]
    assert len(said) == 1 and f"{root / 'summary.json'}: {says}" in said[0], said
    (root / "summary.json").write_text(json.dumps({"run": "r1", "state": "done"}))  # whole there again: fetched
    fetch_record(src, site, "localhost", str(root))
    assert (src / "summary.json.damaged").read_text() == theirs
    record = json.loads((src / "summary.json").read_text())
    where = record.pop("summary_damaged")
    assert where.startswith(f"{src / 'summary.json'}: {says}") and where.endswith("; kept as summary.json.damaged")
    assert record == {"run": "r1", "state": "done"}


def test_a_fetch_over_a_summary_here_that_cannot_be_read_leaves_it_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """summary.json here that cannot be read (no read permission for this user; root reads any, so the refusal is
    the OS's error as a read of it raises it): it stays as it is, said once; versus taken for none there and the
    controller's copy renamed over it, the launcher's keys it held (held-out figures) lost."""
    import errno

    from rlctl.launch import record

    src, site, root = _controller_site(tmp_path)
    (root / "summary.json").write_text(json.dumps({"run": "r1", "state": "done", "iterations": 4}))
    mine = json.dumps({"run": "r1", "state": "done", "iterations": 4, "heldout": {"prompts": 8}})
    (src / "summary.json").write_text(mine)
    read_summary = record.read_summary

    def unreadable(path: Path) -> object:
        if path == src / "summary.json":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return read_summary(path)

    monkeypatch.setattr(record, "read_summary", unreadable)
    with caplog.at_level(logging.WARNING, logger="rlctl.launch.record"):
        assert "summary.json" not in fetch_record(src, site, "localhost", str(root))
        fetch_record(src, site, "localhost", str(root))
    assert (src / "summary.json").read_text() == mine  # was: the controller's copy, no held-out figures
    said = [r.getMessage() for r in caplog.records if "summary" in r.getMessage()]
    assert said == [
        f"{src / 'summary.json'}: cannot be read (Permission denied); kept as it is, the controller's summary "
        f"localhost:{root / 'summary.json'} not fetched over it"
    ], said
