"""How an agent process is described to a launch backend, and the controller's spawner for scaling.

    agent_spec(role, replica, site) ─▶ AgentSpec(argv = python -m rlctl.agents ROLE --job-dir D …)
    Spawner.add_rollout(site)       ─▶ backend(site).start(spec) ─▶ agents.jsonl ─▶ the unit says hello
    Spawner.retire(name)            ─▶ backend(site).stop([handle])   (after the controller drained it)

The launcher (`rlctl launch`) and the controller (scale requests, automatic rebalancing) both start
agents this way, so `rlctl stop` finds every one of them in the job's agents.jsonl.
"""

from __future__ import annotations

import logging
import sys
import threading

from rlctl.config.inventory import Site, SshScheduler
from rlctl.errors import LaunchError
from rlctl.launch.backends import Backends, record_agent, recorded_agents
from rlctl.launch.base import AgentHandle, AgentSpec
from rlctl.launch.jobdir import JobDir

log = logging.getLogger(__name__)

BASE_ENV = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def python_for(site: Site) -> str:
    """The interpreter on the site's hosts: the SSH site's configured one; else this one (shared FS)."""
    return site.scheduler.python if isinstance(site.scheduler, SshScheduler) else sys.executable


def agent_spec(
    jobdir: JobDir, role: str, replica: int, site_name: str, site: Site, *, env: dict[str, str] | None = None
) -> AgentSpec:
    argv = [python_for(site), "-m", "rlctl.agents", role, "--job-dir", str(jobdir.path)]
    if not (role == "trainer" and site.scheduler.kind == "slurm"):  # SLURM tasks take $SLURM_PROCID
        argv += ["--replica", str(replica)]
    return AgentSpec(role, replica, site_name, argv, {**BASE_ENV, **(env or {})}, jobdir.log(role, replica))


def gpus_used(jobdir: JobDir, sites: dict[str, Site], *, tp: int, live: set[str]) -> dict[str, int]:
    """GPUs (slots) this job holds per site: trainer ranks + tp per live rollout unit."""
    plan = jobdir.read_json(jobdir.plan_json)
    used = dict.fromkeys(sites, 0)
    used[plan["trainer"]["site"]] = used.get(plan["trainer"]["site"], 0) + int(plan["trainer"]["ranks"])
    for h in recorded_agents(jobdir.path):
        if h.spec.role == "rollout" and h.spec.name in live:
            used[h.spec.site] = used.get(h.spec.site, 0) + tp
    return used


class Spawner:
    """Starts and retires rollout units of a running job on their sites (used by the controller)."""

    def __init__(self, jobdir: JobDir, sites: dict[str, Site], *, job: str) -> None:
        self.jobdir, self.sites = jobdir, sites
        self.backends = Backends(sites, job=job, job_dir=jobdir.path)
        self._lock = threading.Lock()

    def first_free_replica(self) -> int:
        replicas = [h.spec.replica for h in recorded_agents(self.jobdir.path) if h.spec.role == "rollout"]
        return 1 + max(replicas, default=-1)

    def add_rollout(self, site: str, replica: int) -> str:
        """Start rollout unit `replica` on `site`; returns its agent name. LaunchError if it cannot."""
        if site not in self.sites:
            raise LaunchError(f"site {site!r} is not one of this job's sites ({', '.join(sorted(self.sites))})")
        spec = agent_spec(self.jobdir, "rollout", replica, site, self.sites[site])
        handle = self.backends.for_site(site).start(spec)
        with self._lock:
            record_agent(self.jobdir.path, handle)
        self.jobdir.event("agent_started", agent=spec.name, site=site, backend=handle.backend, ident=handle.ident)
        return spec.name

    def handle(self, name: str) -> AgentHandle | None:
        return next((h for h in recorded_agents(self.jobdir.path) if h.spec.name == name), None)

    def retire(self, name: str, *, grace_s: float = 10.0) -> None:
        """Make sure the (drained, stopped) agent `name` is gone on its site."""
        h = self.handle(name)
        if h is None:
            return
        self.backends.for_site(h.spec.site).stop([h], grace_s=grace_s)

    def close(self) -> None:
        self.backends.close()
