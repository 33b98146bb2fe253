"""`JobDir.read_events` reads events.jsonl a line at a time: a job of weeks has a file of hundreds of MB, and each
status, stop, attach and resume held it whole (its text and its list of lines) to keep a few of its events."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from rlctl.launch import jobdir
from rlctl.launch.jobdir import JobDir
from rlctl.launch.recordfiles import json_lines

FILLER = 20_000  # `weights_applied` lines of ~120 B: a 2.4 MB file


def _job(tmp_path: Path) -> JobDir:
    jd = JobDir.create("stream", explicit=tmp_path / "job")
    with jd.events.open("w") as f:
        f.write(json.dumps({"t": 1.0, "event": "launch"}) + "\n")
        f.write('{"t": 2.0, "event": "scale", "agent": "rollout-2"\n')  # cut short by a controller killed mid-write
        f.write("\n[1, 2]\n\n")  # a blank line, a line that is no object, another blank
        line = json.dumps({"t": 3.0, "event": "weights_applied", "units": ["rollout-0", "rollout-1"], "version": 7})
        f.write((line + "\n") * FILLER)
        f.write(json.dumps({"t": 4.0, "event": "stop_requested", "by": "op"}) + "\f\n")
        f.write('{"t": 5.0, "event": "scale", "agent": "rollout-3"')  # the last line, being written
    return jd


def test_read_events_holds_one_line_at_a_time_not_the_file(tmp_path: Path) -> None:
    jd = _job(tmp_path)
    size = jd.events.stat().st_size
    tracemalloc.start()
    try:
        got = jd.read_events("stop_requested", "scale")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [e["event"] for e in got] == ["stop_requested"]
    assert size > 1_500_000 and peak < size // 10, (size, peak)  # was the file's size and more (~3 × it)


@pytest.mark.parametrize("kinds", [(), ("scale",), ("weights_applied", "launch"), ("stop_requested",)])
def test_read_events_reads_what_the_whole_file_s_lines_hold(
    tmp_path: Path, kinds: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same rows as `json_lines` of the whole text, and the same lines said left out, by the same numbers (the
    last line, unparsed yet, unsaid)."""
    jd = _job(tmp_path)
    whole: list[str] = []
    want = [r for r in json_lines(jd.events, jd.events.read_text(), skipped=whole) if not kinds or r["event"] in kinds]
    said: list[str] = []
    monkeypatch.setattr(jobdir, "say_once", said.extend)
    assert jd.read_events(*kinds) == want
    assert said == whole and [m.split(": ")[1] for m in said] == [
        "line 2 is not valid JSON (Expecting ',' delimiter",
        "line 4 is list, not a JSON object",
    ]
