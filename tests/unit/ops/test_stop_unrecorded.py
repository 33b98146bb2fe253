"""A `rlctl stop` of a job whose events.jsonl cannot be appended to (another user's job dir, a read-only mount; here,
as root may write anywhere, its open to append refused): the stop still happens (the controller asked, every agent
stopped, the index row `stopped`) and says, naming the file, which of its events it could not record (exit 3),
versus an OSError's traceback from its first event, its stop request, before anything was stopped."""

from __future__ import annotations

import json
import pathlib
from pathlib import Path
from typing import Any

import pytest

from rlctl.config.inventory import Site
from rlctl.launch.backends import write_sites
from rlctl.launch.jobdir import JobDir
from rlctl.launch.ssh import SshBackend
from rlctl.ops import stop as opstop
from rlctl.ops.jobref import JobRef
from tests.conftest import run_cli

EVENTS_REFUSED = "Permission denied"


def _job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[JobDir, list[list[str]], list[str]]:
    """A job of two agents on an SSH site, its controller answering `shutdown`, its agents' stops recorded; its
    events.jsonl refused to append to. The agents stopped, and the requests the controller was asked."""
    site = Site.model_validate(
        {"datacenter": "d", "scheduler": {"kind": "ssh"}, "gpu": "H20", "nodes": [{"host": "h[1-2]", "gpus": 8}]}
    )
    write_sites(tmp_path, {"h20": site})
    (tmp_path / "job.json").write_text("{}")
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
    asked: list[str] = []
    monkeypatch.setattr(opstop, "ask_controller", lambda _ref, what, *a, **k: asked.append(what) or {})
    monkeypatch.setattr(SshBackend, "poll", lambda self, handle: 0)  # (the controller ended)
    stopped: list[list[str]] = []
    monkeypatch.setattr(
        opstop, "stop_agents", lambda b, hs, grace_s, **_: stopped.append([h.spec.name for h in hs]) or []
    )
    jd = JobDir(tmp_path)
    opened = pathlib.Path.open

    def refused(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if self == jd.events and "a" in mode:
            raise PermissionError(13, "Permission denied", str(self))
        return opened(self, mode, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "open", refused)
    return jd, stopped, asked


def test_a_stop_whose_events_cannot_be_written_stops_the_job_and_says_what_it_could_not_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jd, stopped, asked = _job(tmp_path, monkeypatch)
    out = opstop.stop(JobRef("stopjob", jd, None), grace_s=2)  # was: PermissionError, nothing stopped
    assert asked == ["shutdown"] and stopped == [["controller-0", "rollout-0"]]
    assert out["problems"] == [] and out["agents"] == ["controller-0", "rollout-0"]
    assert out["unrecorded"] == [
        f"{jd.events}: cannot record the stop_requested event ({EVENTS_REFUSED}): the job's launcher, where one runs, "
        f"may resume it (look at its owner and permissions: `ls -la {jd.path}`)",
        f"{jd.events}: cannot record the stopped_by_operator event ({EVENTS_REFUSED}) "
        f"(look at its owner and permissions: `ls -la {jd.path}`)",
    ]
    assert not jd.events.exists()


def test_the_cli_says_the_stop_it_made_and_what_it_could_not_record_exit_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jd, stopped, _ = _job(tmp_path, monkeypatch)
    r = run_cli("stop", str(jd.path), "--grace", "2")
    assert r.exit_code == 3 and "Traceback" not in r.stderr, r.stderr
    assert stopped == [["controller-0", "rollout-0"]]
    assert r.stderr.startswith(f"rlctl: error: job {jd.id}: stopped, but {jd.events}: cannot record the "), r.stderr
    assert r.stderr.count("\n") == 1
    assert "agents stopped  controller-0, rollout-0" in r.stdout and "not recorded" in r.stdout, r.stdout
