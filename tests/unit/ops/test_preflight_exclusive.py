"""`sites.<site>.scheduler.exclusive`: the job's SLURM jobs on a site that gives each its nodes whole, placed on the
site's nodes as the inventory gives them (`rlctl.ops.preflight.placement.exclusive_room_problems`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rlctl.config import load_job
from rlctl.launch.layout import layout
from rlctl.ops import counts
from rlctl.ops.noderoom import Share, fit
from rlctl.ops.preflight.base import Problem
from rlctl.ops.preflight.placement import exclusive_room_problems, placement_problems
from tests.unit.ops.test_preflight_controller_room import h800_job


def room(tmp_path: Path, *, exclusive: bool, **job: Any) -> list[Problem]:
    """The check's refusals for a job on 4 nodes of 8 H800 (`h800_job`), the site's scheduler `exclusive`."""
    h800_job(tmp_path, node={"gpus": 8}, hosts="h800-[001-004]", **job)
    inv = yaml.safe_load((tmp_path / "h800.yaml").read_text())
    inv["sites"]["h800"]["scheduler"]["exclusive"] = exclusive
    (tmp_path / "h800.yaml").write_text(yaml.safe_dump(inv))
    loaded = load_job(tmp_path / "job.yaml")
    said = [p for p in placement_problems(loaded, None) if p.field.startswith("sites.")]  # what check runs
    assert said == exclusive_room_problems(
        loaded, layout(counts.plan_counts(loaded, loaded.spec), loaded.inventory.sites, loaded.spec)
    )
    return said


def test_exclusive_jobs_that_need_more_nodes_than_the_site_has_are_refused(tmp_path: Path) -> None:
    """The trainer on 16 GPUs (2 nodes) and 6 rollout units of tp 2 (12 GPUs) fit the 4 nodes' 32 GPUs shared; each
    job on nodes of its own, the controller's too, they take 9: check passed, and the jobs past 4 waited for ever."""
    both = {"trainer_gpus": 16, "rollout_at": ("h800", 12)}
    assert room(tmp_path, exclusive=False, **both) == []
    (p,) = room(tmp_path, exclusive=True, **both)
    assert (p.field, p.file) == ("sites.h800.scheduler.exclusive", str(tmp_path / "h800.yaml"))
    assert p.message == (
        "true: each of the job's 8 SLURM jobs on site h800 takes its nodes whole, 9 node(s) in all (1 for the "
        "controller, 2 for the trainer, 6 for its 6 rollout units), and the site's 4 node(s) do not hold them at "
        "once: a job past them waits for ever for a node another holds until the job ends"
    )
    assert p.hint is not None and p.hint.startswith("set exclusive false")
    # the rollout units on the SSH site: the controller's job and the trainer's take 3 of the 4 nodes
    assert room(tmp_path, exclusive=True, trainer_gpus=16) == []


def test_whole_nodes_hold_one_job_each() -> None:
    shares = [Share(0, 1, 1, 0), Share(1, 1, 1, 0)]
    assert fit([(8, 8, 8)], shares) is True
    assert fit([(8, 8, 8)], shares, whole=True) is False
    assert fit([(8, 8, 8), (1, 1, 1)], shares, whole=True) is True
