"""The readers of events.jsonl that need a few kinds of event parse only the lines naming them: a job of weeks
writes a `weights_applied` per unit and weight version (640,000 lines after 10^4 versions of 64 units), and
`rlctl attach` (Runs.attach, JobRun.attach) and a controller's SIGTERM (`_stop_meant`) parsed every one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlctl.agents.controller import ControllerAgent
from rlctl.launch.jobdir import JobDir
from rlctl.ops import autoresume
from rlctl.ops.run import JobRun
from rlctl.ops.runstate import UNSTARTED

APPLIED = "".join(json.dumps({"t": 2.0, "event": "weights_applied", "version": v}) + "\n" for v in range(300))


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    parsed: list[str] = []
    loads = json.loads
    monkeypatch.setattr(json, "loads", lambda s, *a, **k: parsed.append(s) or loads(s, *a, **k))
    return parsed


def _applied(jd: JobDir) -> None:
    with jd.events.open("a") as f:
        f.write(APPLIED)


def _parsed_applied(parsed: list[str]) -> list[str]:
    return [s for s in parsed if isinstance(s, str) and "weights_applied" in s]


class _Run:
    """JobRun's part Runs.attach calls: its own reading is JobRun.attach's test."""

    def __init__(self, *a: Any, **k: Any) -> None:
        self.stop_since = 0.0

    def attach(self) -> None:
        pass


@pytest.mark.parametrize("resumed", [True, False])
def test_runs_attach_parses_the_resumes_and_the_first_event_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, resumed: bool
) -> None:
    jd = JobDir(tmp_path)
    jd.append(jd.events, {"t": 1.5, "event": "agent_started", "agent": "controller-0"})
    _applied(jd)
    if resumed:
        jd.append(jd.events, {"t": 3.0, "event": "resumed", "version": 7, "pointer": "", "skipped": []})
        jd.append(jd.events, {"t": 4.0, "event": "resumed", "version": 9, "pointer": "", "skipped": []})
        jd.append(jd.events, {"t": 4.5, "event": UNSTARTED, "version": 9})  # the second never started
    _applied(jd)
    monkeypatch.setattr(autoresume, "JobRun", _Run)
    runs = object.__new__(autoresume.Runs)
    runs.jobdir, runs.spec, runs.plan, runs.db, runs.say, runs.show = jd, None, {}, None, print, None
    runs._began = 10.0
    parsed = _spy(monkeypatch)
    runs.attach()
    assert (runs._since, runs._from) == ((3.0, 7) if resumed else (1.5, 0))
    assert set(_parsed_applied(parsed)) == {APPLIED.splitlines()[-1]}  # (the last line: always)


def test_first_event_time_skips_a_damaged_first_line(tmp_path: Path) -> None:
    jd = JobDir(tmp_path)
    assert autoresume.first_event_time(jd) == 0.0
    jd.events.write_text('{"t": 1.0, "ev\n\n[1]\n' + json.dumps({"t": 2.5, "event": "x"}) + "\n")
    assert autoresume.first_event_time(jd) == 2.5


def test_job_run_attach_parses_the_agent_started_events_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jd = JobDir.create("demo", explicit=tmp_path / "job")
    row = {"name": "controller-0", "role": "controller", "replica": 0, "site": "local", "backend": "local"}
    rec = row | {"host": None, "gpus": None, "log": None, "ident": {"pid": 100, "pgid": 100, "start_ticks": 1}}
    (jd.path / "agents.jsonl").write_text(json.dumps(rec) + "\n")
    _applied(jd)
    jd.event("agent_started", agent="controller-0", run="r1")
    _applied(jd)
    r = object.__new__(JobRun)
    r.jobdir, r.db = jd, None
    parsed = _spy(monkeypatch)
    r.attach()
    assert r.controller is not None and r.controller.spec.name == "controller-0"
    assert hasattr(r, "t_start")  # the run's start was read
    assert set(_parsed_applied(parsed)) == {APPLIED.splitlines()[-1]}


@pytest.mark.parametrize("stop", ["stop_requested", None])
def test_a_controllers_sigterm_parses_the_stop_events_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop: str | None
) -> None:
    jd = JobDir(tmp_path)
    _applied(jd)
    if stop is not None:
        jd.append(jd.events, {"t": 5.0, "event": stop})
    jd.append(jd.events, {"t": 5.0, "event": "stop_requested", "by": "client-0"})  # answered: not meant
    _applied(jd)
    agent = object.__new__(ControllerAgent)
    agent.jobdir, agent.t_start_wall = jd, 4.0
    parsed = _spy(monkeypatch)
    assert agent._stop_meant() is (stop is not None)
    assert set(_parsed_applied(parsed)) == {APPLIED.splitlines()[-1]}
