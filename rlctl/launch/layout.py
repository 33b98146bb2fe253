"""Where every agent of a job runs and what it gets: host and GPU slice, SLURM request, threads, tp/pp/dp.

    plan (counts.py)        ─┐
    sites (inventory)        ├─▶ layout() ─▶ [PlannedAgent: role, replica, site, resources, gpu_slice, parallel]
    job (threads per role)  ─┘     controller first, then trainer ranks, then rollout units (start order)

Per site kind:
    local / ssh  every trainer rank a one-GPU slice, whole tp groups per host; every rollout unit a `tp`-GPU slice
                 on one host, hosts filled in the planner's order (`rlctl.launch.gpus.GpuPool`,
                 `rlctl.config.hostfill`); too few GPUs on the site is a LaunchError before anything starts
    slurm        one spec per role; `resources` says tasks × GPUs per task and SLURM places them
                 (the trainer is one SLURM job whose tasks are its ranks)

The controller uses no GPU. A unit added later by `scale` gets its slice from the same pool, with
every recorded agent's slice claimed first (`rlctl.launch.spawn.Spawner`).

Checkpoints: the trainer ranks of data-parallel replica 0 write their shards into the job dir they see and
rank 0 seals what it sees there (`rlctl.checkpoint.trainer`); on resume every rank reads its shard there. On an
SSH site whose hosts share no work root, those ranks must share rank 0's host (`unshared_trainer`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rlctl.config.inventory import Site
from rlctl.config.job import JobFile
from rlctl.errors import LaunchError
from rlctl.launch.agentenv import ParallelConfig, threads_for
from rlctl.launch.backends import kind_of
from rlctl.launch.base import GpuSlice, Resources
from rlctl.launch.gpus import GpuPool, uses_slices


@dataclass(frozen=True)
class PlannedAgent:
    role: str
    replica: int
    site: str
    resources: Resources
    parallel: ParallelConfig
    gpu_slice: GpuSlice | None = None

    @property
    def name(self) -> str:
        return f"{self.role}-{self.replica}"


def trainer_parallel(plan: dict[str, Any]) -> ParallelConfig:
    t = plan["trainer"]
    p = t.get("parallel") or {"tp": 1, "pp": 1, "dp": int(t["ranks"])}
    return ParallelConfig(
        "trainer",
        tp=int(p["tp"]),
        pp=int(p["pp"]),
        dp=int(p["dp"]),
        fsdp=p.get("fsdp") or None,
        reduce_per_step=p.get("reduce_per_step") or None,
    )


def checkpoint_writers(plan: dict[str, Any], job: JobFile) -> list[int]:
    """The trainer ranks that write a checkpoint's shards: data-parallel replica 0's tp × pp ranks under
    megatron (`ParallelConfig.first_replica_ranks`); every rank of a torch trainer sharded by FSDP (each holds
    its own part); else rank 0 alone under torch, whose every rank is a whole replica whatever the plan's split."""
    parallel = trainer_parallel(plan)
    if job.trainer.backend != "megatron" and not parallel.fsdp:
        return [0]
    return parallel.first_replica_ranks()


def unshared_trainer(
    name: str, site: Site, trainers: list[PlannedAgent], *, writers: list[int], resume: bool = False
) -> tuple[str, str] | None:
    """Why the trainer's ranks on SSH site `name` cannot checkpoint (or, `resume`, restore) through the job
    dirs they see, and what to do; None when they can. Each host of an SSH site without `shared_workdir` has
    its own copy of the job dir: the `writers` (`checkpoint_writers`) must run on one host, whose copy rank 0
    seals; a resumed rank reads the policy and the shard of its (tp, pp) position from its own host's copy, so
    on resume every rank must run there."""
    if kind_of(site).shared_work_root(site):
        return None
    field = f"sites.{name}.scheduler.shared_workdir"
    if resume:
        hosts = sorted({a.gpu_slice.host for a in trainers if a.gpu_slice is not None})
        if len(hosts) < 2:
            return None
        first = next(a.gpu_slice.host for a in trainers if a.replica == 0 and a.gpu_slice is not None)
        return (
            f"the trainer's ranks run on hosts {', '.join(hosts)} of site {name!r}, which share no work root "
            f"({field} is false): each rank restores the checkpoint from its own host's job dir, and only {first}'s "
            "holds it",
            f"set {field}: true if the hosts share a filesystem, or start the job anew",
        )
    hosts = sorted({a.gpu_slice.host for a in trainers if a.replica in writers and a.gpu_slice is not None})
    if len(hosts) < 2:
        return None
    ranks = ", ".join(map(str, writers))
    return (
        f"the trainer ranks that write each checkpoint's shards (data-parallel replica 0: ranks {ranks}) run on "
        f"hosts {', '.join(hosts)} of site {name!r}, which share no work root ({field} is false): rank 0 seals "
        "only the shards in its own host's job dir",
        f"set {field}: true if the hosts share a filesystem, or give the trainer the GPUs of one host (at pp 1, "
        "replica 0 is ranks 0 … tp − 1: a tp that fits on rank 0's host will do)",
    )


