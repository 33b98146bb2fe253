"""The links a launch records in plan.json (`jobprep.prepare`) are those the planner and `rlctl check` price the
weights' route over, and the weight plane's tree over them takes that route: a link counts between the datacenters
of its two sites wherever both hold a site of the job (`Inventory.links_among`, `dc_links_among`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rlctl.agents.placement import Placement
from rlctl.config import load_job
from rlctl.config.job import Job
from rlctl.launch.backends import read_sites
from rlctl.launch.jobdir import JobDir
from rlctl.ops import jobprep
from rlctl.ops.preflight.sites import link_problems
from rlctl.planner.weightsync import weight_route, weight_sites
from rlctl.weights.plan import Endpoint, plan_broadcast
from tests.unit.ops.test_preflight import job_dict

DCS = {"a": "dc-a", "m": "dc-m", "b": "dc-b", "b2": "dc-b", "x": "dc-x"}
LINKS = [["a", "m"], ["m", "b"], ["a", "x"]]  # x: unused, dc-x no datacenter of the job


def _job(tmp_path: Path, links: list[list[str]], rollout: list[str], dcs: dict[str, str] = DCS) -> Job:
    site = {"scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": [{"host": "localhost", "gpus": 2}]}
    inv = {
        "apiVersion": "rlctl/v1",
        "kind": "Inventory",
        "sites": {n: {"datacenter": dc, **site} for n, dc in dcs.items()},
        "links": [{"between": pair, "bandwidth_gbps": 10} for pair in links],
    }
    (tmp_path / "dcs.yaml").write_text(yaml.safe_dump(inv))
    trainer = next(iter(dcs))
    placement = {"trainer": {"site": trainer, "gpus": 1}, "rollout": [{"site": r, "gpus": 1} for r in rollout]}
    (tmp_path / "job.yaml").write_text(
        yaml.safe_dump(job_dict(inventory=[str(tmp_path / "dcs.yaml")], placement=placement))
    )
    return load_job(tmp_path / "job.yaml")


def _prepare(tmp_path: Path, job: Job, rollout: list[str], monkeypatch: pytest.MonkeyPatch) -> JobDir:
    trainer = job.spec.placement.trainer.site
    plan: dict[str, Any] = {
        "source": "job",
        "controller_site": trainer,
        "trainer": {"site": trainer, "ranks": 1, "parallel": {"tp": 1, "pp": 1, "dp": 1}},
        "rollout": [{"site": r, "units": 1, "tp": 1} for r in rollout],
    }
    monkeypatch.setattr(jobprep, "resolve_inputs", lambda spec, _job: spec)
    monkeypatch.setattr(jobprep, "copy_inputs", lambda *_a, **_k: None)
    jobdir = JobDir(tmp_path / "run")
    jobdir.path.mkdir()
    jobprep.prepare(jobdir, job.spec, plan, source=str(job.path), job=job)
    return jobdir


def test_the_job_dir_records_the_links_the_planned_route_crosses_and_the_tree_takes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rollout on m and b, links a–m, m–b and a–x (dc-x: no site of the job): plan.json records a–m and m–b and
    their datacenters, check passes the job, the planner prices b's copy over a → m → b (10 Gb/s, 1 + 1 ms) and the
    broadcast tree over the recorded pairs sends it b's way through m's unit."""
    job = _job(tmp_path, LINKS, ["m", "b"])
    assert link_problems(job) == []
    sites, units = weight_sites(job, ["m", "b"])
    assert weight_route(job.inventory, "a", "b", job_sites=sites, unit_sites=units) == (10e9 / 8, 0.002)
    recorded = _prepare(tmp_path, job, ["m", "b"], monkeypatch).read_plan()
    assert (recorded["links"], recorded["dc_links"]) == ([["a", "m"], ["b", "m"]], [["dc-a", "dc-m"], ["dc-b", "dc-m"]])
    dc_links = Placement(recorded, read_sites(tmp_path / "run"), {}, job.spec).dc_links
    assert dc_links == [["dc-a", "dc-m"], ["dc-b", "dc-m"]]
    tree = plan_broadcast(
        [Endpoint("trainer-0", "dc-a")],
        [Endpoint("rollout-1", "dc-b"), Endpoint("rollout-0", "dc-m")],
        dc_links={frozenset(p) for p in dc_links},
    )
    assert tree.parent == {"rollout-0": "trainer-0", "rollout-1": "rollout-0"}


def test_a_link_declared_from_a_site_the_job_does_not_use_joins_its_datacenters_in_check_plan_and_the_job_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trainer on t (datacenter A), rollout on r (B), the one link a2–r, a2 another site of A the job does not use:
    check passes, the route is priced over that link, plan.json records it, its figures and the pair A–B, and the
    weight plane's tree sends the copy A → B over it. Versus (2026-12-06) check and plan refusing the job ('a link
    from a site the job does not use is not one') and the job dir recording no link."""
    job = _job(tmp_path, [["a2", "r"]], ["r"], {"t": "A", "a2": "A", "r": "B"})
    assert link_problems(job) == []
    sites, units = weight_sites(job, ["r"])
    assert weight_route(job.inventory, "t", "r", job_sites=sites, unit_sites=units) == (10e9 / 8, 0.001)
    recorded = _prepare(tmp_path, job, ["r"], monkeypatch).read_plan()
    assert (recorded["links"], recorded["dc_links"]) == ([["a2", "r"]], [["A", "B"]])
    # and its figures, a2's datacenter with them (sites.json has t and r alone): a resume's predictions read them
    assert recorded["link_figures"] == [
        {"between": ["a2", "r"], "datacenters": ["A", "B"], "bandwidth_gbps": 10.0, "latency_ms": 1.0}
    ]
    assert set(read_sites(tmp_path / "run")) == {"t", "r"}  # sites.json: still the job's sites alone
    dc_links = Placement(recorded, read_sites(tmp_path / "run"), {}, job.spec).dc_links
    assert dc_links == [["A", "B"]]
    tree = plan_broadcast(
        [Endpoint("trainer-0", "A")], [Endpoint("rollout-0", "B")], dc_links={frozenset(p) for p in dc_links}
    )
    assert tree.parent == {"rollout-0": "trainer-0"}


def test_a_job_dir_written_before_datacenter_pairs_were_recorded_reads_its_site_pairs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """plan.json without `dc_links` (a launch before it): the weight plane's pairs are its `links`' sites'
    datacenters (sites.json's), as then; with neither, every pair counts as linked (None)."""
    job = _job(tmp_path, LINKS, ["m", "b"])
    recorded = _prepare(tmp_path, job, ["m", "b"], monkeypatch).read_plan()
    old = {k: v for k, v in recorded.items() if k != "dc_links"}
    specs = read_sites(tmp_path / "run")
    assert Placement(old, specs, {}, job.spec).dc_links == [["dc-a", "dc-m"], ["dc-b", "dc-m"]]
    bare = {k: v for k, v in old.items() if k != "links"}
    assert Placement(bare, specs, {}, job.spec).dc_links is None
