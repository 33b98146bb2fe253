"""How an agent process is described to a launch backend, and the controller's spawner for scaling.

    agent_spec(planned agent) ─▶ AgentSpec(argv = python -m rlctl.agents ROLE --job-dir SITE_DIR
                                                  [--controller ADDR] …,
                                           env: site, listen host, RLCTL_PARALLEL, CUDA_VISIBLE_DEVICES, threads)
    (CUDA_VISIBLE_DEVICES: its slice's devices on a GPU site; "" for the controller and a `gpu: CPU` site's agents)
    Spawner.add_rollout(site, n) ─▶ a free GPU slice (claims: agents.jsonl + planned + in flight)
                                 ─▶ the site's staged copy (staged.json; stage it first if absent)
                                 ─▶ backend(site).start(spec) ─▶ agents.jsonl ─▶ the unit says hello

SITE_DIR is the job's directory on the agent's own site (rlctl.launch.sitefs): sites share no
filesystem, so an agent never reads the operator's path.
    (a drained unit is told to stop by the controller; `rlctl stop` verifies every recorded agent gone)

The launcher (`rlctl launch`) and the controller (scale requests, automatic rebalancing) both start
agents this way, so `rlctl stop` finds every one of them in the job's agents.jsonl, and a new unit's
GPU slice never overlaps one an agent of the job still holds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlctl.buildid import code_digest
from rlctl.config.inventory import Site
from rlctl.config.job import JobFile
from rlctl.devices import ENV_DEVICE, ENV_TASK_GPUS, kind_for
from rlctl.errors import LaunchError
from rlctl.launch.agentenv import (
    BASE_ENV,
    ENV_CODE,
    ENV_CPUS,
    ENV_LISTEN_HOST,
    ENV_PARALLEL,
    ENV_SITE,
    ENV_VISIBLE,
    thread_env,
)
from rlctl.launch.agentrecords import run_names
from rlctl.launch.backends import (
    AGENTS_FILE,
    Backends,
    agents_from_lines,
    kind_of,
    python_for,
    record_agent,
    recorded_agents,
    stop_agents,
)
from rlctl.launch.base import AgentHandle, AgentSpec, GpuSlice
from rlctl.launch.gpus import GpuPool, uses_slices
from rlctl.launch.jobdir import JobDir
from rlctl.launch.layout import PlannedAgent, layout, order_tp, rollout_agent, rollout_tp
from rlctl.launch.recordfiles import record_text
from rlctl.launch.stage import ensure_staged, root_for
from rlctl.transport.ucx import ENV_RDMA

log = logging.getLogger(__name__)


def threads_of(a: PlannedAgent) -> int:
    """The agent's CPU threads (OMP_NUM_THREADS): its cores, but 1 for the controller, whose other cores are its
    reward workers' (`layout.controller_cores`)."""
    return 1 if a.role == "controller" else a.resources.cpus_per_task


def agent_spec(
    jobdir: JobDir, a: PlannedAgent, site: Site, *, env: dict[str, str] | None = None, controller: str | None = None
) -> AgentSpec:
    """The exact process of one planned agent; `jobdir` is the job's directory *on the agent's site*
    (its staged copy), `controller` the controller's address (trainer and rollout agents); `env` adds
    to (and wins over) what the layout says."""
    argv = [python_for(site), "-m", "rlctl.agents", a.role, "--job-dir", str(jobdir.path)]
    if not (a.role == "trainer" and kind_of(site).ranks_are_tasks):  # SLURM tasks take $SLURM_PROCID
        argv += ["--replica", str(a.replica)]
    if controller is not None and a.role != "controller":
        argv += ["--controller", controller]
    agent_env = {ENV_SITE: a.site, ENV_PARALLEL: a.parallel.to_json(), **thread_env(threads_of(a))}
    agent_env[ENV_CODE] = code_digest()  # an agent of other rlctl code exits at start (agentenv.code_mismatch)
    # where it computes (rlctl.devices): the GPUs its site declares; the controller computes nothing
    device = agent_env[ENV_DEVICE] = "cpu" if a.role == "controller" else kind_for(site.spec.name)
    if site.network.listen_host:
        agent_env[ENV_LISTEN_HOST] = site.network.listen_host
    agent_env[ENV_RDMA] = "1" if site.network.rdma else "0"  # read by the ucx transport (its UCX_TLS)
    if a.role == "trainer" and kind_of(site).ranks_are_tasks and a.resources.gpus_per_task:
        # which of the GPUs a task sees are its own, where the scheduler shows it the node's (rlctl.devices)
        agent_env[ENV_TASK_GPUS] = str(a.resources.gpus_per_task)
    if device == "cpu":  # no GPU at all: on a GPU host it would see (and torch initialise CUDA on) the host's GPUs
        agent_env[ENV_VISIBLE] = ""
        # its slots' cores: what vLLM's CPU workers bind to at tp > 1 (else every unit of a host bound the same ones)
        cores = None if a.gpu_slice is None else site.cores_of(a.gpu_slice.host, a.gpu_slice.gpus)
        if cores is not None and a.role != "controller":
            agent_env[ENV_CPUS] = ",".join(map(str, cores))
    elif a.gpu_slice is not None:  # the CUDA devices behind its GPU slots (the inventory may map slots to devices)
        agent_env[ENV_VISIBLE] = ",".join(map(str, site.devices_of(a.gpu_slice.host, a.gpu_slice.gpus)))
    return AgentSpec(
        a.role,
        a.replica,
        a.site,
        argv,
        {**BASE_ENV, **agent_env, **(env or {})},
        jobdir.log(a.role, a.replica),
        resources=a.resources,
        gpu_slice=a.gpu_slice,
    )


