"""The controller site's events merge into the operator's events.jsonl by what they grew (`rlctl.launch.eventtail`),
as the whole merge (`record._merge_lines`) would merge them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlctl.config.inventory import Site
from rlctl.launch import eventtail, record
from rlctl.launch.jobdir import JobDir, event_time
from rlctl.launch.record import fetch_record
from rlctl.launch.sitefs import site_root
from rlctl.ops.runstate import current_run


def _site(tmp_path: Path) -> tuple[Path, Site, Path]:
    """The operator's job dir, a local site with a workdir of its own, and the job's root there."""
    src = tmp_path / "op" / "job-1"
    src.mkdir(parents=True)
    site = Site.model_validate(
        {
            "datacenter": "a",
            "gpu": "CPU",
            "nodes": [{"host": "localhost", "gpus": 2}],
            "scheduler": {"kind": "local", "workdir": str(tmp_path / "w")},
        }
    )
    root = Path(site_root(site, "job-1", here=src))
    root.mkdir(parents=True)
    return src, site, root


def _add(path: Path, *rows: dict[str, object] | str) -> None:
    with path.open("a") as f:
        f.write("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def _whole_merge(src: Path, root: Path, tmp_path: Path) -> list[str]:
    """What the whole merge makes of events.jsonl here and the site's now."""
    (tmp_path / "whole").mkdir(exist_ok=True)
    copy = tmp_path / "whole" / "events.jsonl"
    shutil.copy(src / "events.jsonl", copy)
    return "".join(record._merge_lines(copy, root / "events.jsonl")).splitlines()


