"""`rlctl stop` (rlctl.ops.stop.stop): when the controller's site stops answering the forced stop still runs; a
job that ended is left as it is, but a launcher that may still run is told not to resume it; a stop that kills the
controller past its grace ends the job `stopped`, whichever of the launcher and the operator writes the index first."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlctl.commands import stop as stop_cli
from rlctl.config import load_job
from rlctl.config.inventory import Site
from rlctl.errors import LaunchError, Stopped, UsageError
from rlctl.launch import agentrecords, local, record, stage
from rlctl.launch.backends import record_agent, write_sites
from rlctl.launch.base import LOST, AgentHandle, AgentSpec
from rlctl.launch.jobdir import JobDir
from rlctl.launch.ssh import SshBackend
from rlctl.ops import refusals, runstate
from rlctl.ops import stop as opstop
from rlctl.ops.jobdb import JobDB
from rlctl.ops.jobref import JobRef
from rlctl.ops.refusals import refuse_if_running
from rlctl.ops.run import JobRun
from rlctl.ops.runstate import STOP_REQUESTED, stop_requested
from tests.conftest import ROOT


def test_a_controller_site_that_cannot_be_polled_still_gets_every_agent_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the LaunchError of the poll escaped `stop`: no agent was stopped and the job index kept it running
    site = Site.model_validate(
        {"datacenter": "d", "scheduler": {"kind": "ssh"}, "gpu": "H20", "nodes": [{"host": "h[1-2]", "gpus": 8}]}
    )
    write_sites(tmp_path, {"h20": site})
    agents = [("controller-0", "controller", "h1", None), ("rollout-0", "rollout", "h2", [0])]
    (tmp_path / "agents.jsonl").write_text(
        "".join(
            json.dumps(
                {"name": n, "role": r, "replica": 0, "site": "h20", "backend": "ssh", "host": h, "gpus": g, "log": None}
                | {"ident": {"host": h, "pid": 1, "pgid": 1, "start_ticks": 1, "exitfile": "x"}}
            )
            + "\n"
            for n, r, h, g in agents
        )
    )
    monkeypatch.setattr(opstop, "ask_controller", lambda *a, **k: {})  # it accepted `shutdown`

    def poll(self: SshBackend, handle: object) -> None:
        raise LaunchError("ssh h1: cannot connect: timed out")

    monkeypatch.setattr(SshBackend, "poll", poll)
    stopped: list[list[str]] = []
    monkeypatch.setattr(
        opstop, "stop_agents", lambda b, hs, grace_s, **_: stopped.append([h.spec.name for h in hs]) or []
    )
    out = opstop.stop(JobRef("stopjob", JobDir(tmp_path), None), grace_s=2)
    assert stopped == [["controller-0", "rollout-0"]] and out["problems"] == []


def test_agents_of_a_site_the_stop_could_not_reach_are_not_said_to_be_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """They were listed under the agents stopped, beside the problem line saying their site failed."""
    ssh = Site.model_validate(
        {"datacenter": "d", "scheduler": {"kind": "ssh"}, "gpu": "H20", "nodes": [{"host": "h1", "gpus": 8}]}
    )
    here = Site.model_validate(
        {"datacenter": "d", "scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": [{"host": "localhost", "gpus": 1}]}
    )
    write_sites(tmp_path, {"far": ssh, "here": here})
    agents = [("controller-0", "controller", "here", "localhost"), ("rollout-0", "rollout", "far", "h1")]
    (tmp_path / "agents.jsonl").write_text(
        "".join(
            json.dumps(
                {"name": n, "role": r, "replica": 0, "site": s, "backend": "local" if s == "here" else "ssh"}
                | {"host": h, "gpus": None, "log": None}
                | {"ident": {"host": h, "pid": 1, "pgid": 1, "start_ticks": 1, "exitfile": "x"}}
            )
            + "\n"
            for n, r, s, h in agents
        )
    )
    monkeypatch.setattr(opstop, "ask_controller", lambda *a, **k: {})
    monkeypatch.setattr(local.LocalBackend, "poll", lambda self, h: 0)
    monkeypatch.setattr(local.LocalBackend, "stop", lambda self, hs, grace_s: None)

    def unreachable(self: SshBackend, handles: object, grace_s: float) -> None:
        raise LaunchError("ssh h1: cannot connect: timed out")

    monkeypatch.setattr(SshBackend, "stop", unreachable)
    out = opstop.stop(JobRef("stopjob", JobDir(tmp_path), None), grace_s=2)
    assert out["agents"] == ["controller-0"], out
    assert out["problems"] == ["site far: ssh h1: cannot connect: timed out"], out


NOT_BEGUN = "not written: the trainer had not begun that step (told to stop, it began none)"
NOT_KNOWN = "not known: the controller ended before the trainer said; a resume takes the latest complete checkpoint"
END = ("job_end", {"state": "stopped"})


@pytest.mark.parametrize(
    ("after", "outcome"),
    [
        ([("checkpoint", {"version": 4})], "completed"),
        ([("checkpoint_abandoned", {"versions": [4], "latest": 2}), END], "abandoned: a resume takes iter-2"),
        # the controller ended saying neither: the trainer held iteration 3 but had not begun its step (told to stop,
        # it began none)
        ([("checkpoint", {"version": 3}), END], NOT_BEGUN),
        # it ended before it could say (killed past the grace: no job_end): not known, with what is on disk; before,
        # "not written" of a write the trainer had begun
        ([("checkpoint", {"version": 3})], f"{NOT_KNOWN} (iter-2)"),
        ([], f"{NOT_KNOWN} (iter-2)"),
    ],
)
def test_a_stop_without_grace_waits_as_long_as_the_controller_says_and_names_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after: list[tuple[str, dict[str, object]]], outcome: str
) -> None:
    """`rlctl stop` without --grace asks for none; the controller answers how long its end may take (longer while
    the trainer may complete a checkpoint: `ControllerAgent._stop_asked`), the stop waits that long for it before it
    kills it, says so on the operator's terminal, and reports what became of that checkpoint. (The default --grace
    of 15 s cut a checkpoint write short: the controller waited at most 14 s for it.)"""
    site = Site.model_validate(
        {"datacenter": "d", "scheduler": {"kind": "ssh"}, "gpu": "H20", "nodes": [{"host": "h1", "gpus": 8}]}
    )
    write_sites(tmp_path, {"h20": site})
    (tmp_path / "agents.jsonl").write_text(
        json.dumps(
            {"name": "controller-0", "role": "controller", "replica": 0, "site": "h20", "backend": "ssh"}
            | {"host": "h1", "gpus": None, "log": None}
            | {"ident": {"host": "h1", "pid": 1, "pgid": 1, "start_ticks": 1, "exitfile": "x"}}
        )
        + "\n"
    )
    jd = JobDir(tmp_path)
    jd.checkpoints.mkdir()
    jd.write_json(jd.checkpoints / "latest.json", {"version": 2})
    asked: list[dict[str, object]] = []

    def ask(ref: JobRef, kind: str, body: dict[str, object], *, timeout_s: float) -> dict[str, object]:
        asked.append(body)
        jd.event("checkpoint", version=4)  # an earlier run's (a resume from v2 set it aside): not this stop's
        jd.event("stop_requested", by="client-0", grace_s=1.0, checkpoint=4)  # the controller's, as it answers
        for event, fields in after:
            jd.event(event, **fields)
        return {"ok": True, "grace_s": 1.0, "checkpoint": 4}

    monkeypatch.setattr(opstop, "ask_controller", ask)
    monkeypatch.setattr(SshBackend, "poll", lambda self, handle: None)  # the controller runs on: the grace ends
    graces: list[float] = []
    monkeypatch.setattr(opstop, "stop_agents", lambda b, hs, grace_s, **_: graces.append(grace_s) or [])
    said: list[str] = []
    t0 = time.monotonic()
    out = opstop.stop(JobRef("stopjob", jd, None), say=said.append)
    assert 1.0 <= time.monotonic() - t0 < 10.0  # the controller's 1 s, not the 15 s of a stop that sets none
    assert asked == [{}] and graces == [1.0]
    assert said == ["job stopjob: the trainer may be completing checkpoint iter-4; the controller waits for it "
                    "before it ends (up to 1 s; --grace bounds the wait)"]  # fmt: skip
    assert out["checkpoint"] == {"version": 4, "outcome": outcome}
    assert f"iter-4: {outcome}" in stop_cli._table(out)


@pytest.fixture
def launcher() -> Iterator[dict[str, object]]:
    """A launcher that still runs (`launcher_running` looks for rlctl in its command line), as the index records it."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "rlctl"], stdin=subprocess.PIPE)
    yield {"pid": proc.pid, "host": socket.gethostname()}
    proc.kill()
    proc.wait()


