"""A run's start clears the run before's controller.json from its record (here, and emptied on the controller's
site) in one step under the fetch lock (`fetching`), versus here as the run started and on the site only after
staging: a `rlctl status -w` fetching as the run staged wrote the run before's controller.json back here, and it
stayed until the new controller listened (a `status` or `stop` meanwhile asked the run before's address, and did
not see a job being prepared); nor does a fetch after that bring the site's emptied copy here as an empty one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlctl.launch.record import FETCH_LOCK, fetch_record
from rlctl.launch.sitefs import LocalFiles
from rlctl.launch.stage import STAGED_FILE
from rlctl.ops import runstart
from tests.unit.ops.test_resume_point import job_run

BEFORE = {"address": "tcp://10.0.0.7:41234"}  # the run before's controller


def test_a_fetch_as_the_run_stages_leaves_no_controller_json_of_the_run_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, sites = job_run(tmp_path)
    jd = sites.c
    root = tmp_path / "on-the-site"  # the controller's site job dir, another machine's
    root.mkdir()
    (root / "controller.json").write_text(json.dumps(BEFORE))
    jd.write_json(jd.controller_json, BEFORE)
    staged = {s: {"roots": {"localhost": str(d)}, "copied": {}} for s, d in (("c", root), ("t", sites.t.path))}
    site = run.sites["c"]

    def staging(job_dir: Path, sites: Any, **kw: Any) -> dict[str, Any]:
        assert not jd.controller_json.exists()  # the run's start removed the run before's
        fetch_record(jd.path, site, "localhost", str(root))  # a `rlctl status -w` as the run stages
        (job_dir / STAGED_FILE).write_text(json.dumps(staged))
        return staged

    monkeypatch.setattr(runstart, "stage_all", staging)
    monkeypatch.setattr(runstart, "_free_port", lambda: 29500)
    monkeypatch.setattr(runstart.RunStart, "_stop_if_asked", lambda self: None)
    run.jobdir.controller_json.unlink()  # as `start` does first
    _, remote = run._prepare("summary.1.json", resume=False, checkpoint=None)
    assert remote
    assert not jd.controller_json.exists()
    assert (root / "controller.json").read_text() == ""  # until this run's controller writes it
    fetch_record(jd.path, site, "localhost", str(root))  # a `rlctl status -w` as the controller starts
    assert not jd.controller_json.exists()


def test_emptying_the_run_befores_record_on_the_controllers_site_leaves_no_file_in_the_job_dir(tmp_path: Path) -> None:
    """The controller's site's controller.json and agents.jsonl are set aside and emptied (each put from an empty
    file), versus that empty file written as `.empty` in the job dir on every start whose controller ran on another
    site, and left there."""
    run, sites = job_run(tmp_path)
    root = tmp_path / "on-the-site"
    root.mkdir()
    (root / "controller.json").write_text(json.dumps(BEFORE))
    (root / "agents.jsonl").write_text('{"name": "rollout-0"}\n')
    here = {p.name for p in sites.c.path.iterdir()}
    run._set_run_before_aside(LocalFiles(), str(root), "summary.1.json")
    assert {p.name: p.read_text() for p in root.iterdir()} == {
        "controller.json": "",
        "agents.jsonl": "",
        ".controller.json.run-before": json.dumps(BEFORE),
        ".agents.jsonl.run-before": '{"name": "rollout-0"}\n',
    }
    assert {p.name for p in sites.c.path.iterdir()} == here | {FETCH_LOCK}  # (the lock the fetches share stays)
