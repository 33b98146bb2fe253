"""The links a launch records in plan.json (`jobprep.prepare`) are those the planner and `rlctl check` price the
weights' route over, and the weight plane's tree over them takes that route."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rlctl.agents.placement import Placement
from rlctl.config import load_job
from rlctl.launch.backends import read_sites
from rlctl.launch.jobdir import JobDir
from rlctl.ops import jobprep
from rlctl.ops.preflight.sites import link_problems
from rlctl.planner.weightsync import weight_route, weight_sites
from rlctl.weights.plan import Endpoint, plan_broadcast
from tests.unit.ops.test_preflight import job_dict

DCS = {"a": "dc-a", "m": "dc-m", "b": "dc-b", "b2": "dc-b", "x": "dc-x"}
LINKS = [["a", "m"], ["m", "b"], ["a", "b2"], ["a", "x"]]  # a–b2: b2 unused, in b's datacenter; x: unused


def test_the_job_dir_records_the_links_the_planned_route_crosses_and_the_tree_takes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rollout on m and b, a link a–b2 from a site the job does not use: plan.json records a–m and m–b, check passes
    the job, the planner prices b's copy over a → m → b (10 Gb/s, 1 + 1 ms) and the broadcast tree over the recorded
    links sends it b's way through m's unit. Versus the planner pricing the a–b2 link for b (one hop, 1 ms), one
    the weight plane never had."""
    site = {"scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": [{"host": "localhost", "gpus": 2}]}
    inv = {
        "apiVersion": "rlctl/v1",
        "kind": "Inventory",
        "sites": {n: {"datacenter": dc, **site} for n, dc in DCS.items()},
        "links": [{"between": pair, "bandwidth_gbps": 10} for pair in LINKS],
    }
    (tmp_path / "dcs.yaml").write_text(yaml.safe_dump(inv))
    placement = {"trainer": {"site": "a", "gpus": 1}, "rollout": [{"site": "m", "gpus": 1}, {"site": "b", "gpus": 1}]}
    (tmp_path / "job.yaml").write_text(
        yaml.safe_dump(job_dict(inventory=[str(tmp_path / "dcs.yaml")], placement=placement))
    )
    job = load_job(tmp_path / "job.yaml")
    assert link_problems(job) == []
    sites, units = weight_sites(job, ["m", "b"])
    assert weight_route(job.inventory, "a", "b", job_sites=sites, unit_sites=units) == (10e9 / 8, 0.002)

    plan: dict[str, Any] = {
        "source": "job",
        "controller_site": "a",
        "trainer": {"site": "a", "ranks": 1, "parallel": {"tp": 1, "pp": 1, "dp": 1}},
        "rollout": [{"site": "m", "units": 1, "tp": 1}, {"site": "b", "units": 1, "tp": 1}],
    }
    monkeypatch.setattr(jobprep, "resolve_inputs", lambda spec, _job: spec)
    monkeypatch.setattr(jobprep, "copy_inputs", lambda *_a, **_k: None)
    jobdir = JobDir(tmp_path / "run")
    jobdir.path.mkdir()
    jobprep.prepare(jobdir, job.spec, plan, source=str(job.path), job=job)
    recorded = jobdir.read_plan()
    assert recorded["links"] == [["a", "m"], ["b", "m"]]
    dc_links = Placement(recorded, read_sites(jobdir.path), {}, job.spec).dc_links
    assert dc_links == [["dc-a", "dc-m"], ["dc-b", "dc-m"]]
    tree = plan_broadcast(
        [Endpoint("trainer-0", "dc-a")],
        [Endpoint("rollout-1", "dc-b"), Endpoint("rollout-0", "dc-m")],
        dc_links={frozenset(p) for p in dc_links},
    )
    assert tree.parent == {"rollout-0": "trainer-0", "rollout-1": "rollout-0"}