def _gone_launcher() -> dict[str, object]:
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()  # reaped: its pid names no process
    return {"pid": proc.pid, "host": socket.gethostname()}


def _ended_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str, launcher: dict[str, object] | None = None
) -> JobRef:
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("short", explicit=tmp_path / "short2")
    write_sites(jd.path, {})
    db = JobDB()
    try:
        db.put("short2", job_dir=str(jd.path), spec={"name": "short"})
        db.update("short2", state=state, info={"launcher": launcher or _gone_launcher()})
        row = db.get("short2")
    finally:
        db.close()
    return JobRef("short2", jd, row)


def test_a_stop_of_a_finished_job_says_so_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # its index row became `stopped`, a stop event was written and its exited agents listed as stopped
    ref = _ended_job(tmp_path, monkeypatch, "finished")
    exited = [{"name": "controller-0", "state": "exited 0"}, {"name": "rollout-0", "state": "exited 0"}]
    monkeypatch.setattr(opstop, "site_view", lambda ref, timeout_s, handles: (exited, []))
    monkeypatch.setattr(opstop, "stop_agents", lambda *a, **k: pytest.fail("nothing runs: nothing to stop"))
    out = opstop.stop(ref, grace_s=2)
    assert out == {"id": "short2", "ended": "finished", "graceful": "-", "agents": [], "problems": []}
    assert opstop._index_state("short2") == "finished" and not ref.jobdir.events.exists()
    assert stop_cli._table(out) == "job short2 already ended (finished)"


def test_a_stop_of_a_finished_job_dir_the_index_lacks_says_so_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a job dir copied from another machine, or an index lost: its summary says done, yet the stop wrote its events
    # (stop_requested, stopped_by_operator) and listed the exited agents as stopped
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("short", explicit=tmp_path / "copied")
    write_sites(jd.path, {})
    jd.write_json(jd.summary_json, {"state": "done"})
    exited = [{"name": "controller-0", "state": "exited 0"}, {"name": "rollout-0", "state": "exited 0"}]
    monkeypatch.setattr(opstop, "site_view", lambda ref, timeout_s, handles: (exited, []))
    monkeypatch.setattr(opstop, "stop_agents", lambda *a, **k: pytest.fail("nothing runs: nothing to stop"))
    out = opstop.stop(JobRef("copied", jd, None), grace_s=2)
    assert out == {"id": "copied", "ended": "done", "graceful": "-", "agents": [], "problems": []}
    assert not jd.events.exists()


def test_a_stop_of_a_done_job_whose_gone_launcher_never_recorded_its_end_says_so_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # its controller wrote summary.json (done) and exited; its launcher died before it recorded the end (the row
    # still `running`): the stop forced nothing that ran, yet wrote `stopped` over the finished job's row
    ref = _ended_job(tmp_path, monkeypatch, "running")
    ref.jobdir.write_json(ref.jobdir.summary_json, {"state": "done"})
    exited = [{"name": "controller-0", "state": "exited 0"}, {"name": "rollout-0", "state": "exited 0"}]
    monkeypatch.setattr(opstop, "site_view", lambda ref, timeout_s, handles: (exited, []))
    monkeypatch.setattr(opstop, "ask_controller", lambda *a, **k: (_ for _ in ()).throw(LaunchError("gone")))
    monkeypatch.setattr(opstop, "stop_agents", lambda *a, **k: pytest.fail("nothing runs: nothing to stop"))
    out = opstop.stop(ref, grace_s=2)
    assert out == {"id": "short2", "ended": "done", "graceful": "-", "agents": [], "problems": []}
    assert opstop._index_state("short2") == "running" and not ref.jobdir.events.exists()
    assert stop_cli._table(out) == "job short2 already ended (done)"


def test_an_orphan_of_a_failed_job_is_stopped_and_the_index_keeps_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = _ended_job(tmp_path, monkeypatch, "failed")
    running = [{"name": "rollout-0", "state": "running"}]
    monkeypatch.setattr(opstop, "site_view", lambda ref, timeout_s, handles: (running, []))
    monkeypatch.setattr(opstop, "ask_controller", lambda *a, **k: (_ for _ in ()).throw(LaunchError("gone")))
    monkeypatch.setattr(opstop, "stop_agents", lambda *a, **k: [])
    out = opstop.stop(ref, grace_s=2)
    assert "ended" not in out and out["graceful"].startswith("controller did not answer")
    assert opstop._index_state("short2") == "failed"  # the stop of a leftover is not the job's end