def plan_sites(plan: dict[str, Any]) -> list[str]:
    """The sites a plan's agents run on, each once: the controller's, the trainer's, then the rollout sites."""
    return list(
        dict.fromkeys([plan["controller_site"], plan["trainer"]["site"], *(g["site"] for g in plan["rollout"])])
    )


def rollout_tp(plan: dict[str, Any], site: str) -> int:
    """GPUs per rollout unit on `site` (the plan's figure; 1 for plans written before it had one)."""
    return next((int(g.get("tp", 1)) for g in plan["rollout"] if g["site"] == site), 1)


def layout(plan: dict[str, Any], sites: dict[str, Site], job: JobFile) -> list[PlannedAgent]:
    """Every agent of the job, in start order; LaunchError if a local / SSH site has too few GPUs."""
    _check_counts(plan, sites)
    t = plan["trainer"]
    ranks, t_site = int(t["ranks"]), str(t["site"])
    pools = {
        n: GpuPool(n, s, shares_trainer=n == t_site, trainer_tp=order_tp(plan, job))
        for n, s in sites.items()
        if uses_slices(s)
    }
    c_site = plan["controller_site"]
    c_res = controller_resources(job, sites[c_site])
    out = [PlannedAgent("controller", 0, c_site, c_res, ParallelConfig("controller"))]
    par = trainer_parallel(plan)
    if t_site in pools:
        slices = pools[t_site].take_ranks(ranks, who=f"the trainer ({ranks} ranks)", tp=par.tp)
        res = resources_for(job, "trainer", sites[t_site], tasks=1, gpus=1)
        out += [PlannedAgent("trainer", r, t_site, res, _with(par, rank=r), s) for r, s in enumerate(slices)]
    else:  # SLURM: one job, its tasks are the ranks
        res = trainer_job_resources(job, sites[t_site], ranks=ranks, tp=par.tp)
        out.append(PlannedAgent("trainer", 0, t_site, res, par))
    n = 0
    for group in plan["rollout"]:
        site, units = str(group["site"]), int(group["units"])
        tp = int(group.get("tp", 1))
        for _ in range(units):
            out.append(
                rollout_agent(site, sites[site], job, replica=n, tp=tp, units_on_site=units, pool=pools.get(site))
            )
            n += 1
    return out


def controller_cores(job: JobFile, site: Site) -> int:
    """The cores the controller asks its site for: its own loop (one thread) and each reward worker process it
    scores with (a dataset task's `reward_workers`, and the held-out evaluations' worker during the run), at most
    a node's. A SLURM site confines the job to them: asked for one, the workers all shared that core."""
    workers = getattr(job.task, "reward_workers", 0)
    ev = job.evaluation
    held = 1 if workers and ev.every_iterations and ev.heldout_prompts else 0
    cores = [n.cpus for n in site.nodes if n.cpus]
    return min([1 + workers + held, *cores])


def controller_resources(job: JobFile, site: Site) -> Resources:
    """The controller's cores (`controller_cores`) and host memory: each core's share of a node's memory, as an
    agent at its default threads gets it (a slot's `memory_gb` ÷ its cores), at most the smallest node's. Without a
    memory request a SLURM cluster may give the job a node's whole memory (no DefMemPerCPU), and a GPU job
    waits for that node while the controller runs. A site without `nodes[].cpus` says no core's share: the
    controller asks one GPU slot's memory in all, as a one-slot agent there does (each of its cores asked a whole
    slot's, a node's memory for a few reward workers, and check refused a controller that had room)."""
    cores = controller_cores(job, site)
    slot_gb = site.memory_per_slot_gb()
    if slot_gb is None:
        return Resources(cpus_per_task=cores)
    node_gb = min(n.memory_gb for n in site.nodes if n.memory_gb is not None)
    cpus_per_slot = site.cpus_per_slot()
    gb = min(node_gb, slot_gb if cpus_per_slot is None else cores * slot_gb / cpus_per_slot)
    return Resources(cpus_per_task=cores, mem_mb_per_task=int(gb * 1e9 / 2**20))  # GB (10^9 bytes) in MiB


