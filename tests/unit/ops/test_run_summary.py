"""Which summary.json is a run's: a run sets the one before aside (summary.<n>.json, kept), and a summary that names
another run is not taken for this one's end, by its launcher (`JobRun.wait`) or by `rlctl status`. The end to end
case (a resumed run's controller stopped, then killed) is
`tests/integration/ops/test_ops_stop_races.py::test_a_resumed_run_never_reports_the_summary_of_the_run_before`."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rlctl.agents.messages import SIGTERM_FAILURE
from rlctl.config import load_job
from rlctl.config.inventory import Site
from rlctl.launch.jobdir import JobDir
from rlctl.launch.sitefs import LocalFiles
from rlctl.ops import operate
from rlctl.ops.jobref import JobRef
from rlctl.ops.run import JobRun
from rlctl.ops.runstate import aside_name, current_run, run_summary
from tests.conftest import ROOT

# job_status's bound on its answers (the controller's and each site's poll, in a thread of their own): no test here
# waits it out (every answer is there at once), so it is a bound, not a timing assertion; 1–2 s was one for a loaded
# 2-core CI machine, where a thread can wait that long to run and an answer late by then reads as `timeout` / `unknown`
BOUND_S = 30.0


def _job(tmp_path: Path) -> JobDir:
    jd = JobDir.create("j", explicit=tmp_path / "job")
    (jd.path / "sites.json").write_text("[]")
    return jd


def test_each_run_sets_the_summary_before_aside_under_the_next_number(tmp_path: Path) -> None:
    jd = _job(tmp_path)
    assert aside_name(jd.path) == "summary.1.json"
    (jd.path / "summary.1.json").write_text("{}")
    (jd.path / "summary.3.json").write_text("{}")
    assert aside_name(jd.path) == "summary.4.json"
    jd.write_json(jd.summary_json, {"state": "stopped"})
    fs = LocalFiles()
    assert fs.move(str(jd.summary_json), str(jd.path / "summary.4.json"))
    assert not jd.summary_json.exists() and json.loads((jd.path / "summary.4.json").read_text())["state"] == "stopped"
    assert not fs.move(str(jd.summary_json), str(jd.path / "summary.5.json"))  # none there: nothing changed
    assert not (jd.path / "summary.5.json").exists()


def test_a_summary_of_another_run_is_not_this_runs(tmp_path: Path) -> None:
    jd = _job(tmp_path)
    assert current_run(jd) is None and run_summary(jd, "b") is None
    jd.event("agent_started", agent="controller-0", run="a")
    jd.event("agent_started", agent="trainer-0")
    jd.write_json(jd.summary_json, {"state": "stopped", "run": "a"})
    assert current_run(jd) == "a" and run_summary(jd, "a") == {"state": "stopped", "run": "a"}
    jd.event("agent_started", agent="controller-0", run="b")  # the next run started; its controller wrote none yet
    assert current_run(jd) == "b" and run_summary(jd, "b") is None
    jd.write_json(jd.summary_json, {"state": "stopped"})  # written by an rlctl without run ids: taken
    assert run_summary(jd, "b") == {"state": "stopped"}


def test_status_does_not_end_a_job_on_the_summary_of_the_run_before(tmp_path: Path) -> None:
    # `rlctl status -w` of a resumed job whose controller did not answer for a moment stopped watching: it took
    # the run before's summary.json for this run's end
    jd = _job(tmp_path)
    jd.event("agent_started", agent="controller-0", run="a")
    jd.write_json(jd.summary_json, {"state": "stopped", "run": "a"})
    jd.event("agent_started", agent="controller-0", run="b")
    out, _ = operate.job_status(JobRef("j", jd, None), timeout_s=BOUND_S)
    assert "summary" not in out and out["controller"].startswith("error: ")
    jd.write_json(jd.summary_json, {"state": "done", "run": "b"})
    out, _ = operate.job_status(JobRef("j", jd, None), timeout_s=BOUND_S)
    assert out["summary"]["state"] == "done"


def _ended_run(jd: JobDir, monkeypatch: pytest.MonkeyPatch, summary_dir: str) -> JobRun:
    """A run whose controller (on site `train`) ended and left its summary, naming `summary_dir` as its job dir."""
    spec = load_job(ROOT / "jobs" / "demo.yaml").spec
    local = {"datacenter": "d", "scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": [{"host": "h", "gpus": 1}]}
    run = JobRun(jd, spec, {"controller_site": "train"}, sites={"train": Site.model_validate(local)})
    run.controller = SimpleNamespace(spec=SimpleNamespace(log_path=jd.log("controller", 0)))  # type: ignore[assignment]
    monkeypatch.setattr(run, "_watch", lambda h: 0)
    jd.write_json(jd.summary_json, {"state": "stopped", "job_dir": summary_dir})
    return run


def test_the_launchers_summary_names_the_operators_job_dir_and_the_controllers_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a controller that keeps its job dir on its site (an SSH site, a SLURM site's workdir) wrote that one into the
    # summary, and launch's table said `job dir /…/slurm-work/jobs/…` where its header, `status` and `report` said the
    # operator's
    jd = _job(tmp_path)
    summary = _ended_run(jd, monkeypatch, "/site/work/jobs/job").wait(poll_s=0)
    assert summary["job_dir"] == str(jd.path)
    assert summary["controller_job_dir"] == {"site": "train", "path": "/site/work/jobs/job"}
    here = _ended_run(jd, monkeypatch, str(jd.path)).wait(poll_s=0)  # the controller wrote into this one
    assert here["job_dir"] == str(jd.path) and "controller_job_dir" not in here


def test_a_trainer_rank_that_died_is_named_not_rank_0_that_lost_its_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # kill -9 of trainer-1 (FSDP, 2 ranks): rank 0 failed on its broken group and the controller said `trainer
    # trainer-0 was lost`, which the failure line, the events and summary.json repeated, naming the rank that lived
    jd = _job(tmp_path)
    run = _ended_run(jd, monkeypatch, str(jd.path))
    ranks = [SimpleNamespace(spec=SimpleNamespace(role="trainer", replica=r, name=f"trainer-{r}")) for r in range(2)]
    run.handles = ranks  # type: ignore[assignment]
    run._starting = False
    codes = {"controller-0": 1, "trainer-0": 1, "trainer-1": -9}
    run.controller = SimpleNamespace(spec=SimpleNamespace(name="controller-0"))  # type: ignore[assignment]
    monkeypatch.setattr(run, "_watch", lambda h: codes[h.spec.name])
    lost = "failed: trainer trainer-0 was lost (tcp://h:1: connection closed by peer); continue the job with `x`"
    jd.write_json(jd.summary_json, {"state": lost, "job_dir": str(jd.path)})
    summary = run.wait(poll_s=0)
    assert summary["state"] == (
        "failed: trainer rank 1 (trainer-1) exited with -9 (SIGKILL) first; then trainer trainer-0 was lost "
        "(tcp://h:1: connection closed by peer); continue the job with `x`"
    )
    assert run_summary(jd, None)["state"] == summary["state"]  # type: ignore[index]
    [event] = [e for e in jd.read_events() if e["event"] == "trainer_rank_ended"]
    assert (event["agent"], event["rank"], event["exit_code"]) == ("trainer-1", 1, -9)
    assert event["ended"] == {"trainer-0": 1, "trainer-1": -9}


def test_the_rank_seen_ended_first_is_named_before_a_later_signal() -> None:
    run = JobRun.__new__(JobRun)
    run._ended_ranks = {"trainer-2": (2, 1, 0), "trainer-0": (0, 1, 0), "trainer-3": (3, -9, 1)}
    assert run.first_ended_rank() == ("trainer-2", 2, 1)  # seen in an earlier sweep than trainer-3's kill
    run._ended_ranks["trainer-1"] = (1, -6, 0)
    assert run.first_ended_rank() == ("trainer-1", 1, -6)
    run._ended_ranks = {}
    assert run.first_ended_rank() is None


def test_a_new_run_clears_the_exits_the_run_before_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resume (by hand or auto_resume) whose controller is then SIGKILLed with its launcher: `rlctl status` named
    the exit the run before's controller had (`exit 1`), the index row's, as this run's."""
    from rlctl.ops.jobdb import JobDB

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    run = JobRun.__new__(JobRun)
    run.jobdir, run.stop_since = _job(tmp_path), 0.0  # its id: the job dir's name, "job"
    run.spec = load_job(ROOT / "jobs" / "demo.yaml").spec
    run.db = JobDB()
    try:
        run._register("launching")
        run._register("failed", controller_exit=1, trainer_exit=-9)
        assert run.db.get("job").info["controller_exit"] == 1
        run._register("launching", launcher={"pid": 1})  # the resume
        info = run.db.get("job").info
        assert (info["controller_exit"], info["trainer_exit"], info["launcher"]) == (None, None, {"pid": 1})
    finally:
        run.db.close()