def test_a_stop_in_an_auto_resume_window_keeps_the_launcher_from_resuming(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: dict[str, object]
) -> None:
    # run 1 failed (its launcher wrote `failed`, none of its agents runs) and its launcher, alive, was about to
    # resume it: the stop said "already ended (failed)" and wrote no stop request, so the launcher resumed anyway
    began = time.time() - 10  # the launcher's start: it looks for a stop request since then (`Runs._stops_since`)
    ref = _ended_job(tmp_path, monkeypatch, "failed", launcher)
    exited = [{"name": "controller-0", "state": "exited 1"}, {"name": "trainer-0", "state": "exited 143"}]
    monkeypatch.setattr(opstop, "site_view", lambda ref, timeout_s, handles: (exited, []))
    monkeypatch.setattr(opstop, "stop_agents", lambda *a, **k: pytest.fail("nothing runs: nothing to stop"))
    out = opstop.stop(ref, grace_s=2)
    assert stop_requested(ref.jobdir, since=began), "the launcher would resume the job"
    assert out["ended"] == "failed" and out["launcher"] == f"pid {launcher['pid']} on {launcher['host']}, finishing"
    assert stop_cli._table(out).endswith("(failed); its launcher (" + out["launcher"] + ") is told not to resume it")
    assert opstop._index_state("short2") == "failed"


def test_a_stop_as_the_launcher_begins_the_next_run_stops_that_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: dict[str, object]
) -> None:
    # the row the stop resolved said failed; the launcher wrote `launching` before it could see the stop request
    ref = _ended_job(tmp_path, monkeypatch, "failed", launcher)
    db = JobDB()
    db.update("short2", state="launching")
    db.close()
    monkeypatch.setattr(opstop, "site_view", lambda ref, timeout_s, handles: ([], []))
    monkeypatch.setattr(opstop, "ask_controller", lambda *a, **k: (_ for _ in ()).throw(LaunchError("not yet")))
    stopped: list[int] = []
    monkeypatch.setattr(opstop, "stop_agents", lambda *a, **k: stopped.append(1) or [])
    out = opstop.stop(ref, grace_s=2)
    assert "ended" not in out and stopped == [1] and opstop._index_state("short2") == "stopped"
    assert [e["event"] for e in ref.jobdir.read_lines(ref.jobdir.events)] == [STOP_REQUESTED, "stopped_by_operator"]


def test_a_controller_killed_by_a_stop_ends_the_job_stopped_not_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the launcher saw its controller (killed past the grace) gone without a summary and wrote `failed` before the
    # operator's `stopped`, which then replaced no live state: the index said the stopped job failed
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("j", explicit=tmp_path / "j1")
    spec = load_job(ROOT / "jobs" / "demo.yaml").spec
    db = JobDB()
    local = {"datacenter": "d", "scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": [{"host": "h", "gpus": 1}]}
    run = JobRun(jd, spec, {}, db=db, sites={"local": Site.model_validate(local)})
    db.put("j1", job_dir=str(jd.path), spec={"name": "j"})
    db.update("j1", state="running")
    run.controller = SimpleNamespace(spec=SimpleNamespace(log_path=jd.log("controller", 0)))  # type: ignore[assignment]
    monkeypatch.setattr(run, "_watch", lambda h: -9)  # SIGKILLed by the stop's forced part
    monkeypatch.setattr(run, "log_tail", lambda *a, **k: "")
    jd.event(STOP_REQUESTED)  # `rlctl stop`, first thing it does
    with pytest.raises(Stopped, match=r"stopped by `rlctl stop` \(forced: its controller ended with -9 \(SIGKILL\)"):
        run.wait(poll_s=0)
    assert db.get("j1").state == "stopped"
    assert not db.update("j1", state="stopped", only_from=("launching", "running"))  # the operator's, second
    db.close()


# a controller that outlives a graceful stop (it ignores SIGTERM; no controller.json: it never answers `shutdown`),
# so that `rlctl stop` kills it past its grace; READY says the SIGTERM handler is set
STUBBORN_CONTROLLER = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); open(sys.argv[1], 'w'); time.sleep(600)"
)


def test_the_launcher_of_a_job_a_forced_stop_ended_says_it_was_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # its line read "the controller exited with -9 (SIGKILL) without a summary" and named the resume as for a
    # crash, while the index said stopped. A real launcher (`rlctl attach`, a process of its own, watches the
    # recorded controller to its end as `launch` does) and a real `rlctl stop` (TERM, grace, KILL)
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("j", explicit=tmp_path / "j1")
    jd.write_job(load_job(ROOT / "jobs" / "demo.yaml").spec, source="demo.yaml")
    # (a plan as a launch writes it: attach refuses one out of shape, b44da7d)
    plan = {"controller_site": "local", "trainer": {"site": "local", "ranks": 1}, "rollout": []}
    jd.write_json(jd.plan_json, plan)
    local = {"datacenter": "d", "scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": [{"host": "h", "gpus": 1}]}
    write_sites(jd.path, {"local": Site.model_validate(local)})
    ready = tmp_path / "ready"
    controller = subprocess.Popen([sys.executable, "-c", STUBBORN_CONTROLLER, str(ready)], start_new_session=True)
    spec = AgentSpec("controller", 0, "local", [], log_path=jd.log("controller", 0))
    record_agent(jd.path, AgentHandle(spec, {"pid": controller.pid, "pgid": controller.pid}, "local"))
    db = JobDB()
    db.put("j1", job_dir=str(jd.path), spec={"name": "j"})
    db.update("j1", state="running")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "rlctl", "attach", str(jd.path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 60  # a bound on the wait, not a timing assertion
        while db.get("j1").info.get("launcher", {}).get("pid") != launcher.pid or not ready.exists():
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
            time.sleep(0.05)
        out = opstop.stop(JobRef("j1", jd, db.get("j1")), grace_s=0.2)
        assert out["graceful"].startswith("controller did not answer") and out["agents"] == ["controller-0"]
        _, err = launcher.communicate(timeout=60)
    finally:
        for p in (launcher, controller):
            p.kill()
            p.wait()
    line = err.strip().splitlines()[-1]
    assert line.startswith("rlctl: error: job j1 was stopped by `rlctl stop` (forced: its controller ended with "), err
    assert "without a summary" in line and line.endswith("(hint: continue it with `rlctl launch --resume j1`)")
    assert launcher.returncode == 1  # as for a graceful stop (`job … did not finish: stopped`)
    assert db.get("j1").state == "stopped"
    db.close()


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process group leader, as one that now has the pid an ended agent had (PID reuse)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, start_new_session=True
    )
    yield proc
    proc.kill()
    proc.wait()


