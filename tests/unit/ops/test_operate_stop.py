"""`rlctl stop` (rlctl.ops.operate.stop) when the controller's site stops answering: the forced stop still runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.config.inventory import Site
from rlctl.errors import LaunchError
from rlctl.launch.backends import write_sites
from rlctl.launch.jobdir import JobDir
from rlctl.launch.ssh import SshBackend
from rlctl.ops import operate
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