def test_a_run_enters_the_index_with_its_launcher_in_one_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`rlctl status --all` at a run's start showed its row without a launcher: the row was put, then updated."""
    from rlctl.ops.jobdb import JobDB

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    run = JobRun.__new__(JobRun)
    run.jobdir, run.stop_since = _job(tmp_path), 0.0
    run.spec = load_job(ROOT / "jobs" / "demo.yaml").spec
    run.db = JobDB()
    seen: list[dict[str, Any]] = []
    put = run.db.put

    def watched(*args: Any, **kwargs: Any) -> None:
        put(*args, **kwargs)
        seen.append(run.db.get("job").info)  # what another terminal's `status --all` reads now

    monkeypatch.setattr(run.db, "put", watched)
    try:
        run._register("launching", launcher={"pid": 1})
        assert [i.get("launcher") for i in seen] == [{"pid": 1}]
        assert run.db.get("job").state == "launching"
    finally:
        run.db.close()


def test_the_agents_of_a_local_job_its_launcher_stopped_show_the_exits_it_saw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rlctl status` of a finished `make demo` said `exited (status unknown)` for the trainer and rollouts: only
    their parent, the launcher, could read how they ended. Its stop records them (summary, index row, event)."""
    import sys
    import time

    from rlctl.launch.backends import record_agent, write_sites
    from rlctl.launch.base import AgentSpec
    from rlctl.ops.jobdb import JobDB

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("j", explicit=tmp_path / "job")
    local = Site.model_validate(
        {"datacenter": "d", "scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": [{"host": "h", "gpus": 2}]}
    )
    write_sites(jd.path, {"train": local})
    db = JobDB()
    run = JobRun(jd, load_job(ROOT / "jobs" / "demo.yaml").spec, {"controller_site": "train"}, db=db)
    run._register("launching")
    backend = run.backends.for_site("train")
    ended = backend.start(AgentSpec("trainer", 0, "train", [sys.executable, "-c", "raise SystemExit(3)"]))
    running = backend.start(AgentSpec("rollout", 0, "train", [sys.executable, "-c", "import time; time.sleep(60)"]))
    for h in (ended, running):
        record_agent(jd.path, h)
        run.handles.append(h)
    jd.write_json(jd.summary_json, {"state": "done", "iterations": 1})
    deadline = time.monotonic() + 30
    while backend.poll(ended) is None and time.monotonic() < deadline:  # it ends by itself, before the stop
        time.sleep(0.05)
    try:
        run.stop(grace_s=5)
        assert db.get("job").info["agent_exits"] == {"trainer-0": 3, "rollout-0": -15}
        s, complete = operate.job_status(JobRef("job", jd, db.get("job")), timeout_s=BOUND_S)
    finally:
        db.close()
    states = {a["name"]: (a["state"], a["source"]) for a in s["agents"]}
    assert states == {
        "trainer-0": ("exited 3", "local (the launcher saw the exit)"),
        "rollout-0": ("exited -15 (SIGTERM)", "local (the launcher saw the exit)"),
    }
    assert complete and run_summary(jd, None)["agent_exits"] == {"trainer-0": 3, "rollout-0": -15}  # type: ignore[index]
    assert [e["exits"] for e in jd.read_events() if e["event"] == "agents_stopped"] == [
        {"trainer-0": 3, "rollout-0": -15}
    ]


def test_a_stop_with_a_damaged_summary_and_no_end_in_the_events_still_records_the_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """summary.json damaged (cut short) and events.jsonl without its run's job_end: the stop's read of it raised
    LaunchError after the agents were stopped, so the launcher's exits, the `agents_stopped` event and the index's
    `stopped` row were never written. The stop says the summary in one line and records the rest."""
    import sys
    import time

    from rlctl.launch.backends import record_agent, write_sites
    from rlctl.launch.base import AgentSpec
    from rlctl.ops.jobdb import JobDB

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("j", explicit=tmp_path / "job")
    local = Site.model_validate(
        {"datacenter": "d", "scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": [{"host": "h", "gpus": 2}]}
    )
    write_sites(jd.path, {"train": local})
    db = JobDB()
    run = JobRun(jd, load_job(ROOT / "jobs" / "demo.yaml").spec, {"controller_site": "train"}, db=db)
    run._register("launching")
    backend = run.backends.for_site("train")
    run.controller = backend.start(
        AgentSpec("controller", 0, "train", [sys.executable, "-c", "import time; time.sleep(60)"])
    )
    ended = backend.start(AgentSpec("trainer", 0, "train", [sys.executable, "-c", "raise SystemExit(3)"]))
    for h in (run.controller, ended):
        record_agent(jd.path, h)
        run.handles.append(h)
    damaged = '{"state": "failed: controller got SIGTERM", "iterations": 4, "bubble": {"trai'
    jd.summary_json.write_text(damaged)
    deadline = time.monotonic() + 30
    while backend.poll(ended) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        with caplog.at_level("WARNING"):
            run.stop(grace_s=5)
        row = db.get("job")
    finally:
        db.close()
    assert row.state == "stopped" and row.info["agent_exits"] == {"controller-0": -15, "trainer-0": 3}
    assert [e["exits"] for e in jd.read_events() if e["event"] == "agents_stopped"] == [
        {"controller-0": -15, "trainer-0": 3}
    ]
    assert jd.summary_json.read_text() == damaged  # left as it is: nothing read of it to write back
    assert any("not valid JSON" in m for m in caplog.messages), caplog.messages


def _controller_gone_trainer_left(tmp_path: Path, trainer: str) -> tuple[JobDir, JobRun, Any, Any]:
    """A run on a local site whose controller has exited and whose trainer runs `trainer` (Python source), both
    recorded: the job dir, the run, the site's backend and the trainer's handle."""
    import sys
    import time

    from rlctl.launch.backends import record_agent, write_sites
    from rlctl.launch.base import AgentSpec

    jd = JobDir.create("j", explicit=tmp_path / "job")
    local = Site.model_validate(
        {"datacenter": "d", "scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": [{"host": "h", "gpus": 2}]}
    )
    write_sites(jd.path, {"train": local})
    run = JobRun(jd, load_job(ROOT / "jobs" / "demo.yaml").spec, {"controller_site": "train"}, db=None)
    backend = run.backends.for_site("train")
    run.controller = backend.start(AgentSpec("controller", 0, "train", [sys.executable, "-c", "pass"]))
    left = backend.start(AgentSpec("trainer", 0, "train", [sys.executable, "-c", trainer]))
    for h in (run.controller, left):
        record_agent(jd.path, h)
        run.handles.append(h)
    while backend.poll(run.controller) is None:
        time.sleep(0.01)
    return jd, run, backend, left


def test_a_runs_local_agents_leaving_after_its_controller_are_not_terminated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make demo`: the controller told its agents to stop and exited, and the launcher's stop sent them TERM while
    they were leaving (0.3 s after the job's end): status of the done job said `exited -15 (SIGTERM)`. They get
    AGENTS_SETTLE_S to leave by themselves."""
    from rlctl.ops import runbase

    # a bound no start of a Python process reaches, loaded or not: the trainer's 0.5 s must not race the 3 s (the
    # stop returns as soon as it has left, so the test takes no longer)
    monkeypatch.setattr(runbase, "AGENTS_SETTLE_S", 60.0)
    jd, run, _, _ = _controller_gone_trainer_left(tmp_path, "import time; time.sleep(0.5)")
    run.stop(grace_s=5)
    assert [e["exits"] for e in jd.read_events() if e["event"] == "agents_stopped"] == [
        {"controller-0": 0, "trainer-0": 0}
    ]


def test_a_recorded_agent_on_a_site_the_record_lacks_does_not_keep_the_stop_from_stopping_the_others(
    tmp_path: Path,
) -> None:
    """agents.jsonl names a site sites.json lacks (the launch's record of the sites damaged): the wait for the agents
    to leave by themselves (AGENTS_SETTLE_S) raised that site's LaunchError before any agent was stopped, so that a
    run's end (or Ctrl-C) left its trainer and units running; the stop says that site as one of its problems."""
    from rlctl.errors import LaunchError
    from rlctl.launch.backends import record_agent
    from rlctl.launch.base import AgentHandle, AgentSpec

    jd, run, backend, running = _controller_gone_trainer_left(tmp_path, "import time; time.sleep(60)")
    record_agent(jd.path, AgentHandle(AgentSpec("rollout", 0, "gone", []), {"pid": 1, "pgid": 1}, "local"))
    try:
        with pytest.raises(LaunchError, match=r"^site gone: .*no site 'gone'"):
            run.stop(grace_s=5)
        assert backend.poll(running) is not None
    finally:
        if backend.poll(running) is None:
            backend.stop([running], grace_s=1)


def test_the_launcher_writing_into_a_damaged_summary_keeps_the_damaged_file(tmp_path: Path) -> None:
    """summary.json damaged during the run (cut short): the launcher wrote what `run_summary` read of it, its run's end
    from the job_end event (state, iterations), back over it as if it were whole, and the rest of it (metrics, bubble,
    agents) was gone. The damaged file is kept aside whole; the end and the launcher's keys go in its place."""
    jd = _job(tmp_path)
    jd.event("agent_started", agent="controller-0", run="r1")
    jd.event("job_end", state=f"failed: {SIGTERM_FAILURE}", iterations=4)
    damaged = '{"run": "r1", "state": "failed: controller got SIGTERM", "iterations": 4, "bubble": {"trai'
    jd.summary_json.write_text(damaged)
    run = JobRun.__new__(JobRun)
    run.jobdir, run.run_id, run.db = jd, "r1", None
    run._record_exits({"trainer-0": 3})
    run._stopped_by_term({"state": f"failed: {SIGTERM_FAILURE}"})
    assert (jd.path / "summary.json.damaged").read_text() == damaged
    record = json.loads(jd.summary_json.read_text())
    assert (record["state"], record["iterations"], record["agent_exits"]) == ("stopped", 4, {"trainer-0": 3})
    assert record["summary_damaged"].endswith("; kept as summary.json.damaged")
    jd.summary_json.write_text("[]")  # damaged again: the first one kept stays as it is
    run._record_exits({"trainer-0": 1})
    assert (jd.path / "summary.json.damaged").read_text() == damaged
    assert (jd.path / "summary.json.damaged.2").read_text() == "[]"