def _local_agents(jd: JobDir, ident: dict[str, int]) -> None:
    local = {"datacenter": "d", "scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": [{"host": "h", "gpus": 1}]}
    write_sites(jd.path, {"local": Site.model_validate(local)})
    row = {"name": "rollout-0", "role": "rollout", "replica": 0, "site": "local", "backend": "local"}
    (jd.path / "agents.jsonl").write_text(json.dumps(row | {"ident": ident, "host": None, "gpus": None, "log": None}))


def test_a_stop_of_an_ended_job_leaves_a_process_that_reused_an_agents_pid_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stranger: subprocess.Popen[bytes]
) -> None:
    # the job finished long ago; its rollout's recorded pgid now leads an unrelated process group: `_any_running`
    # took that group for the agent and the forced stop killed it
    ref = _ended_job(tmp_path, monkeypatch, "finished")
    ticks = local.start_ticks(stranger.pid)
    assert ticks is not None
    _local_agents(ref.jobdir, {"pid": stranger.pid, "pgid": stranger.pid, "start_ticks": ticks - 1})
    out = opstop.stop(ref, grace_s=1)
    assert out["ended"] == "finished" and out["agents"] == []
    assert stranger.poll() is None, "the stop killed a process that is not the job's"


def test_a_stop_of_an_ended_job_does_not_signal_an_agent_of_an_old_record_it_cannot_identify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stranger: subprocess.Popen[bytes]
) -> None:
    # an agents.jsonl of an older rlctl records no start time: the group may be the job's orphan or a stranger's
    ref = _ended_job(tmp_path, monkeypatch, "finished")
    _local_agents(ref.jobdir, {"pid": stranger.pid, "pgid": stranger.pid})
    out = opstop.stop(ref, grace_s=1)
    assert out["ended"] == "finished" and stranger.poll() is None
    assert out["problems"] == [
        f"rollout-0: not stopped: its record (an older rlctl's) has no start time to tell its process group "
        f"{stranger.pid} from one that took the id since the job ended (if it is the job's: kill -- -{stranger.pid})"
    ]
    assert stop_cli._table(out).splitlines()[1] == f"problem: {out['problems'][0]}"


def test_the_local_backend_signals_a_recorded_agent_only_while_its_start_time_matches(
    stranger: subprocess.Popen[bytes],
) -> None:
    spec = AgentSpec("rollout", 0, "local", [])
    ticks = local.start_ticks(stranger.pid)
    assert ticks is not None
    backend = local.LocalBackend()  # another terminal's: it holds no Popen of the agent
    reused = AgentHandle(spec, {"pid": stranger.pid, "pgid": stranger.pid, "start_ticks": ticks + 1}, "local")
    assert backend.poll(reused) == LOST  # gone, as far as the job is concerned (how it ended: not known here)
    backend.stop([reused], grace_s=0.5)
    assert stranger.poll() is None
    agent = AgentHandle(spec, {"pid": stranger.pid, "pgid": stranger.pid, "start_ticks": ticks}, "local")
    assert backend.poll(agent) is None
    backend.stop([agent], grace_s=5)
    assert stranger.wait(timeout=5) == -signal.SIGTERM


def test_the_local_backend_records_its_agents_start_time(tmp_path: Path) -> None:
    backend = local.LocalBackend()
    h = backend.start(AgentSpec("rollout", 0, "local", [sys.executable, "-c", "import time; time.sleep(30)"]))
    try:
        assert h.ident["start_ticks"] == local.start_ticks(h.ident["pid"]) and h.ident["start_ticks"] > 0
    finally:
        backend.stop([h], grace_s=2)


def _running_job_of(
    stranger: subprocess.Popen[bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str = "running"
) -> JobRef:
    """A job (its row: `state`) whose one recorded agent (rollout-0) is `stranger` and runs, and whose controller
    does not answer."""
    ref = _ended_job(tmp_path, monkeypatch, state)
    ticks = local.start_ticks(stranger.pid)
    _local_agents(ref.jobdir, {"pid": stranger.pid, "pgid": stranger.pid, "start_ticks": ticks or 0})
    monkeypatch.setattr(opstop, "ask_controller", lambda *a, **k: (_ for _ in ()).throw(LaunchError("gone")))
    return ref


def test_a_stop_of_a_job_whose_plan_cannot_be_read_still_stops_its_agents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stranger: subprocess.Popen[bytes]
) -> None:
    # plan.json cut short: the stop failed with a traceback before it stopped anything
    ref = _running_job_of(stranger, tmp_path, monkeypatch)
    ref.jobdir.write_json(ref.jobdir.path / "staged.json", {"local": {"roots": {"localhost": str(ref.jobdir.path)}}})
    ref.jobdir.plan_json.write_text('{"controller_site": "lo')
    out = opstop.stop(ref, grace_s=2)
    assert out["agents"] == ["rollout-0"] and stranger.wait(timeout=5) == -signal.SIGTERM
    assert len(out["problems"]) == 1 and "plan.json: not valid JSON" in out["problems"][0]


def _damage(ref: JobRef) -> Path:
    """A line of the job's agents.jsonl cut short (a full disk, an edit), before the records it holds."""
    agents = ref.jobdir.path / "agents.jsonl"
    agents.write_text('{"name": "rollout-1", "role": "roll\n' + agents.read_text() + "\n")
    return agents


@pytest.mark.parametrize("state", ["running", "failed"])
def test_a_stop_stops_every_agent_it_can_read_past_a_damaged_line_of_agents_jsonl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stranger: subprocess.Popen[bytes], state: str
) -> None:
    # the stop failed in one line before it stopped anything (failed: a job whose row says it ended while an agent
    # of it runs on, where the check for such orphans read the record strictly); now the agents it can read are
    # stopped and the damaged line is one of its problems
    ref = _running_job_of(stranger, tmp_path, monkeypatch, state=state)
    agents = _damage(ref)
    out = opstop.stop(ref, grace_s=2)
    assert "ended" not in out and out["agents"] == ["rollout-0"] and stranger.wait(timeout=5) == -signal.SIGTERM
    assert len(out["problems"]) == 1 and out["problems"][0].startswith(f"{agents}: line 1 is not valid JSON")


