"""`rlctl stop` (rlctl.ops.operate.stop) when the controller's site stops answering: the forced stop still runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.commands import stop as stop_cli
from rlctl.config.inventory import Site
from rlctl.errors import LaunchError
from rlctl.launch.backends import write_sites
from rlctl.launch.jobdir import JobDir
from rlctl.launch.ssh import SshBackend
from rlctl.ops import operate
from rlctl.ops.jobdb import JobDB
from rlctl.ops.jobref import JobRef


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
                | {"ident": {"host": h, "pid": 1, "pgid": 1, "start_ticks": 1}}
            )
            + "\n"
            for n, r, h, g in agents
        )
    )
    monkeypatch.setattr(operate, "ask_controller", lambda *a, **k: {})  # it accepted `shutdown`

    def poll(self: SshBackend, handle: object) -> None:
        raise LaunchError("ssh h1: cannot connect: timed out")

    monkeypatch.setattr(SshBackend, "poll", poll)
    stopped: list[list[str]] = []
    monkeypatch.setattr(operate, "stop_agents", lambda b, hs, grace_s: stopped.append([h.spec.name for h in hs]) or [])
    out = operate.stop(JobRef("stopjob", JobDir(tmp_path), None), grace_s=2)
    assert stopped == [["controller-0", "rollout-0"]] and out["problems"] == []


def _ended_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str) -> JobRef:
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("short", explicit=tmp_path / "short2")
    write_sites(jd.path, {})
    db = JobDB()
    try:
        db.put("short2", job_dir=str(jd.path), spec={"name": "short"})
        db.update("short2", state=state)
        row = db.get("short2")
    finally:
        db.close()
    return JobRef("short2", jd, row)


def _index_state(name: str) -> str:
    db = JobDB()
    try:
        return db.get(name).state
    finally:
        db.close()


def test_a_stop_of_a_finished_job_says_so_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # its index row became `stopped`, a stop event was written and its exited agents listed as stopped
    ref = _ended_job(tmp_path, monkeypatch, "finished")
    exited = [{"name": "controller-0", "state": "exited 0"}, {"name": "rollout-0", "state": "exited 0"}]
    monkeypatch.setattr(operate, "site_view", lambda ref, timeout_s: (exited, []))
    monkeypatch.setattr(operate, "stop_agents", lambda *a, **k: pytest.fail("nothing runs: nothing to stop"))
    out = operate.stop(ref, grace_s=2)
    assert out == {"id": "short2", "ended": "finished", "graceful": "-", "agents": [], "problems": []}
    assert _index_state("short2") == "finished" and not ref.jobdir.events.exists()
    assert stop_cli._table(out) == "job short2 already ended (finished)"


def test_an_orphan_of_a_failed_job_is_stopped_and_the_index_keeps_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = _ended_job(tmp_path, monkeypatch, "failed")
    running = [{"name": "rollout-0", "state": "running"}]
    monkeypatch.setattr(operate, "site_view", lambda ref, timeout_s: (running, []))
    monkeypatch.setattr(operate, "ask_controller", lambda *a, **k: (_ for _ in ()).throw(LaunchError("gone")))
    monkeypatch.setattr(operate, "stop_agents", lambda *a, **k: [])
    out = operate.stop(ref, grace_s=2)
    assert "ended" not in out and out["graceful"].startswith("controller did not answer")
    assert _index_state("short2") == "failed"  # the stop of a leftover is not the job's end