class Spawner:
    """Starts rollout units of a running job on their sites (used by the controller)."""

    def __init__(self, jobdir: JobDir, sites: dict[str, Site], *, job: str) -> None:
        self.jobdir, self.sites, self.job = jobdir, sites, job
        self.backends = Backends(sites, job=job, job_dir=jobdir.path)
        self._lock = threading.Lock()
        self._in_flight: dict[str, GpuSlice] = {}  # units being started: their slices are taken

    def first_free_replica(self) -> int:
        replicas = [h.spec.replica for h in recorded_agents(self.jobdir.path) if h.spec.role == "rollout"]
        return 1 + max(replicas, default=-1)

    def add_rollout(self, site: str, replica: int) -> str:
        """Start rollout unit `replica` on `site`; returns its agent name. LaunchError if it cannot."""
        if site not in self.sites:
            raise LaunchError(f"site {site!r} is not one of this job's sites ({', '.join(sorted(self.sites))})")
        with self._lock:
            planned = self._plan_unit(site, replica)
            if planned.gpu_slice is not None:
                self._in_flight[planned.name] = planned.gpu_slice
        # the unit reads its own site's copy of the job (staged now if this site has none yet)
        roots = ensure_staged(self.jobdir.path, site, self.sites[site], job_id=self.job)
        host = planned.gpu_slice.host if planned.gpu_slice is not None else None
        site_dir = JobDir(Path(root_for(roots, host)))
        spec = agent_spec(site_dir, planned, self.sites[site], controller=self._controller_address())
        try:
            handle = self.backends.for_site(site).start(spec)
            with self._lock:
                record_agent(self.jobdir.path, handle)
        finally:
            with self._lock:
                self._in_flight.pop(planned.name, None)
        gpus = spec.gpu_slice.visible_devices if spec.gpu_slice else None
        self.jobdir.event(
            "agent_started", agent=spec.name, site=site, backend=handle.backend, ident=handle.ident, gpus=gpus
        )
        return spec.name

    def _controller_address(self) -> str | None:
        """The address the controller (this process, on its site) wrote; None before it listens."""
        p = self.jobdir.controller_json
        return str(self.jobdir.read_json(p)["address"]) if p.exists() else None

    def _plan_unit(self, site: str, replica: int) -> PlannedAgent:
        """The new unit with a free slice: every slice held by a recorded or planned agent is claimed;
        when that leaves too few, recorded agents are polled and the slices of those that exited freed."""
        job = self.jobdir.read_job()
        # read at each unit started, from this site's copy, which may have been edited since the launch checked it;
        # the launch's shape (not Placement's `as_placed`): `layout` below reads its trainer and controller_site
        plan = self.jobdir.read_plan() if self.jobdir.plan_json.exists() else {}
        tp = rollout_tp(plan, site) if plan else job.rollout.tensor_parallel or 1
        recorded = [h for h in recorded_agents(self.jobdir.path) if h.spec.site == site]

        def unit(pool: GpuPool | None, exited: set[str]) -> PlannedAgent:
            units = 1 + sum(1 for h in recorded if h.spec.role == "rollout" and h.spec.name not in exited)
            return rollout_agent(site, self.sites[site], job, replica=replica, tp=tp, units_on_site=units, pool=pool)

        if not uses_slices(self.sites[site]):
            return unit(None, set())
        try:
            return unit(self._pool(site, plan, job, recorded, exited=set()), set())
        except LaunchError:
            exited = {h.spec.name for h in recorded if h.spec.gpu_slice is not None and self._exited(h)}
            log.info("site %s: slices of exited agents freed for rollout-%d: %s", site, replica, sorted(exited))
            return unit(self._pool(site, plan, job, recorded, exited=exited), exited)

    def _pool(
        self, site: str, plan: dict[str, Any], job: JobFile, recorded: list[AgentHandle], *, exited: set[str]
    ) -> GpuPool:
        t_site = plan["trainer"]["site"] if plan else job.placement.trainer.site
        pool = GpuPool(site, self.sites[site], shares_trainer=site == t_site, trainer_tp=order_tp(plan, job))
        names = {h.spec.name for h in recorded}
        for h in recorded:
            if h.spec.gpu_slice is not None and h.spec.name not in exited:
                pool.claim(h.spec.gpu_slice)
        if plan:  # agents the launcher has not started (recorded) yet still own their planned slices
            for a in layout(plan, self.sites, job):
                if a.site == site and a.gpu_slice is not None and a.name not in names:
                    pool.claim(a.gpu_slice)
        for s in self._in_flight.values():
            pool.claim(s)
        return pool

    def exited(self, names: Iterable[str]) -> list[str]:
        """Of `names`, the agents of this run (recorded since its controller's record: an earlier run's agent of the
        same name is not one) that have exited, as their sites say; one not recorded yet, or whose site cannot tell,
        is not. A record with no controller's is a controller site's other than the operator's: its launcher emptied
        it for this run and mirrors the other agents into it, so each of its records is this run's."""
        wanted = set(names)
        return [h.spec.name for h in self._this_run() if h.spec.name in wanted and self._exited(h)]

    def queued(self, names: Iterable[str]) -> dict[str, bool | None]:
        """Of `names`, whether each agent of this run is still waiting in its site's scheduler's queue (SLURM:
        pending): False once started (and for one this run has not recorded), None where that cannot be learnt (squeue
        timed out, agents.jsonl unreadable). Never raises: the caller bounds how long an unknown counts as queued
        (`rlctl.agents.healing`), versus a raise that lost the rest of its caller's answer."""
        wanted = list(dict.fromkeys(names))
        try:
            handles = {h.spec.name: h for h in self._this_run() if h.spec.name in wanted}
        except Exception as e:  # noqa: BLE001 - a declared fault-tolerance point: every answer unknown
            log.warning("controller: cannot read the agents recorded to ask whether %s queue: %s", ", ".join(wanted), e)
            return dict.fromkeys(wanted, None)
        return {n: self._queued(handles[n]) if n in handles else False for n in wanted}

    def stop(self, name: str, *, grace_s: float) -> None:
        """Stop agent `name` of this run on its site (a unit that never joined); nothing when it is not recorded (its
        start never returned). LaunchError when its site could not stop it."""
        handles = [h for h in self._this_run() if h.spec.name == name]
        problems = stop_agents(self.backends, handles, grace_s=grace_s)
        if problems:
            raise LaunchError("; ".join(problems))

    def _this_run(self) -> list[AgentHandle]:
        """The agents recorded by this run (see `exited`)."""
        p = self.jobdir.path / AGENTS_FILE
        text = record_text(p) if p.exists() else ""
        run = run_names(text)
        recorded = agents_from_lines(text, source=p, skipped=[])
        return [h for h in recorded if run is None or h.spec.name in run]

    def _exited(self, h: AgentHandle) -> bool:
        try:
            return self.backends.for_site(h.spec.site).poll(h) is not None
        except LaunchError as e:  # cannot tell: the slice stays taken
            log.warning("site %s: cannot poll %s: %s", h.spec.site, h.spec.name, e)
            return False

    def _queued(self, h: AgentHandle) -> bool | None:
        try:
            return self.backends.for_site(h.spec.site).queued(h)
        except Exception as e:  # noqa: BLE001 - cannot tell (`queued`): unknown, whatever the backend raised
            log.warning("site %s: cannot tell whether %s is queued: %s", h.spec.site, h.spec.name, e)
            return None

    def close(self) -> None:
        self.backends.close()
