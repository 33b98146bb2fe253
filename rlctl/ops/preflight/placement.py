"""Preflight of the plan launch runs, laid out on the sites (`placement_problems`): splits the runtime would ignore,
SLURM jobs asking more cores than a node has (or than its partition's nodes have, sinfo's, for `check --reach`), a
SLURM controller that leaves its agents no room, two trainer ranks on one GPU, checkpoint writers on hosts that share
no work root.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.config.inventory import Site
from rlctl.config.job import Job
from rlctl.config.schedulers import SlurmScheduler
from rlctl.devices import kind_for
from rlctl.errors import ConfigError, LaunchError, PlanError
from rlctl.launch.backends import kind_of
from rlctl.launch.layout import PlannedAgent, checkpoint_writers, layout, unshared_trainer
from rlctl.launch.slurm import SlurmResources, gpu_request_for
from rlctl.launch.wholenodes import UNBOUNDED, node_room
from rlctl.ops.noderoom import fit, shares_of
from rlctl.ops.preflight.backends import sharding_problems
from rlctl.ops.preflight.base import Problem
from rlctl.ops.preflight.memory import shared_rollout_memory_problems, trainer_memory_problems

if TYPE_CHECKING:
    from rlctl.launch.siteprobe import PartitionCpus


def placement_problems(job: Job, plan: dict[str, Any] | None) -> list[Problem]:
    """What the plan (the one launch runs) asks for and the runtime cannot give: a trainer split over tp × pp
    for the torch trainer (data parallel only; megatron runs the plan's split, or the job's
    `trainer.tensor_parallel` / `pipeline_parallel`, checked by `trainer_split_problems`), a planner-chosen rollout tp
    the embedded engine would ignore, more GPUs on a site than its inventory has (rlctl.launch.layout), the ranks that
    write the trainer's checkpoint shards (data-parallel replica 0's) on several hosts of an SSH site that share no
    work root (`layout.unshared_trainer`: rank 0 could not seal them)."""
    spec, out = job.spec, []
    if plan is None:
        from rlctl.ops import counts

        # (the planner's advisory note, explicit counts beside a planner that failed, is logged there as launch's
        # is: a warning where nothing here refuses the job)
        try:
            plan = counts.plan_counts(job, spec)
        except PlanError as e:
            return [Problem(_auto_field(job), f"'auto' needs the planner, which failed: {e.__cause__ or e}", e.hint)]
        except ConfigError as e:  # a job field the planner refuses, in check's words (`problems` says each once)
            if spec.planning.profile is not None and e.file == str(Path(spec.planning.profile)):
                return [Problem("planning.profile", str(e), e.hint)]  # the profile the job names: not this job's
            if e.field == "links" and e.file != str(job.path):
                return []  # the inventory's links join no path to a rollout site: `link_problems` says it, once
            if e.file != str(job.path) or e.field is None:  # a profile file's
                return [Problem(_auto_field(job), f"'auto' needs the planner, which failed: {e}", e.hint)]
            return [Problem(e.field, e.detail, e.hint)]
    t = plan["trainer"]
    par = t.get("parallel") or {}
    tp, pp = int(par.get("tp", 1)), int(par.get("pp", 1))
    # the job's own split: `trainer_split_problems` judges it; megatron runs the plan's (the planner searches only the
    # splits it runs, `rlctl.planner.split`); torch none (a plan given by hand may hold one)
    asked = spec.trainer.model_split is not None
    if (tp, pp) != (1, 1) and not asked and spec.trainer.backend != "megatron":
        out.append(
            Problem(
                "placement.trainer.gpus",
                f"the plan splits the model over the trainer's {t['ranks']} GPUs on site {t['site']!r} as tp {tp} "
                f"pp {pp} dp {par.get('dp', 1)}, and the 'torch' trainer has no model parallelism (each rank holds a "
                "whole replica): use trainer.backend 'megatron', which runs it, or a plan of tp 1 pp 1 (`rlctl plan` "
                "splits a torch trainer over dp only)",
            )
        )
    if spec.rollout.engine == "embedded" and spec.rollout.tensor_parallel is None:  # a set one: refused above
        for g in plan["rollout"]:
            if int(g.get("tp", 1)) > 1:
                out.append(
                    Problem(
                        "rollout.tensor_parallel",
                        f"unset, so the planner gives site {g['site']!r} units of tp {g['tp']}; the embedded "
                        "engine runs one device per unit: set 1, or engine 'vllm' for tensor parallelism",
                    )
                )
    units, cap = sum(int(g["units"]) for g in plan["rollout"]), spec.rebalance.max_rollout_units
    if cap is not None and units > cap:
        out.append(
            Problem(
                "rebalance.max_rollout_units",
                f"{cap}: the plan starts {units} rollout units; the cap counts them too: at least {units}, or leave "
                "it out",
            )
        )
    out += sharding_problems(job, plan)
    out += trainer_memory_problems(job, plan)
    try:
        agents = layout(plan, job.inventory.sites, spec)
    except LaunchError as e:
        out.append(Problem("placement", str(e), e.hint))
        return out
    trainers = [a for a in agents if a.role == "trainer"]
    site = trainers[0].site
    out += _shared_trainer_devices(job, trainers)
    out += shared_rollout_memory_problems(job, agents)
    out += _slurm_cores(job, agents)
    out += controller_room_problems(job, agents)
    out += exclusive_room_problems(job, agents)
    writers = checkpoint_writers(plan, spec)
    if (why := unshared_trainer(site, job.inventory.sites[site], trainers, writers=writers)) is not None:
        out.append(Problem("placement.trainer", *why))
    return out


THREAD_FIELDS = {"trainer": "trainer.threads_per_rank", "rollout": "rollout.threads_per_unit"}


def _slurm_cores(
    job: Job, agents: list[PlannedAgent], *, partition_cpus: Mapping[str, int] | None = None
) -> list[Problem]:
    """An agent's SLURM job asking more cores of a node (its tasks on the node × its threads, sbatch's
    --cpus-per-task) than any node of its site has (`nodes[].cpus`): sbatch refuses it ('Requested node
    configuration is not available') once the launch has staged and started the others. Only a role's threads
    set in the job can ask that many: its default is its GPU slots' share of the node's cores. `partition_cpus`
    (`check --reach`'s, `partition_cores_problems`): the most CPUs a node of a site's partition has (sinfo's), compared
    instead, for the roles whose threads the job sets, on those sites only."""
    out: list[Problem] = []
    for a in agents:
        site = job.inventory.sites[a.site]
        cores = [n.cpus for n in site.nodes]
        if a.role not in THREAD_FIELDS or kind_of(site).slices_gpus:
            continue
        if partition_cpus is None:
            if None in cores:
                continue
            most = max(c for c in cores if c is not None)
            have, unset = f"site {a.site}'s nodes have {most} (nodes[].cpus)", "its GPU slots' share of them"
        else:
            if a.site not in partition_cpus or _threads_given(job, a.role) is None:
                continue
            assert isinstance(site.scheduler, SlurmScheduler)  # partition_cores_problems asks SLURM sites only
            most, partition = partition_cpus[a.site], site.scheduler.partition
            have = f"partition {partition}'s nodes (site {a.site}) have at most {most} (sinfo)"
            unset = f"1 thread, as sites.{a.site}.nodes give no cpus"
        res = _slurm_request(job, a)
        if res is None:
            continue
        n, per = res.tasks_per_node, res.cpus_per_task
        if n * per > most:
            who = "the trainer's SLURM job" if a.role == "trainer" else "a rollout unit's SLURM job"
            asks = "asks that many cores"
            if n > 1:
                asks = f"puts {n} ranks on a node and asks {per} cores for each, {n * per} in all"
            out.append(
                Problem(
                    THREAD_FIELDS[a.role],
                    f"{per}: {who} {asks} (--cpus-per-task), and {have}: sbatch refuses it; at most "
                    f"{max(1, most // n)}, or leave it out ({unset})",
                )
            )
    return list(dict.fromkeys(out))


def partition_cores_problems(
    job: Job, plan: dict[str, Any] | None, *, reached: Collection[str], cpus: PartitionCpus
) -> list[Problem]:
    """`check --reach`'s: an agent's SLURM job asking more cores of a node (its tasks on the node × the threads the
    job sets for its role) than any node of its site's partition has (sinfo's CPUs), on a site whose inventory
    leaves a node's `cpus` out (`_slurm_cores` compares those; without them nothing did, and sbatch refused the
    agent's job as the launch started). sinfo is asked only on the sites in `reached`, once each (`cpus`, shared
    with the controller's check); nothing without a plan or a layout (`placement_problems` says why), or where
    sinfo cannot be asked or says no plain figure."""
    if plan is None:
        return []
    try:
        agents = layout(plan, job.inventory.sites, job.spec)
    except LaunchError:
        return []
    said: dict[str, int] = {}
    for name in sorted({a.site for a in agents if a.role in THREAD_FIELDS and _threads_given(job, a.role)}):
        site = job.inventory.sites[name]
        sched = site.scheduler  # (as `siteprobe.controller_cores_problems` asks the controller's site)
        if name not in reached or not isinstance(sched, SlurmScheduler) or None not in [n.cpus for n in site.nodes]:
            continue
        if (most := cpus(name, site)) is not None:
            said[name] = most
    return _slurm_cores(job, agents, partition_cpus=said)


def _threads_given(job: Job, role: str) -> int | None:
    """The threads the job sets for `role`'s agents (trainer.threads_per_rank, rollout.threads_per_unit)."""
    return {"trainer": job.spec.trainer.threads_per_rank, "rollout": job.spec.rollout.threads_per_unit}[role]


def _slurm_request(job: Job, a: PlannedAgent) -> SlurmResources | None:
    """What agent `a` of a SLURM site asks sbatch for; None where its site has no layout for it (`placement` says)."""
    site = job.inventory.sites[a.site]
    try:
        return SlurmResources.for_spec(
            a.resources,
            slots_per_node=site.gpus_per_node,
            gpu_request=gpu_request_for(site),
            node_gpus=[g for _, g in site.hosts],
            site=a.site,
        )
    except LaunchError:
        return None


def controller_room_problems(job: Job, agents: list[PlannedAgent]) -> list[Problem]:
    """A SLURM controller beside the job's SLURM agents on its site, its job and theirs asking more cores or memory
    than the site's nodes have in all (`nodes[].cpus`, `memory_gb`), or more than fits them node by node (its one
    task on one node, theirs each on nodes with the GPUs, cores and memory left: `rlctl.ops.noderoom`): the
    controller starts first and holds its share until the job ends, so an agent's job waits for it for ever (every
    GPU of a site at the default threads takes every core and all the memory). Figures the inventory leaves out are
    not compared."""
    c = next(a for a in agents if a.role == "controller")
    site = job.inventory.sites[c.site]
    if kind_of(site).slices_gpus or not any(a.site == c.site for a in agents if a is not c):
        return []
    asked = {"controller": [0, 0], "agents": [0, 0]}  # cores, MiB
    requests: list[SlurmResources] = []  # the controller's first
    for a in sorted((a for a in agents if a.site == c.site), key=lambda a: a is not c):
        res = _slurm_request(job, a)
        if res is None:
            return []
        requests.append(res)
        cores = res.ntasks * res.cpus_per_task
        who = asked["controller" if a is c else "agents"]
        who[0] += cores
        who[1] += cores * (res.mem_per_cpu_mb or 0)
    cpus = [(len(n.hosts), n.cpus) for n in site.nodes if n.cpus is not None]
    mem = [(len(n.hosts), int(n.memory_gb * 1e9 / 2**20)) for n in site.nodes if n.memory_gb is not None]
    have = [sum(k * v for k, v in given) if len(given) == len(site.nodes) else 0 for given in (cpus, mem)]
    short = [
        f"{what}: the controller's job asks {asked['controller'][i]}{unit} and the agents' {asked['agents'][i]}{unit}, "
        f"the site's nodes have {have[i]}{unit} in all ({field})"
        for i, (what, unit, field) in enumerate(
            (("cores", "", "nodes[].cpus"), ("memory", " MiB", "nodes[].memory_gb"))
        )
        if have[i] and asked["controller"][i] and asked["controller"][i] + asked["agents"][i] > have[i]
    ]
    if not short and any(have):
        short = _node_by_node(site, requests, asked["controller"], have)
    if not short:
        return []
    # an agent's memory is its GPU slots' share whatever its threads: fewer threads leave the controller no memory
    fewer = "fewer GPUs for the agents there"
    if "memory" not in short[-1].partition(":")[0]:
        fewer += ", or fewer threads (trainer.threads_per_rank, rollout.threads_per_unit)"
    return [
        Problem(
            "placement.controller_site",
            f"site {c.site}: {'; '.join(short)}: the controller's SLURM job starts first and holds its share until "
            "the job ends, so an agent's job there waits for it for ever",
            hint=f"run the controller on another site (placement.controller_site), or leave it room on {c.site}: "
            + fewer,
        )
    ]


def exclusive_room_problems(job: Job, agents: list[PlannedAgent]) -> list[Problem]:
    """A SLURM site whose `scheduler.exclusive` gives each of the job's SLURM jobs there its nodes whole, and whose
    nodes do not hold them all at once, each on nodes of its own (`noderoom.fit`, whole nodes): every rollout unit is
    a job of its own, so 6 units of 2 GPUs took 6 nodes of 8 GPUs, not 2, and the jobs past the site's nodes waited
    for ever for one the others hold until the job ends. Sites where an agent has no layout: `placement` says."""
    out = []
    for name in sorted({a.site for a in agents}):
        site = job.inventory.sites[name]
        if not getattr(site.scheduler, "exclusive", False):  # (a SLURM site's key)
            continue
        mine = [a for a in agents if a.site == name]
        requests = [_slurm_request(job, a) for a in mine]
        if any(r is None for r in requests):
            continue
        asked = [r.nodes for r in requests if r is not None]
        shares = [s for k, r in enumerate(requests) if r is not None for s in shares_of(k, r)]
        nodes = node_room(site)
        if fit(nodes, shares, whole=True) is not False:
            continue
        per_role = []
        for role in ("controller", "trainer", "rollout"):
            n = sum(k for a, k in zip(mine, asked, strict=True) if a.role == role)
            jobs = sum(a.role == role for a in mine)
            per_role += [f"{n} for its {jobs} rollout units" if role == "rollout" else f"{n} for the {role}"] * bool(
                jobs
            )
        out.append(
            Problem(
                f"sites.{name}.scheduler.exclusive",
                f"true: each of the job's {len(mine)} SLURM jobs on site {name} takes its nodes whole, "
                f"{sum(asked)} node(s) in all ({', '.join(per_role)}), and the site's {len(nodes)} node(s) do not "
                "hold them at once: a job past them waits for ever for a node another holds until the job ends",
                hint="set exclusive false (the jobs then share a node's GPUs and cores), or place fewer of the job's "
                f"agents on {name}: fewer rollout GPUs there, a larger rollout.tensor_parallel (fewer units), or the "
                "controller elsewhere (placement.controller_site)",
                file=job.inventory.origin[name],
            )
        )
    return out


def _node_by_node(site: Site, requests: list[SlurmResources], controller: list[int], have: list[int]) -> list[str]:
    """Why the controller's job (`requests[0]`, asking `controller` cores and MiB of one node) does not fit the
    site's nodes beside the agents' jobs (the rest), each job's share of a node on one that has it left: the
    figures short (cores, memory, or only the two together); [] when it fits, when the agents' jobs alone do not
    (placement's to say), or when the search gave up. `have`: the site's cores and MiB in all (0: not given)."""
    nodes = node_room(site)
    shares = [s for k, res in enumerate(requests) for s in shares_of(k, res)]
    if fit(nodes, [s for s in shares if s.job != 0]) is not True or fit(nodes, shares) is not False:
        return []
    names = [n for d, n in ((1, "cores"), (2, "memory")) if have[d - 1]]
    alone = [n for d, n in ((1, "cores"), (2, "memory")) if have[d - 1] and fit(_only(nodes, d), shares) is False]
    asks = [f"{controller[0]} cores"] * bool(have[0]) + [f"{controller[1]} MiB"] * bool(have[1] and controller[1])
    fields = ", ".join(f for f, given in zip(("nodes[].cpus", "nodes[].memory_gb"), have, strict=True) if given)
    return [
        f"{' and '.join(alone or names)}: the controller's job asks {' and '.join(asks)} of one node, and no node has "
        f"{'them' if len(asks) > 1 else 'that'} left beside the agents' jobs, though the site's nodes have "
        f"{'them' if len(asks) > 1 else 'that'} in all ({fields})"
    ]


def _only(nodes: list[tuple[int, int, int]], dim: int) -> list[tuple[int, int, int]]:
    """`nodes` with only figure `dim` (1 cores, 2 memory) compared beside the GPUs."""
    return [(g, c if dim == 1 else UNBOUNDED, m if dim == 2 else UNBOUNDED) for g, c, m in nodes]


def _shared_trainer_devices(job: Job, trainers: list[PlannedAgent]) -> list[Problem]:
    """Two trainer ranks given one GPU (slots that `devices` maps to the same id): their NCCL group cannot run
    (NCCL refuses two ranks on one device); rollout units, and a trainer rank beside them, may share one."""
    site = job.inventory.sites[trainers[0].site]
    if kind_for(site.spec.name) != "cuda":
        return []
    owner: dict[tuple[str, int], str] = {}
    for a in trainers:
        if (held := a.gpu_slice) is None:  # SLURM binds its tasks' GPUs itself
            continue
        for device in site.devices_of(held.host, held.gpus):
            other = owner.setdefault((held.host, device), a.name)
            if other != a.name:
                return [
                    Problem(
                        "placement.trainer",
                        f"{other} and {a.name} would both run on GPU {device} of {held.host} (the nodes[].devices of "
                        f"site {trainers[0].site!r}), and NCCL runs one rank per GPU",
                        hint="give the trainer fewer GPUs, or map its slots to distinct devices",
                    )
                ]
    return []


def _auto_field(job: Job) -> str:
    """The first role whose GPU count the planner chooses."""
    placement = job.spec.placement
    if placement.trainer.gpus == "auto":
        return "placement.trainer.gpus"
    i = next(i for i, r in enumerate(placement.rollout) if r.gpus == "auto")
    return f"placement.rollout[{i}].gpus"
