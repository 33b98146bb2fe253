"""How an agent process is described to a launch backend, and the controller's spawner for scaling.

    agent_spec(role, replica, site) ─▶ AgentSpec(argv = python -m rlctl.agents ROLE --job-dir D …)
    Spawner.add_rollout(site, n)    ─▶ backend(site).start(spec) ─▶ agents.jsonl ─▶ the unit says hello
    (a drained unit is told to stop by the controller; `rlctl stop` verifies every recorded agent gone)

The launcher (`rlctl launch`) and the controller (scale requests, automatic rebalancing) both start
agents this way, so `rlctl stop` finds every one of them in the job's agents.jsonl.
"""

from __future__ import annotations

import logging
import sys
import threading

from rlctl.agents.listen import ENV_LISTEN_HOST, ENV_SITE
from rlctl.config.inventory import Site, SshScheduler
from rlctl.errors import LaunchError
from rlctl.launch.backends import Backends, record_agent, recorded_agents
from rlctl.launch.base import AgentSpec
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
    site_env = {ENV_SITE: site_name}
    if site.network.listen_host:
        site_env[ENV_LISTEN_HOST] = site.network.listen_host
    return AgentSpec(role, replica, site_name, argv, {**BASE_ENV, **site_env, **(env or {})}, jobdir.log(role, replica))


class Spawner:
    """Starts rollout units of a running job on their sites (used by the controller)."""

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

    def close(self) -> None:
        self.backends.close()
