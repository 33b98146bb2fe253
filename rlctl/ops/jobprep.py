"""Preparing a fresh launch's job dir (`prepare`: the inputs, then the job's record: job.json, plan.json,
sites.json), and the `rlctl stop` that ends it while it prepares (`StopCheck`, `launch_again`)."""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.config.job import Job, JobFile
from rlctl.errors import Stopped
from rlctl.launch.backends import write_sites
from rlctl.launch.jobdir import JobDir
from rlctl.launch.layout import plan_sites
from rlctl.ops.inputs import copy_inputs, resolve_inputs
from rlctl.ops.jobdb import LIVE, JobDB
from rlctl.ops.runstate import stop_requested

log = logging.getLogger(__name__)


def prepare(
    jobdir: JobDir,
    spec: JobFile,
    plan: dict[str, Any],
    *,
    source: str,
    job: Job,
    check: Callable[[], None] | None = None,
) -> None:
    """Write what the agents read, and what the job starts from (rlctl.ops.inputs: the starting policy —
    the SFT warm-up, cached across runs, or the user's checkpoint — a dataset's tokenized prompts, its
    reward file). `check` (`StopCheck`: a `rlctl stop` while the launch prepares) ends it by raising, in the warm-up
    and the tokenizing too; the job's record (job.json, plan.json, sites.json) is written once the inputs are built,
    so that a launch stopped (or failed) here leaves no job a `launch --resume` would take for prepared, and a new
    launch into the directory is not refused as one that holds a job."""
    spec = resolve_inputs(spec, job)
    jobdir.secret()
    copy_inputs(jobdir, spec, job, check=check)
    if check is not None:
        check()
    used = set(plan_sites(plan))
    # the inventory's links between the job's datacenters (from whichever of their sites, used or not: a link is
    # between datacenters) and the pairs of datacenters they join, the ones the planner and `rlctl check` price the
    # route over (`Inventory.dc_links_among`): the weight plane routes each version's inter-DC copy on `dc_links`
    # (`agents.placement.Placement.dc_links`; a job dir written before it has site pairs alone, `links`)
    links = [sorted(link.between) for link in job.inventory.links_among(used)]
    dc_links = sorted(sorted(pair) for pair in job.inventory.dc_links_among(used))
    jobdir.write_json(jobdir.plan_json, {**plan, "links": links, "dc_links": dc_links})
    write_sites(jobdir.path, {n: s for n, s in job.inventory.sites.items() if n in used})
    jobdir.write_job(spec, source=source, mapping=job.mapping if Path(source) == job.path else None)


class StopCheck:
    """What `prepare` calls between its steps and in its long loops (the SFT warm-up, a dataset's tokenizing): a
    `rlctl stop` asked for the job at or after `since` (time.time()) ends the launch there with Stopped, the index
    row `stopped`. The job's events are read at most every `every_s`."""

    def __init__(
        self, jobdir: JobDir, *, since: float, db: JobDB | None, every_s: float = 0.5, source: str | None = None
    ) -> None:
        self.jobdir, self.since, self.db, self.every_s = jobdir, since, db, every_s
        self.source = source  # the job file the launch read: what launches it again
        self._next = 0.0

    def __call__(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every_s
        if not stop_requested(self.jobdir, since=self.since):
            return
        name = self.jobdir.id
        log.warning("%s: stopped by the operator while its launch prepared it (nothing started)", name)
        self.jobdir.event("prepare_stopped")
        if self.db is not None:
            self.db.update(name, state="stopped", only_from=LIVE)
        raise Stopped(
            f"job {name} was stopped (`rlctl stop`) while its launch prepared it (SFT warm-up, data); nothing started",
            hint=f"launch it again with `{launch_again(self.source)}`",
        )


def launch_again(source: str | None) -> str:
    """The command that launches a job anew from its job file `source` (a job stopped before it was prepared has
    no job.json: `launch --resume` refuses it)."""
    return f"rlctl launch {shlex.quote(source)}" if source else "rlctl launch JOB.yaml"