def test_a_damaged_line_of_agents_jsonl_still_stops_the_units_recorded_on_the_controllers_site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stranger: subprocess.Popen[bytes]
) -> None:
    # the controller keeps its record elsewhere and recorded a unit it started on scale (rollout-5) there only: the
    # lookup of the controller's host read the operator's agents.jsonl strictly, so its damaged line read as "the
    # controller site's agent record is unreachable" and rollout-5 ran on
    ref = _running_job_of(stranger, tmp_path, monkeypatch)
    site_root = tmp_path / "site"
    site_root.mkdir()
    write_sites(
        ref.jobdir.path,
        {"local": Site.model_validate(LOCAL_SITE | {"scheduler": {"kind": "local", "workdir": str(tmp_path / "w")}})},
    )
    ref.jobdir.write_json(ref.jobdir.path / "staged.json", {"local": {"roots": {"localhost": str(site_root)}}})
    ref.jobdir.write_json(ref.jobdir.plan_json, {"controller_site": "local"})
    agents = ref.jobdir.path / "agents.jsonl"
    row = json.loads(agents.read_text())
    (site_root / "agents.jsonl").write_text(json.dumps(row | {"name": "rollout-5", "replica": 5}) + "\n")
    gone = {"pid": 2**22 + 1, "pgid": 2**22 + 1, "start_ticks": 1}  # past pid_max: names no process
    row |= {"ident": gone}
    agents.write_text('{"name": "rollout-1", "role": "roll\n' + json.dumps(row) + "\n")
    fetched: list[Path] = []  # the controller site's record: one fetch (an SSH command on a remote site) per stop
    real = agentrecords.remote_agent_lines
    monkeypatch.setattr(
        agentrecords, "remote_agent_lines", lambda job_dir, *view: fetched.append(job_dir) or real(job_dir, *view)
    )
    out = opstop.stop(ref, grace_s=2)
    assert len(fetched) == 1  # it read it twice: once for the agents, once for which of them are this run's
    assert out["agents"] == ["rollout-0", "rollout-5"] and stranger.wait(timeout=5) == -signal.SIGTERM
    assert len(out["problems"]) == 1 and out["problems"][0].startswith(f"{agents}: line 1 is not valid JSON")


def test_the_launchers_stop_stops_every_agent_it_can_read_past_a_damaged_line_of_agents_jsonl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stranger: subprocess.Popen[bytes]
) -> None:
    # `JobRun.stop` (Ctrl-C of `rlctl launch`, what is left of a failed run before an auto-resume) read the record
    # strictly: a damaged line raised before it stopped anything, and the whole job ran on
    ref = _running_job_of(stranger, tmp_path, monkeypatch)
    _damage(ref)
    run = JobRun(ref.jobdir, load_job(ROOT / "jobs" / "demo.yaml").spec, {}, db=None)
    with pytest.raises(LaunchError, match=r"agents\.jsonl: line 1 is not valid JSON .*: left out$"):
        run.stop(grace_s=2)
    assert stranger.wait(timeout=5) == -signal.SIGTERM


def test_a_resume_stops_what_is_left_of_the_last_run_past_a_damaged_line_of_agents_jsonl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stranger: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    # `launch --resume` read the record strictly: a line cut short by a full disk refused every resume, for good
    ref = _running_job_of(stranger, tmp_path, monkeypatch, state="failed")
    agents = _damage(ref)
    refuse_if_running(ref.jobdir)
    assert stranger.wait(timeout=5) == -signal.SIGTERM
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(m.startswith(f"{agents}: line 1 is not valid JSON") and "exits once it finds" in m for m in said)


def test_a_stop_with_no_grace_still_gives_the_controller_time_to_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stranger: subprocess.Popen[bytes]
) -> None:
    # `--grace 0` asked the controller with a 0 s timeout: a healthy one read as "did not answer; forcing"
    ref = _running_job_of(stranger, tmp_path, monkeypatch)
    asked: list[float] = []
    monkeypatch.setattr(opstop, "ask_controller", lambda ref, kind, body, *, timeout_s: asked.append(timeout_s) or {})
    out = opstop.stop(ref, grace_s=0)
    assert out["graceful"] == "requested" and len(asked) == 1 and asked[0] >= 1.0
    assert stranger.wait(timeout=5) < 0  # and the agents stopped, with no grace


LOCAL_SITE = {"datacenter": "d", "scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": [{"host": "h", "gpus": 1}]}


def test_a_stop_after_a_resume_lists_this_runs_agents_and_an_earlier_runs_orphan_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # rollout-2, scaled in during run 1 and never started again, was listed under `agents stopped` after a resume:
    # the list named every unit any run had recorded. An orphan of run 1 that still runs is stopped and listed.
    ref = _ended_job(tmp_path, monkeypatch, "running")
    write_sites(ref.jobdir.path, {"local": Site.model_validate(LOCAL_SITE)})
    monkeypatch.setattr(opstop, "ask_controller", lambda *a, **k: (_ for _ in ()).throw(LaunchError("gone")))
    backend = local.LocalBackend()
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]

    def started(role: str, replica: int, *, runs: bool) -> AgentHandle:
        h = backend.start(AgentSpec(role, replica, "local", sleep if runs else [sys.executable, "-c", ""]))
        record_agent(ref.jobdir.path, h)
        return h

    run1 = [started("controller", 0, runs=False), started("rollout", 0, runs=False)]
    run1 += [started("rollout", 2, runs=False), started("rollout", 3, runs=True)]  # rollout-3: the orphan
    backend.stop(run1[:3], grace_s=2)  # run 1 ended (rollout-2 scaled in before)
    run2 = [started("controller", 0, runs=True), started("rollout", 0, runs=True)]
    try:
        out = opstop.stop(ref, grace_s=2)
        assert sorted(out["agents"]) == ["controller-0", "rollout-0", "rollout-3"], out
        assert all(backend.poll(h) is not None for h in [*run2, run1[3]]), "every agent that ran is stopped"
    finally:
        backend.stop([*run2, run1[3]], grace_s=2)


# a launcher as far as the lock goes: holds the job's launcher lock until the stop is over (its event), and lets go
# a moment later, as a launcher does once it has stopped what was left and fetched the record
ENDING_LAUNCHER = """
import sys, time
from pathlib import Path
from rlctl.launch.jobdir import JobDir
jd = JobDir(Path(sys.argv[1]))
with jd.launcher_lock():
    Path(sys.argv[2]).touch()
    while "stopped_by_operator" not in jd.events.read_text() if jd.events.exists() else True:
        time.sleep(0.05)
    time.sleep({linger_s})
"""


def _lock_holder(jd: JobDir, tmp_path: Path, linger_s: float) -> subprocess.Popen[bytes]:
    ready = tmp_path / "locked"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = ENDING_LAUNCHER.format(linger_s=linger_s)
    proc = subprocess.Popen([sys.executable, "-c", code, str(jd.path), str(ready)], env=env)
    deadline = time.monotonic() + 60  # a bound on the wait, not a timing assertion
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    return proc


