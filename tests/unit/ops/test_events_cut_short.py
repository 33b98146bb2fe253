"""A line of events.jsonl cut short (its controller SIGKILLed mid-write, a full disk): the next event appended goes on
a line of its own (`JobDir.append`), and the readers of the events — status, stop, resume, report — leave the damaged
line out, said once, instead of failing on it for as long as the job dir lives. The same holds for agents.jsonl's
next record."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rlctl.config.inventory import Site
from rlctl.launch.backends import agents_from_lines, record_agent, write_sites
from rlctl.launch.base import AgentHandle, AgentSpec
from rlctl.launch.jobdir import JobDir
from rlctl.ops import operate
from rlctl.ops.autoresume import newest_checkpoint
from rlctl.ops.jobref import JobRef
from rlctl.ops.runstate import STOP_REQUESTED, current_run, stop_requested
from rlctl.report import build_report
from tests.unit.job_rows import indexed_row
from tests.unit.report.fake_jobdir import make_job_dir

CUT = '{"t": 5.0, "event": "checkpoint", "vers'  # what a controller killed mid-write leaves at the end


def _cut_job(tmp_path: Path) -> JobDir:
    """A local job whose controller (run r1) completed checkpoint v2 and was killed while it wrote its next event."""
    jd = JobDir.create("cut", explicit=tmp_path / "cut")
    site = {"datacenter": "d", "scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": [{"host": "h", "gpus": 1}]}
    write_sites(jd.path, {"local": Site.model_validate(site)})
    (jd.path / "agents.jsonl").write_text("")
    jd.event("agent_started", agent="controller-0", run="r1")
    jd.event("checkpoint", version=2)
    with jd.events.open("a") as f:
        f.write(CUT)
    return jd


def test_the_next_event_after_a_cut_short_line_is_a_line_of_its_own(tmp_path: Path) -> None:
    jd = _cut_job(tmp_path)
    jd.event(STOP_REQUESTED)  # `rlctl stop` of the job: it went on the cut line, and the request was lost
    lines = jd.events.read_text().splitlines()
    assert lines[-2] == CUT and json.loads(lines[-1])["event"] == STOP_REQUESTED
    assert stop_requested(jd, since=0.0)


def test_status_stop_resume_and_report_read_past_a_cut_short_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _cut_job(tmp_path)
    row = indexed_row("cut1", jd.path, job="cut", state="running")
    ref = JobRef("cut1", jd, row)
    operate.job_status(ref, timeout_s=2.0)  # a cut-short last line: read past already
    jd.event(STOP_REQUESTED)  # then anything appended after it (the stop, a resume's launcher)
    jd.event("resumed", version=2, pointer="latest", skipped=[])
    with caplog.at_level(logging.WARNING):
        for _ in range(2):  # `rlctl status -w`: said once, not every poll
            s, _complete = operate.job_status(ref, timeout_s=2.0)
            assert s["index_state"] == "running" and [a["name"] for a in s["agents"]] == []
    said = [r.getMessage() for r in caplog.records if "line 3 is not valid JSON" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"{jd.events}: line 3") and said[0].endswith("left out")
    assert current_run(jd) == "r1" and stop_requested(jd, since=0.0)
    assert newest_checkpoint(jd, since=0.0) == 2  # what `checkpoint.auto_resume` resumes from
    # `rlctl report` of the same events
    (tmp_path / "report").mkdir()
    d = make_job_dir(tmp_path / "report")
    with (d / "events.jsonl").open("a") as f:
        f.write(CUT + "\n" + json.dumps({"t": 6.0, "event": "resumed", "version": 2}) + "\n")
    assert build_report(d).html.exists()


def test_the_next_agent_recorded_after_a_cut_short_line_of_agents_jsonl_is_a_line_of_its_own(tmp_path: Path) -> None:
    # a full disk cut the launcher's last record short; the next run's controller went on that line, and no reader
    # saw it again (`rlctl stop` left it running: the line was damaged, or, while last, skipped as one being written)
    cut = '{"name": "rollout-0", "role": "rollout", "replica": 0, "site": "lo'
    (tmp_path / "agents.jsonl").write_text(cut)
    for role in ("controller", "trainer"):
        spec = AgentSpec(role, 0, "local", [])
        record_agent(tmp_path, AgentHandle(spec, {"pid": 1, "pgid": 1, "start_ticks": 1}, "local"))
    skipped: list[str] = []
    handles = agents_from_lines((tmp_path / "agents.jsonl").read_text(), skipped=skipped)
    assert [h.spec.name for h in handles] == ["controller-0", "trainer-0"]
    assert len(skipped) == 1 and "line 1 is not valid JSON" in skipped[0]