def _site_events(n: int, *, t0: float = 1000.0) -> list[dict[str, object]]:
    return [{"t": t0 + i, "event": "weights_applied", "agent": f"rollout-{i % 4}", "version": i // 4} for i in range(n)]


def test_a_fetch_appends_the_sites_new_events_and_reads_not_every_event_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each `rlctl status` of a job whose controller ran on another site read both files whole, parsed and sorted
    # every line and wrote events.jsonl again: at 64 units × 10⁴ weight versions, 130 MB and seconds a status
    src, site, root = _site(tmp_path)
    _add(src / "events.jsonl", {"t": 1.0, "event": "launch"})
    _add(root / "events.jsonl", *_site_events(400))
    fetch_record(src, site, "localhost", str(root))  # the first: the whole merge
    inode = (src / "events.jsonl").stat().st_ino
    _add(root / "events.jsonl", *_site_events(3, t0=5000.0))
    want = _whole_merge(src, root, tmp_path)
    whole = record._merge_lines
    merged: list[Path] = []
    monkeypatch.setattr(record, "_merge_lines", lambda a, b: merged.append(a) or whole(a, b))
    assert "events.jsonl" in fetch_record(src, site, "localhost", str(root))
    assert (src / "events.jsonl").read_text().splitlines() == want
    assert merged == [] and (src / "events.jsonl").stat().st_ino == inode  # appended in place
    assert len(want) == 404


@pytest.mark.parametrize(
    "case", ["newer", "operator_event_pushed", "older_than_the_last_here", "cut_by_a_resume", "damaged", "same_time"]
)
def test_the_sites_new_events_merge_as_the_whole_merge_would(tmp_path: Path, case: str) -> None:
    src, site, root = _site(tmp_path)
    jd = JobDir(src)
    _add(src / "events.jsonl", {"t": 1.0, "event": "launch"})
    site_file = root / "events.jsonl"
    _add(site_file, *_site_events(50))
    fetch_record(src, site, "localhost", str(root))
    if case == "newer":
        _add(site_file, *_site_events(5, t0=2000.0))
    elif case == "operator_event_pushed":  # `rlctl stop`'s event here and on the site (`event_to_record`)
        row = jd.event("stop_requested")
        _add(site_file, *_site_events(2, t0=row["t"] - 0.5), json.dumps(row), *_site_events(2, t0=row["t"] + 1))
    elif case == "older_than_the_last_here":  # the site's clock behind
        _add(site_file, *_site_events(3, t0=1010.5))
    elif case == "cut_by_a_resume":  # the site's file cut back, then grew: fetched whole again
        lines = site_file.read_text().splitlines()[:20]
        site_file.write_text("".join(line + "\n" for line in lines))
        _add(site_file, *_site_events(40, t0=3000.0))
    elif case == "damaged":
        _add(site_file, '{"t": 2000, "ev', *_site_events(2, t0=2001.0))
    else:  # a new event at the time of the last here
        _add(site_file, {"t": 1049.0, "event": "scale"})
    want = _whole_merge(src, root, tmp_path)
    fetch_record(src, site, "localhost", str(root))
    assert (src / "events.jsonl").read_text().splitlines() == want
    _add(site_file, *_site_events(2, t0=9000.0))  # and the next merge still reads on from there
    want = _whole_merge(src, root, tmp_path)
    fetch_record(src, site, "localhost", str(root))
    assert (src / "events.jsonl").read_text().splitlines() == want


def test_a_reader_of_some_kinds_of_events_parses_only_the_lines_that_name_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # the run id (`current_run`: every status of an ended job, scale, the launcher), a resume's count and start
    # offset, the checkpoint to resume from: each parsed every event of the job, 640,000 lines after weeks
    jd = JobDir.create("ev", explicit=tmp_path / "job")
    _add(jd.events, {"t": 1.0, "event": "agent_started", "agent": "controller-0", "run": "r1"})
    _add(jd.events, *_site_events(300), '{"t": 5, "ev')  # a line cut short: left out, said once
    _add(jd.events, {"t": 6.0, "event": "agent_started", "agent": "controller-0", "run": "r2"})
    _add(jd.events, *_site_events(300, t0=2000.0), '{"t": 7, "event": "agent_st')  # the last: being written
    parsed: list[str] = []
    loads = json.loads
    monkeypatch.setattr(json, "loads", lambda s, *a, **k: parsed.append(s) or loads(s, *a, **k))
    assert current_run(jd) == "r2"
    assert len(parsed) == 4  # the two agent_started, the line cut short and the last line
    assert caplog.text.count("line 302 is not valid JSON") == 1
    assert [e["run"] for e in jd.read_events("agent_started")] == ["r1", "r2"]
    monkeypatch.setattr(json, "loads", loads)
    assert len(jd.read_events()) == 602  # every kind: as before


NO_TIME = ['{"t": null, "event": "launch"}', '{"t": "x", "event": "scale"}', '{"event": "note"}']


@pytest.mark.parametrize(("t", "want"), [(None, 0.0), ("x", 0.0), (True, 0.0), (float("nan"), 0.0), (5, 5.0)])
def test_the_one_rule_for_an_events_time(t: object, want: float) -> None:
    # `event_time`: the rule the whole merge and the tail (below) read a row's time by, as status, stop and report do
    assert event_time({"t": t}) == want and event_time({}) == 0.0
    assert eventtail._time(json.dumps({"t": t})) == want and eventtail._time("[1]") is None


def test_the_whole_merge_keeps_an_event_without_a_usable_time_as_event_time_reads_it(tmp_path: Path) -> None:
    # every reader of an event's time (`event_time`) takes a row whose t is null or text (an older version's, an
    # edited one) as an event at time 0; the merge set it aside in events.jsonl.damaged, out of every later reader
    src, site, root = _site(tmp_path)
    _add(src / "events.jsonl", {"t": 1.0, "event": "launch"})
    _add(root / "events.jsonl", *_site_events(2), *NO_TIME)
    fetch_record(src, site, "localhost", str(root))
    assert (src / "events.jsonl").read_text().splitlines() == [
        *NO_TIME, '{"t": 1.0, "event": "launch"}', *(json.dumps(e) for e in _site_events(2))
    ]  # fmt: skip
    assert not (src / "events.jsonl.damaged").exists()
    assert [e["event"] for e in JobDir(src).read_events("scale", "note")] == ["scale", "note"]


def test_the_sites_new_events_append_after_an_event_without_a_usable_time(tmp_path: Path) -> None:
    # the tail took such a line here for one that is no JSON event, and sent every fetch after to the whole merge
    local, mirror = tmp_path / "events.jsonl", tmp_path / ".site-events.jsonl"
    _add(local, NO_TIME[0])
    mirror.write_text("")
    eventtail.mark(local, mirror)
    _add(mirror, *_site_events(2), NO_TIME[1])
    # appended as the whole merge orders them: at time 0 (after the one here), then by time
    assert eventtail.tail(local, mirror) == "".join(
        [NO_TIME[1] + "\n", *(json.dumps(e) + "\n" for e in _site_events(2))]
    )