def test_a_stop_returns_once_the_jobs_launcher_let_go_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stranger: subprocess.Popen[bytes]
) -> None:
    # `rlctl stop` returned while the launcher still ended (stopping what was left, fetching the record): a
    # `launch --resume` right after it was refused, `has a launcher already`, and worked 3 s later
    ref = _running_job_of(stranger, tmp_path, monkeypatch)
    holder = _lock_holder(ref.jobdir, tmp_path, linger_s=0.5)
    try:
        out = opstop.stop(ref, grace_s=2)
        with ref.jobdir.launcher_lock():  # what `launch --resume` takes first: refused while the launcher holds it
            pass
    finally:
        holder.kill()
        holder.wait()
    assert out["launcher"].startswith(f"pid {holder.pid} on {socket.gethostname()}: ended "), out
    assert out["launcher"].endswith(" s after the agents (waited for it)")
    assert ["launcher", out["launcher"]] in [row.split(None, 1) for row in stop_cli._table(out).splitlines()[2:]]


def test_a_stop_waits_for_a_launcher_that_does_not_end_only_so_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stranger: subprocess.Popen[bytes]
) -> None:
    ref = _running_job_of(stranger, tmp_path, monkeypatch)
    monkeypatch.setattr(opstop, "LAUNCHER_END_S", 0.5)
    holder = _lock_holder(ref.jobdir, tmp_path, linger_s=600)
    try:
        out = opstop.stop(ref, grace_s=2)
        assert ref.jobdir.launcher_holder() == f"pid {holder.pid} on {socket.gethostname()}"
    finally:
        holder.kill()
        holder.wait()
    assert out["launcher"] == (
        f"pid {holder.pid} on {socket.gethostname()}: still running after 0.5 s (a `launch --resume` is refused until "
        "it ends)"
    )


def test_a_resume_of_a_job_that_runs_without_its_launcher_names_attach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # its launcher gone, the controller answering: the hint said `stop it first: rlctl stop …`, where `rlctl
    # attach` watches the job on without losing its progress
    jd = JobDir.create("orphaned", explicit=tmp_path / "orphaned-1")

    class Answers:
        def close(self) -> None:
            pass

    monkeypatch.setattr(refusals, "connect_client", lambda jobdir, *, timeout_s, name: Answers())
    with pytest.raises(UsageError) as e:
        refuse_if_running(jd)
    assert str(e.value) == "job orphaned-1 is running (its controller answers; no launcher watches it)"
    assert e.value.hint == "`rlctl attach orphaned-1` watches it to its end again; `rlctl stop orphaned-1` ends it"


def test_a_checkpoint_the_stop_cannot_tell_of_names_the_one_a_resume_takes_from_the_events(tmp_path: Path) -> None:
    # the controller keeps its checkpoints on another site (no latest.json here): the newest one its run completed
    jd = JobDir(tmp_path)
    jd.event("checkpoint", version=30)  # the run before's (a resume from v10 set it aside)
    jd.event("controller_listening", address="tcp://h1:1")
    jd.event("checkpoint", version=10)
    jd.event("stop_requested", by="client-0", grace_s=3.0, checkpoint=20)
    assert opstop._checkpoint_outcome(jd, 20) == f"{NOT_KNOWN} (iter-10)"


@pytest.mark.parametrize("versions", [None, "20", 20])
def test_an_abandoned_checkpoint_event_whose_versions_are_not_a_list_says_nothing_of_it(
    tmp_path: Path, versions: object
) -> None:
    # a row edited by hand (or damaged): `20 in None`, `20 in "20"` were a TypeError traceback ending `rlctl stop`
    jd = JobDir(tmp_path)
    jd.event("stop_requested", by="client-0", grace_s=3.0, checkpoint=20)
    jd.event("checkpoint_abandoned", versions=versions, latest=10)
    jd.event("job_end", state="stopped")
    assert opstop._checkpoint_outcome(jd, 20) == NOT_BEGUN


def test_a_resumed_run_that_completed_no_checkpoint_names_the_one_it_resumed_from(tmp_path: Path) -> None:
    # the controller on another site, its run resumed from v10 and completed none: "this job dir names none" before
    jd = JobDir(tmp_path)
    jd.event("checkpoint", version=30)  # the run before's (set aside by the resume)
    jd.event("resumed", version=10, pointer="", skipped=[])
    jd.event("controller_listening", address="tcp://h1:1")
    jd.event("stop_requested", by="client-0", grace_s=3.0, checkpoint=20)
    assert opstop._checkpoint_outcome(jd, 20) == f"{NOT_KNOWN} (iter-10)"


def test_what_became_of_the_checkpoint_a_stop_waited_for_is_read_from_the_events_that_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it parsed every event of the job: a weights_applied per unit and weight version (640,000 lines after weeks)
    jd = JobDir(tmp_path)
    applied = "".join(json.dumps({"t": 2.0, "event": "weights_applied", "version": v}) + "\n" for v in range(300))
    jd.event("resumed", version=10, pointer="", skipped=[])
    jd.event("controller_listening", address="tcp://h1:1")
    with jd.events.open("a") as f:
        f.write(applied)
    jd.event("stop_requested", by="client-0", grace_s=3.0, checkpoint=20)
    with jd.events.open("a") as f:
        f.write(applied)
    parsed: list[str] = []
    loads = json.loads
    monkeypatch.setattr(json, "loads", lambda s, *a, **k: parsed.append(s) or loads(s, *a, **k))
    assert opstop._checkpoint_outcome(jd, 20) == f"{NOT_KNOWN} (iter-10)"
    assert [s for s in parsed if "weights_applied" in s] == [applied.splitlines()[-1]]  # (the last line: always)


@pytest.mark.parametrize("version", [None, "v20"])
def test_a_checkpoint_or_resume_event_whose_version_is_no_number_is_passed_over(
    tmp_path: Path, version: object
) -> None:
    """A checkpoint or resumed event whose version is null or text (an edited row) is passed over, versus the stop
    naming 'iter-None' (or 'iter-v20') as the checkpoint a resume takes."""
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    checkpointed, resumed = JobDir(tmp_path / "a"), JobDir(tmp_path / "b")
    for jd in (checkpointed, resumed):
        jd.event("resumed", version=10, pointer="", skipped=[])
    resumed.event("resumed", version=version, pointer="", skipped=[])
    for jd in (checkpointed, resumed):
        jd.event("controller_listening", address="tcp://h1:1")
    checkpointed.event("checkpoint", version=version)
    for jd in (checkpointed, resumed):
        jd.event("stop_requested", by="client-0", grace_s=3.0, checkpoint=20)
        assert opstop._checkpoint_outcome(jd, 20) == f"{NOT_KNOWN} (iter-10)"


