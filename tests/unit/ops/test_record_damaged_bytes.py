"""A file of a job's record holding bytes that are no UTF-8 (a disk's damage, another tool's write), or a directory in
its place: status, stop, resume, pull and report say the file (and line) in one line, or read past a damaged event as
they read past a line cut short, versus a UnicodeDecodeError or IsADirectoryError traceback."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rlctl.errors import LaunchError, RlctlError
from rlctl.launch import record
from rlctl.launch.backends import recorded_agents
from rlctl.launch.jobdir import JobDir
from rlctl.ops import operate
from rlctl.ops.autoresume import first_event_time
from rlctl.ops.jobref import JobRef
from rlctl.ops.runstate import current_run, run_summary, run_warnings, stop_requested
from rlctl.report import build_report
from tests.unit.job_rows import indexed_row
from tests.unit.report.fake_jobdir import make_job_dir

GARBAGE = b"\x00\xff\xfe\x80 not text\n"


def _job(tmp_path: Path) -> JobDir:
    jd = JobDir.create("bytes", explicit=tmp_path / "bytes")
    (jd.path / "agents.jsonl").write_text("")
    jd.event("agent_started", agent="controller-0", run="r1")
    with jd.events.open("ab") as f:
        f.write(GARBAGE)
    jd.event("stop_requested")
    return jd


def test_an_event_line_of_bytes_that_are_no_text_is_left_out_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert current_run(jd) == "r1"
        assert stop_requested(jd, since=0.0)
        assert [e["event"] for e in jd.read_events()] == ["agent_started", "stop_requested"]
        ref = JobRef("bytes1", jd, indexed_row("bytes1", jd.path, job="bytes", state="running"))
        s, _complete = operate.job_status(ref, timeout_s=2.0)
        assert s["index_state"] == "running"
    said = {r.getMessage() for r in caplog.records}
    assert any(m.startswith(f"{jd.events}: line 2 is not valid JSON") and m.endswith("left out") for m in said)


def test_a_metrics_or_agents_line_of_bytes_that_are_no_text_is_named_by_its_file_and_line(tmp_path: Path) -> None:
    jd = _job(tmp_path)
    jd.metrics.write_bytes(b'{"iteration": 0}\n' + GARBAGE + b'{"iteration": 1}\n')
    with pytest.raises(LaunchError, match=r"metrics\.jsonl: line 2 is not valid JSON"):
        jd.read_lines(jd.metrics)
    (jd.path / "agents.jsonl").write_bytes(GARBAGE + b"{}\n")
    with pytest.raises(LaunchError, match=r"agents\.jsonl: line 1 is not valid JSON"):
        recorded_agents(jd.path)


def test_report_names_the_metrics_line_of_bytes_that_are_no_text(tmp_path: Path) -> None:
    d = make_job_dir(tmp_path)
    with (d / "metrics.jsonl").open("ab") as f:
        f.write(GARBAGE + json.dumps({"iteration": 99}).encode() + b"\n")
    with pytest.raises(RlctlError, match=r"metrics\.jsonl: line \d+: not JSON"):
        build_report(d)


@pytest.mark.parametrize(
    "name", ["events.jsonl", "events.jsonl:warnings", "metrics.jsonl", "summary.json", "agents.jsonl"]
)
def test_a_directory_in_a_record_files_place_is_named(tmp_path: Path, name: str) -> None:
    """Each reader of a record file with a directory in its place: one LaunchError naming it (the warnings of the
    latest run, which the live `rlctl status` reads: an IsADirectoryError's traceback, before)."""
    d = make_job_dir(tmp_path)
    jd = JobDir(d)
    path = d / name.partition(":")[0]
    path.unlink(missing_ok=True)
    path.mkdir()
    said = f"{path}: a directory, where the job's record has a file"
    read = {
        "events.jsonl": jd.read_events,
        "events.jsonl:warnings": lambda: run_warnings(jd),
        "metrics.jsonl": lambda: build_report(d),
        "summary.json": lambda: run_summary(jd, None),
        "agents.jsonl": lambda: recorded_agents(d),
    }[name]
    with pytest.raises(LaunchError, match=said):
        read()


def test_the_first_event_read_past_bytes_that_are_no_text(tmp_path: Path) -> None:
    jd = JobDir.create("first", explicit=tmp_path / "first")
    jd.events.write_bytes(GARBAGE + json.dumps({"t": 12.5, "event": "launch"}).encode() + b"\n")
    assert first_event_time(jd) == 12.5


def test_the_merge_of_the_sites_events_sets_aside_a_line_of_bytes_that_are_no_text(tmp_path: Path) -> None:
    here, there = tmp_path / "events.jsonl", tmp_path / "site-events.jsonl"
    here.write_bytes(b'{"t": 1, "event": "launch"}\n' + GARBAGE)
    there.write_bytes(GARBAGE + b'{"t": 2, "event": "agent_started"}\n')
    merged = "".join(record._merge_lines(here, there))
    assert [json.loads(line)["event"] for line in merged.splitlines()] == ["launch", "agent_started"]
    assert (tmp_path / "events.jsonl.damaged").read_text().count("not text") == 1
