"""Preparing a fresh launch's job dir (`prepare`: the inputs, then the job's record: job.json, plan.json,
sites.json), and the `rlctl stop` that ends it while it prepares (`StopCheck`, `launch_again`)."""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.config.inventory import Inventory
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
    jobdir.write_json(jobdir.plan_json, {**plan, **recorded_links(job.inventory, used)})
    write_sites(jobdir.path, {n: s for n, s in job.inventory.sites.items() if n in used})
    jobdir.write_job(spec, source=source, mapping=job.mapping if Path(source) == job.path else None)


def recorded_links(inventory: Inventory, used: set[str]) -> dict[str, Any]:
    """What plan.json records of the inventory's links for a job on sites `used` (`prepare`):

    - `links`: the links between the job's datacenters, from whichever of their sites, used or not (a link is between
      datacenters: `Inventory.links_among`), the ones the planner and `rlctl check` price the weights' route over;
    - `dc_links`: the pairs of datacenters they join (`Inventory.dc_links_among`), which the weight plane routes each
      version's inter-DC copy on (`agents.placement.Placement.dc_links`; a job dir written before it has `links`);
    - `link_figures`: one entry per entry of `links`, its sites' datacenters, bandwidth and latency as this launch
      priced them (those of `dc_links` follow: `dc_links_among` of these), which a resume at another trainer split
      makes its predictions over (`jobchanges.launched_inventory`), versus the inventory files as they are by then,
      edited or gone since (a job dir written before them has none: `JobDir.read_plan`)."""
    counted = inventory.links_among(used)
    links = [sorted(link.between) for link in counted]
    figures = [
        {
            "between": pair,
            "datacenters": [inventory.sites[s].datacenter for s in pair],
            "bandwidth_gbps": link.bandwidth_gbps,
            "latency_ms": link.latency_ms,
        }
        for pair, link in zip(links, counted, strict=True)
    ]
    dc_links = sorted(sorted(pair) for pair in inventory.dc_links_among(used))
    return {"links": links, "dc_links": dc_links, "link_figures": figures}


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