def test_a_resume_that_never_started_is_not_the_one_a_resume_takes(tmp_path: Path) -> None:
    """A roll-back to v5 refused before any agent of it started (the job went on as it was) still left its `resumed`
    event: the stop named iter-5 as the checkpoint a resume takes, where the run it stopped had resumed from v10."""
    jd = JobDir(tmp_path)
    jd.event("resumed", version=10, pointer="", skipped=[])
    jd.event("controller_listening", address="tcp://h1:1")
    jd.event("resumed", version=5, pointer="", skipped=[])  # the refused roll-back's
    jd.event(runstate.UNSTARTED, version=5)
    jd.event("stop_requested", by="client-0", grace_s=3.0, checkpoint=20)
    assert opstop._checkpoint_outcome(jd, 20) == f"{NOT_KNOWN} (iter-10)"
    assert [e["version"] for e in runstate.resumes(jd.read_events())] == [10]


def test_a_second_stop_waits_for_the_first_ones_controller_to_end_rather_than_forcing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rlctl stop J`, then `rlctl stop J` a second later: the controller, ending for the first (its listener closed,
    a checkpoint being written), did not answer the second, which said 'did not answer; forcing' and killed it. Now
    a stop asked for before and not over is joined: the controller ends by itself, then what is left is stopped."""
    ref = _ended_job(tmp_path, monkeypatch, "running")
    write_sites(ref.jobdir.path, {"local": Site.model_validate(LOCAL_SITE)})
    monkeypatch.setattr(opstop, "ask_controller", lambda *a, **k: (_ for _ in ()).throw(LaunchError("refused")))
    backend = local.LocalBackend()
    ending = backend.start(AgentSpec("controller", 0, "local", [sys.executable, "-c", "import time; time.sleep(2)"]))
    unit = backend.start(AgentSpec("rollout", 0, "local", [sys.executable, "-c", "import time; time.sleep(60)"]))
    for h in (ending, unit):
        record_agent(ref.jobdir.path, h)
    ref.jobdir.event("controller_listening", address="tcp://127.0.0.1:1")
    ref.jobdir.event(opstop.STOP_REQUESTED)  # the first stop's, still waiting for the controller
    assert opstop.stop_under_way(ref.jobdir)
    said: list[str] = []
    try:
        out = opstop.stop(ref, grace_s=30, say=said.append)
        assert out["graceful"] == "requested" and "a stop before this one is under way" in said[0], (out, said)
        assert backend.poll(ending) == 0  # it ended by itself, not by the stop's TERM
        assert backend.poll(unit) is not None
    finally:
        backend.stop([ending, unit], grace_s=2)
    assert not opstop.stop_under_way(ref.jobdir)  # this stop is over (its stopped_by_operator)


def test_a_jobs_recorded_sites_with_a_relative_work_root_still_read(tmp_path: Path) -> None:
    """Before: a job launched (by an rlctl before the inventory refused it) with a local site's relative workdir
    recorded it so in its sites.json, and every read of that record — `rlctl stop` of the running job, status, a
    resume — then refused the job's own record ('[0].site.scheduler.workdir: … give an absolute path'): nothing could
    stop it. The inventory refuses it; the record the launch wrote reads as written."""
    from rlctl.launch.backends import read_sites

    slurm = LOCAL_SITE | {"scheduler": {"kind": "slurm", "partition": "p", "workdir": "runs"}}
    sites = [
        {"name": "local", "site": LOCAL_SITE | {"scheduler": {"kind": "local", "workdir": "w"}}},
        {"name": "sl", "site": slurm},
    ]
    (tmp_path / "sites.json").write_text(json.dumps(sites))
    read = read_sites(tmp_path)
    assert read["local"].scheduler.workdir == "w" and read["sl"].scheduler.workdir == "runs"
    with pytest.raises(ValueError, match="give an absolute path"):
        Site.model_validate(sites[0]["site"])  # an inventory's: refused


def test_a_stop_of_a_run_begun_since_an_earlier_stop_request_is_not_one_under_way(tmp_path: Path) -> None:
    """A stop of a finished job whose launcher still evaluated it wrote its request and no `stopped_by_operator`;
    the job resumed on a site that keeps the controller's events (its `controller_listening` not fetched here): a
    stop of that run whose controller did not answer said 'a stop before this one is under way' and waited for it
    instead of forcing. The run's start is the launcher's own event of its controller (`agent_started`, its run)."""
    jd = JobDir(tmp_path)
    jd.event("controller_listening", address="tcp://h1:1")  # the finished run's (fetched with its record)
    jd.event(STOP_REQUESTED)  # the ended job's stop, while its launcher evaluated it
    assert opstop.stop_under_way(jd)
    jd.event("agent_started", agent="controller-0", site="h", backend="slurm", ident={}, gpus=None, run="r2")
    jd.event("agent_started", agent="trainer-0", site="h", backend="slurm", ident={}, gpus=None)
    assert not opstop.stop_under_way(jd)
    jd.event(STOP_REQUESTED)  # this run's first stop, waiting for its controller to end
    assert opstop.stop_under_way(jd)


def test_a_stop_reads_only_the_events_that_say_where_its_run_and_stops_stand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rlctl stop` parsed every event of the job to find the run's start and its stop requests: a job of weeks
    writes a weights_applied event per unit and weight version (640,000 lines after 10^4 versions of 64 units)."""
    jd = JobDir(tmp_path)
    row = {"t": 2.0, "event": "weights_applied", "agent": "rollout-0"}
    applied = [json.dumps({**row, "version": v}) for v in range(400)]
    jd.event("agent_started", agent="controller-0", site="h", backend="slurm", ident={}, gpus=None, run="r2")
    with jd.events.open("a") as f:
        f.write("".join(line + "\n" for line in applied))
    jd.event(STOP_REQUESTED)  # this run's stop, waiting for its controller to end
    with jd.events.open("a") as f:
        f.write("".join(line + "\n" for line in applied))
    parsed: list[str] = []
    loads = json.loads
    monkeypatch.setattr(json, "loads", lambda s, *a, **k: parsed.append(s) or loads(s, *a, **k))
    assert opstop.stop_under_way(jd)
    assert "not seen through" in opstop.stop_cut_short(JobRef("j", jd, None), since=0.0)
    assert len(parsed) <= 2 * 3  # each: the run's start, the stop, the last line


def test_a_stop_whose_process_was_killed_before_the_controller_took_it_is_not_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rlctl stop J` killed (Ctrl-C, a closed terminal) before its controller took the request: nothing ends the job,
    yet a second stop read the first's request as a stop under way and, the controller not answering, waited its
    whole grace for an end that was not coming. Now the request names its stop process, and one gone whose request
    the controller did not take (its own `stop_requested`) is no stop under way: the second forces at once."""
    ref = _ended_job(tmp_path, monkeypatch, "running")
    write_sites(ref.jobdir.path, {"local": Site.model_validate(LOCAL_SITE)})
    ref.jobdir.event("controller_listening", address="tcp://127.0.0.1:1")
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stopper = {"host": socket.gethostname(), "pid": killed.pid, "start_ticks": local.start_ticks(killed.pid)}
    killed.kill()
    killed.wait(timeout=10)
    ref.jobdir.event(STOP_REQUESTED, stopper=stopper)  # the killed stop's
    assert not opstop.stop_under_way(ref.jobdir)
    monkeypatch.setattr(opstop, "ask_controller", lambda *a, **k: (_ for _ in ()).throw(LaunchError("refused")))
    backend = local.LocalBackend()
    hung = backend.start(AgentSpec("controller", 0, "local", [sys.executable, "-c", "import time; time.sleep(60)"]))
    record_agent(ref.jobdir.path, hung)
    said: list[str] = []
    try:
        out = opstop.stop(ref, grace_s=600, say=said.append)
        assert out["graceful"] == "controller did not answer (refused); forcing" and said == [], (out, said)
        assert backend.poll(hung) is not None
    finally:
        backend.stop([hung], grace_s=2)
    # the controller took a killed stop's request (it ends by itself), or the stop still runs: under way
    ref.jobdir.event("controller_listening", address="tcp://127.0.0.1:1")
    ref.jobdir.event(STOP_REQUESTED, stopper=stopper)
    ref.jobdir.event(STOP_REQUESTED, by="client-0", grace_s=15.0, checkpoint=None)
    assert opstop.stop_under_way(ref.jobdir)
    ref.jobdir.event("controller_listening", address="tcp://127.0.0.1:1")
    ref.jobdir.event(STOP_REQUESTED, stopper=opstop._stopper())
    assert opstop.stop_under_way(ref.jobdir)