def order_tp(plan: dict[str, Any], job: JobFile) -> int:
    """The trainer's tp the rollout's host order follows (`hostfill.rollout_host_order`): the plan's (the job's
    trainer.tensor_parallel, or the planner's choice where the job leaves it out: the planner prices each split
    with its own tp's order), the job's without a plan."""
    if plan and plan.get("trainer"):
        return trainer_parallel(plan).tp
    return (job.trainer.model_split or (1, 1))[0]


def resources_for(job: JobFile, role: str, site: Site, *, tasks: int, gpus: int = 1) -> Resources:
    """What an agent of `role` with `gpus` GPU slots per task asks its site for: the slots' cores (its threads,
    `threads_for`) and host memory (the inventory's nodes' `cpus` and `memory_gb`, shared among their slots)."""
    threads = threads_for(job, role, cpus_per_slot=site.cpus_per_slot(), slots=gpus)
    mem = site.memory_per_slot_gb()
    # the inventory says GB (10^9 bytes, as preflight reads it); SLURM counts memory in MiB
    return Resources(tasks, gpus, threads, None if mem is None else int(mem * gpus * 1e9 / 2**20))


def trainer_job_resources(job: JobFile, site: Site, *, ranks: int, tp: int) -> Resources:
    """What the trainer asks a SLURM site for: one job, its tasks its `ranks`, its `tp` groups each on one node (as
    many ranks on every node: `hostfill.slurm_layout`)."""
    return dataclasses.replace(resources_for(job, "trainer", site, tasks=ranks), group=tp)


def rollout_agent(
    site_name: str, site: Site, job: JobFile, *, replica: int, tp: int, units_on_site: int, pool: GpuPool | None
) -> PlannedAgent:
    """One rollout unit: its slice from `pool` (already holding every claimed slice), its cores and memory."""
    gpu_slice = pool.take(tp, who=f"rollout-{replica}") if pool is not None and uses_slices(site) else None
    p = ParallelConfig("rollout", tp=tp, dp=units_on_site, replica=replica)
    return PlannedAgent(
        "rollout", replica, site_name, resources_for(job, "rollout", site, tasks=1, gpus=tp), p, gpu_slice
    )


def _with(p: ParallelConfig, *, rank: int) -> ParallelConfig:
    return dataclasses.replace(p, rank=rank)


def _check_counts(plan: dict[str, Any], sites: dict[str, Site]) -> None:
    """One clear line per site when the job's GPUs outnumber the site's, before placing any."""
    need: dict[str, list[tuple[str, int]]] = {}
    t = plan["trainer"]
    need.setdefault(t["site"], []).append((f"trainer {t['ranks']} rank(s)", int(t["ranks"])))
    for g in plan["rollout"]:
        tp = int(g.get("tp", 1))
        need.setdefault(g["site"], []).append((f"{g['units']} rollout unit(s) × tp {tp}", int(g["units"]) * tp))
    placed = [*need.items(), (plan["controller_site"], [("the controller", 0)])]
    for name, parts in placed:  # plan.json or sites.json edited since the launch: a KeyError traceback, before
        if name not in sites:
            raise LaunchError(
                f"the plan places {' + '.join(w for w, _ in parts)} on site {name!r}, which is not among the job's "
                f"sites ({', '.join(sorted(sites))})",
                hint="was the job dir's plan.json or sites.json edited? put back its launch's",
            )
    for name, parts in need.items():
        site = sites[name]
        total = sum(n for _, n in parts)
        if total > site.total_gpus:
            hosts = ", ".join(f"{h}: {g}" for h, g in site.hosts)
            raise LaunchError(
                f"site {name}: {' + '.join(w for w, _ in parts)} need {total} GPU(s); "
                f"the inventory gives it {site.total_gpus} ({hosts})",
                hint="lower the GPU counts in the job's placement, or add nodes to the site",
            )
