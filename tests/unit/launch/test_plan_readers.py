"""plan.json's two readers say one line of a damaged field: `JobDir.read_plan` (a launch --resume, attach, the
Spawner: its whole shape; `as_placed`, the controller's Placement: what it places by) and `read_plan_or_none` +
`plan_site` (pull, the record's fetch, stop: the field each reads), its checks per field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlctl.config.inventory import Site
from rlctl.errors import LaunchError
from rlctl.launch import record, stage
from rlctl.launch.backends import write_sites
from rlctl.launch.jobdir import JobDir

GOOD = {
    "trainer": {"site": "local", "ranks": 1},
    "rollout": [{"site": "local", "units": 1}],
    "controller_site": "local",
}


FIGURES = {"between": ["far", "local"], "datacenters": ["b", "a"], "bandwidth_gbps": 10.0, "latency_ms": 1.0}


def damaged(**fields: Any) -> dict[str, Any]:
    return {**GOOD, **fields}


@pytest.mark.parametrize(
    ("plan", "keys", "says"),
    [
        ([1, 2], ("controller_site",), "(top level): a JSON list, where the plan is an object"),
        (damaged(trainer="local"), ("trainer", "site"), "trainer: no object with a site name"),
        (damaged(trainer={"ranks": 1}), ("trainer", "site"), "trainer.site: None is not a site name"),
        (damaged(trainer={"site": 7, "ranks": 1}), ("trainer", "site"), "trainer.site: 7 is not a site name"),
        (damaged(controller_site=["local"]), ("controller_site",), "controller_site: ['local'] is not a site name"),
    ],
)
def test_a_damaged_field_is_the_same_line_through_both_readers(
    tmp_path: Path, plan: Any, keys: tuple[str, ...], says: str
) -> None:
    """The operator's reader said 'plan.json: not a JSON object' / 'trainer.site is not a site name' (no value, no
    hint) where a resume said '(top level): a JSON list, …' / 'trainer: no object with a site name'."""
    jd = JobDir(tmp_path)
    jd.write_json(jd.plan_json, plan)
    with pytest.raises(LaunchError) as whole:
        jd.read_plan()
    with pytest.raises(LaunchError) as per_field:
        fields = jd.read_plan_or_none()
        assert fields is not None
        jd.plan_site(fields, *keys)
    assert str(whole.value) == str(per_field.value) == f"{jd.plan_json}: {says}"
    assert whole.value.hint == per_field.value.hint == "was it edited? put back its launch's"


def test_the_record_s_fetch_says_what_a_resume_says_of_a_damaged_controller_site(tmp_path: Path) -> None:
    jd = JobDir(tmp_path)
    site = Site.model_validate(
        {"datacenter": "a", "gpu": "CPU", "nodes": [{"host": "localhost", "gpus": 2}], "scheduler": {"kind": "local"}}
    )
    write_sites(tmp_path, {"local": site})
    stage.write_staged(tmp_path, {"local": {"roots": {"localhost": str(tmp_path)}, "files": []}})
    jd.write_json(jd.plan_json, damaged(controller_site=3))
    with pytest.raises(LaunchError) as fetch:
        record.record_view(tmp_path)
    with pytest.raises(LaunchError) as resume:
        jd.read_plan()
    assert str(fetch.value) == str(resume.value) == f"{jd.plan_json}: controller_site: 3 is not a site name"


def test_a_plan_as_a_launch_wrote_it_reads_the_same_through_both(tmp_path: Path) -> None:
    jd = JobDir(tmp_path)
    assert jd.read_plan_or_none() is None  # before `prepare` wrote it
    plan = {**GOOD, "trainer": {**GOOD["trainer"], "parallel": {"tp": 1, "pp": 1, "dp": 1}}, "links": []}
    jd.plan_json.write_text(json.dumps(plan, indent=2) + "\n")
    assert jd.read_plan() == jd.read_plan_or_none() == plan
    assert (jd.plan_site(plan, "trainer", "site"), jd.plan_site(plan, "controller_site")) == ("local", "local")


IN_PROCESS = {"rollout": [{"site": "local", "units": 2}]}  # what the in-process mode's controller starts on


@pytest.mark.parametrize(
    ("plan", "says"),
    [
        (IN_PROCESS, "trainer: no object with a site name"),
        (damaged(trainer={"site": "local"}), "trainer.ranks: None is not a count of 1 or more"),
        ({k: v for k, v in GOOD.items() if k != "controller_site"}, "controller_site: None is not a site name"),
    ],
)
def test_the_controller_places_by_less_of_the_plan_than_a_launch_reads(
    tmp_path: Path, plan: dict[str, Any], says: str
) -> None:
    """One reader, two rules: `as_placed` (the controller's Placement) takes a plan without a trainer, a trainer
    without ranks (1) and no controller_site; the launch's (a resume, attach, the Spawner) refuses each, naming it."""
    jd = JobDir(tmp_path)
    assert jd.read_plan(as_placed=True) == {}  # before `prepare` wrote it
    jd.write_json(jd.plan_json, plan)
    assert jd.read_plan(as_placed=True) == plan
    with pytest.raises(LaunchError) as launch:
        jd.read_plan()
    assert str(launch.value) == f"{jd.plan_json}: {says}"


def test_a_damaged_rollout_or_trainer_is_the_same_line_through_both_rules(tmp_path: Path) -> None:
    jd = JobDir(tmp_path)
    for plan, says in [
        (damaged(rollout=[{"site": "local", "units": -1}]), "rollout[0].units: -1 is not a count of 0 or more"),
        (damaged(trainer={"site": "local", "ranks": 0}), "trainer.ranks: 0 is not a count of 1 or more"),
        (
            damaged(trainer={"site": "local", "ranks": 1, "parallel": {"tp": 0}}),
            "trainer.parallel.tp: 0 is not a count of 1 or more",
        ),
    ]:
        jd.write_json(jd.plan_json, plan)
        with pytest.raises(LaunchError) as placed:
            jd.read_plan(as_placed=True)
        with pytest.raises(LaunchError) as launch:
            jd.read_plan()
        assert str(placed.value) == str(launch.value) == f"{jd.plan_json}: {says}"
    jd.write_json(jd.plan_json, GOOD)
    assert jd.read_plan(as_placed=True) == jd.read_plan() == GOOD


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"dc_links": [5]}, "dc_links[0]: 5 is not a pair of datacenter names"),
        ({"dc_links": ["ab"]}, "dc_links[0]: 'ab' is not a pair of datacenter names"),
        ({"dc_links": [["a", "b"], ["a", 1]]}, "dc_links[1]: ['a', 1] is not a pair of datacenter names"),
        ({"dc_links": {"a": "b"}}, "dc_links: no list of datacenter pairs"),
        ({"links": [["local"]]}, "links[0]: ['local'] is not a pair of site names"),
        ({"links": "local-far"}, "links: no list of site pairs"),
        *(
            ({"links": [["far", "local"]], "link_figures": figures}, says)
            for figures, says in [
                ({"far": 10}, "link_figures: no list of one entry per entry of links (its figures)"),
                ([], "link_figures: no list of one entry per entry of links (its figures)"),
                ([5], "link_figures[0]: no object of links[0]'s figures, whose between is ['far', 'local']"),
                (
                    [{**FIGURES, "between": ["local", "far"]}],
                    "link_figures[0]: no object of links[0]'s figures, whose between is ['far', 'local']",
                ),
                (
                    [{**FIGURES, "datacenters": "ab"}],
                    "link_figures[0].datacenters: 'ab' is not a pair of datacenter names",
                ),
                ([{**FIGURES, "bandwidth_gbps": 0}], "link_figures[0].bandwidth_gbps: Input should be greater than 0"),
                (
                    [{**FIGURES, "bandwidth_gbps": True}],
                    "link_figures[0].bandwidth_gbps: Input should be a valid number, not a boolean (got True)",
                ),
                (
                    [{k: v for k, v in FIGURES.items() if k != "latency_ms"}],
                    "link_figures[0].latency_ms: required field is missing",
                ),
            ]
        ),
        (
            {"link_figures": [FIGURES]},  # without `links`
            "link_figures: no list of one entry per entry of links (its figures)",
        ),
    ],
)
def test_a_damaged_link_is_one_line_through_both_rules_not_a_crash_or_a_pair_read_from_a_string(
    tmp_path: Path, fields: dict[str, Any], says: str
) -> None:
    """plan.json's `links` and `dc_links` (`ops.jobprep`), which the controller's Placement routes the weights by
    (`Placement.dc_links`): an entry edited into another shape stopped it on a TypeError or ValueError, and a string
    of two characters ('ab') was read as the datacenters a and b; and `link_figures`, their figures, which a resume
    at another trainer split prices the route over (`jobchanges.launched_inventory`: read unchecked, a KeyError or
    a pydantic traceback). Refused as read, naming the field; as a launch wrote them they read."""
    from rlctl.agents.placement import Placement

    jd = JobDir(tmp_path)
    jd.write_json(jd.plan_json, damaged(**fields))
    with pytest.raises(LaunchError) as placed:
        jd.read_plan(as_placed=True)
    with pytest.raises(LaunchError) as launch:
        jd.read_plan()
    assert str(placed.value) == str(launch.value) == f"{jd.plan_json}: {says}"
    assert launch.value.hint == "was it edited? put back its launch's"
    good = damaged(links=[["far", "local"]], dc_links=[["a", "b"]], link_figures=[FIGURES])
    jd.write_json(jd.plan_json, good)
    assert jd.read_plan(as_placed=True) == jd.read_plan() == good
    assert Placement(jd.read_plan(as_placed=True), {}, {}, None).dc_links == [["a", "b"]]  # type: ignore[arg-type]
