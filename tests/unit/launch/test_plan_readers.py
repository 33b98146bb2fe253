"""plan.json's two readers say one line of a damaged field: `JobDir.read_plan` (a launch --resume, attach: its whole
shape) and `read_plan_or_none` + `plan_site` (pull, the record's fetch, stop: the field each reads), its checks per
field."""

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