def test_a_stop_racing_a_job_that_just_finished_says_it_finished_as_its_launcher_records_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stranger: subprocess.Popen[bytes]
) -> None:
    """The controller wrote the summary (done) and closed its listener as the stop asked: the stop said 'controller
    did not answer (…); forcing' and 'agents stopped', and the launcher then recorded the job finished."""
    ref = _running_job_of(stranger, tmp_path, monkeypatch)

    def launcher_records_finished(jd: JobDir, *, timeout_s: float, say: object) -> str:
        db = JobDB()
        try:  # what the launcher writes once its controller exited with a done summary (`_register`)
            db.update("short2", state="finished")
        finally:
            db.close()
        return "pid 1 on h: ended 0.2 s after the agents (waited for it)"

    monkeypatch.setattr(opstop, "_launcher_end", launcher_records_finished)
    out = opstop.stop(ref, grace_s=2)
    assert out["graceful"] == "not needed: the job ended (finished) as the stop came, as its launcher recorded it"
    table = stop_cli._table(out)
    assert "forcing" not in table and "agents stopped" not in table and "agents checked gone" in table


def test_a_gone_stops_request_is_under_way_where_the_controller_keeps_its_events_on_another_site(
    tmp_path: Path,
) -> None:
    """A stop Ctrl-C'd while the controller completed a checkpoint (the hint then: `rlctl stop J` again): where the
    controller keeps its events on its own site, its word that it took the request is not here until fetched, and the
    second stop read the request as no stop under way, forced the controller (its listener closed as it ends) and
    cut the checkpoint. It cannot tell there: the request is under way still, as before stops named themselves."""
    jd = JobDir.create("far", explicit=tmp_path / "job")
    far = Site.model_validate({**LOCAL_SITE, "scheduler": {"kind": "local", "workdir": str(tmp_path / "w")}})
    write_sites(jd.path, {"far": far})
    jd.write_json(jd.plan_json, {"controller_site": "far", "trainer": {"site": "far", "ranks": 1}, "rollout": []})
    stage.write_staged(jd.path, {"far": {"roots": {"h": str(tmp_path / "w" / "jobs" / "far")}}})
    jd.event("agent_started", agent="controller-0", site="far", backend="local", ident={}, gpus=None, run="r1")
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stopper = {"host": socket.gethostname(), "pid": killed.pid, "start_ticks": local.start_ticks(killed.pid)}
    killed.kill()
    killed.wait(timeout=10)
    jd.event(STOP_REQUESTED, stopper=stopper)  # the Ctrl-C'd stop's; the controller's `by` is on its site
    assert opstop.stop_under_way(jd)
    stage.write_staged(jd.path, {"far": {"roots": {"h": str(jd.path)}}})  # its events here: it did not take it
    assert not opstop.stop_under_way(jd)


def test_a_controller_keeping_its_events_in_the_job_dir_reached_through_a_symlink_has_them_here(
    tmp_path: Path,
) -> None:
    """A local site whose workdir is the operator's job dir by another path (`~/jobs` a link to `/scratch/jobs`):
    its paths were compared unresolved, so its events read as kept elsewhere and a stop request the controller never
    took (its stop process gone) read as under way: a second stop waited its whole grace, and the record was
    fetched from itself into itself."""
    real = tmp_path / "scratch"
    real.mkdir()
    (tmp_path / "jobs").symlink_to(real)
    jd = JobDir.create("far", explicit=tmp_path / "jobs" / "far")
    far = Site.model_validate({**LOCAL_SITE, "scheduler": {"kind": "local", "workdir": str(real)}})
    write_sites(jd.path, {"far": far})
    jd.write_json(jd.plan_json, {"controller_site": "far", "trainer": {"site": "far", "ranks": 1}, "rollout": []})
    stage.write_staged(jd.path, {"far": {"roots": {"h": str(real / "far")}}})
    jd.event("agent_started", agent="controller-0", site="far", backend="local", ident={}, gpus=None, run="r1")
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stopper = {"host": socket.gethostname(), "pid": killed.pid, "start_ticks": local.start_ticks(killed.pid)}
    killed.kill()
    killed.wait(timeout=10)
    jd.event(STOP_REQUESTED, stopper=stopper)
    assert not opstop.stop_under_way(jd)
    assert record.fetch_record(jd.path, far, "h", str(real / "far")) == []
