"""The agents a run starts, in start order, with the environment each one's role adds (`planned_agents`: the
trainer ranks' MASTER_ADDR / MASTER_PORT, WORLD_SIZE, RANK), and the refusal of checkpoint-writing trainer ranks
that share no job dir (`refuse_unshared_trainer`)."""

from __future__ import annotations

import logging
from typing import Any

from rlctl.config.inventory import Site
from rlctl.config.job import JobFile
from rlctl.errors import UsageError
from rlctl.launch.backends import kind_of
from rlctl.launch.layout import PlannedAgent, layout, unshared_trainer

log = logging.getLogger(__name__)


def refuse_unshared_trainer(
    name: str, site: Site, trainers: list[PlannedAgent], *, writers: list[int], resume: bool = False
) -> None:
    """The trainer ranks that write checkpoint shards (`writers`: data-parallel replica 0's) write them into the
    job dir they see, and rank 0 seals the part once it sees every shard there; a resumed rank reads the policy
    and its shard there. So on an SSH site whose hosts share no work root the writers must share a host, and on
    resume every rank must (`layout.unshared_trainer`): else UsageError, one line, before any agent starts.
    `rlctl check` refuses the first case too (`rlctl.ops.preflight`)."""
    why = unshared_trainer(name, site, trainers, writers=writers, resume=resume)
    if why is not None:
        raise UsageError(why[0], hint=why[1])


def planned_agents(
    plan: dict[str, Any], sites: dict[str, Site], job: JobFile, *, master_port: int
) -> list[tuple[PlannedAgent, dict[str, str]]]:
    """Every agent to start with the environment its role adds, controller first, in start order.

    Trainer ranks find rank 0 at MASTER_ADDR: the first node of a SLURM allocation ($SLURM_JOB_NODELIST,
    read by the agent: `slurm_master_addr`), else rank 0's host (127.0.0.1 when every rank runs on one host)."""
    agents = layout(plan, sites, job)
    ranks = int(plan["trainer"]["ranks"])
    env = {"MASTER_PORT": str(master_port), "WORLD_SIZE": str(ranks)}
    trainers = [a for a in agents if a.role == "trainer"]
    hosts = {a.gpu_slice.host for a in trainers if a.gpu_slice is not None}
    t0 = trainers[0].gpu_slice
    master = t0.host if len(hosts) > 1 and t0 is not None else "127.0.0.1"
    out: list[tuple[PlannedAgent, dict[str, str]]] = []
    for a in agents:
        if a.role != "trainer":
            out.append((a, {}))
        elif kind_of(sites[a.site]).ranks_are_tasks:  # one SLURM job whose tasks are the ranks ($SLURM_PROCID)
            out.append((a, env if ranks > 1 else {**env, "MASTER_ADDR": "127.0.0.1"}))
        else:
            out.append((a, {**env, "MASTER_ADDR": master, "RANK": str(a.replica)}))
    return out
