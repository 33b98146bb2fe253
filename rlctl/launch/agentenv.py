"""The environment a launcher gives an agent, and how the agent reads it back.

    launcher (rlctl.launch.spawn.agent_spec)           agent (python -m rlctl.agents ROLE …)
    RLCTL_SITE            its site's name        ─▶    listen address, logs
    RLCTL_LISTEN_HOST     site network.listen_host ─▶  the address it binds and advertises
    RLCTL_PARALLEL        {"role","tp","pp","dp", ─▶   parallel_from_env(): its place in the job's
                           "rank" | "replica"}          parallel layout (a SLURM rank from $SLURM_PROCID)
    CUDA_VISIBLE_DEVICES  its GPU slice (local/ssh) ─▶ the devices it may use (SLURM sets its own); "" for
                          the controller and the agents of a `gpu: CPU` site (none, on a GPU host too)
    RLCTL_RDMA            its site network.rdma  ─▶   the ucx transport's UCX_TLS (rlctl.transport.ucx)
    OMP/MKL_NUM_THREADS   threads_for(job, role,  ─▶   torch.set_num_threads (the same figure)
                          its site's cores)
    RLCTL_CPUS            a `gpu: CPU` local/ssh   ─▶  vLLM's CPU workers' thread binding at tp > 1
                          agent's slots' cores          (rlctl.engines.vllm.cpu_binding): disjoint per unit
                          (Site.cores_of; where the
                          inventory gives `cpus`)
    RLCTL_RESUME_VERSION  `launch --resume`: the    ─▶  controller and trainer restore exactly that
                          checkpoint it picked           checkpoint (0: none was ever complete: start over),
                          (rlctl.checkpoint.choose)      and set their parts of newer ones aside
    RLCTL_CODE            the launcher's rlctl     ─▶  an agent of other code exits at start, one line
                          (rlctl.buildid)               (`code_mismatch`): never half a protocol

This module is the contract: both sides import it, neither imports the other.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from rlctl.config.job import JobFile

if TYPE_CHECKING:
    pass

ENV_SITE = "RLCTL_SITE"
ENV_LISTEN_HOST = "RLCTL_LISTEN_HOST"
ENV_PARALLEL = "RLCTL_PARALLEL"
ENV_VISIBLE = "CUDA_VISIBLE_DEVICES"
ENV_RESUME = "RLCTL_RESUME_VERSION"
ENV_CODE = "RLCTL_CODE"  # the launching rlctl's code_digest (rlctl.buildid)
ENV_CPUS = "RLCTL_CPUS"  # the host's cores of the agent's slots ("0,1,2,3"), where the launcher knows them
ENV_RUN = "RLCTL_RUN"  # the controller's run of its job (its launcher's id for it), written into summary.json
BASE_ENV = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass(frozen=True)
class ParallelConfig:
    """One agent's place in the job's parallel layout.

    trainer: tp × pp × dp = its ranks; `rank` is this process (None for a SLURM job whose tasks are the
    ranks: each reads $SLURM_PROCID). rollout: one DP unit of `tp` GPUs; `dp` = rollout units on its site
    when it started, itself included; `replica` = the unit's number. controller: all 1."""

    role: str
    tp: int = 1
    pp: int = 1
    dp: int = 1
    rank: int | None = None
    replica: int | None = None
    fsdp: bool | None = None  # trainer: its dp ranks shard one replica (FSDP2) instead of each holding one
    # trainer, fsdp: FSDP2 reduces the gradients once an optimizer step, not once a cut (`DataParallel.reduce_per_step`)
    reduce_per_step: bool | None = None

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None}, sort_keys=True)

    def short(self) -> str:
        """`tp2 pp1 dp8` for tables and log lines (`… fsdp` when sharded)."""
        return f"tp{self.tp} pp{self.pp} dp{self.dp}" + (" fsdp" if self.fsdp else "")

    def first_replica_ranks(self) -> list[int]:
        """A trainer's data-parallel replica 0: the global ranks of its tp × pp positions, which write the
        shards of a trainer checkpoint (the other replicas hold the same state). Megatron numbers the ranks tp
        fastest, then dp, then pp (its default order "tp-cp-ep-dp-pp"), so position (t, p) of replica 0 is
        rank t + tp·dp·p: ranks 0 … tp−1 at pp 1, not a prefix of the ranks at pp > 1 and dp > 1. Sharded by
        FSDP, every rank holds its own part of the one replica: all of them write."""
        if self.fsdp:
            return list(range(self.tp * self.pp * self.dp))
        return [t + self.tp * self.dp * p for p in range(self.pp) for t in range(self.tp)]


def threads_for(job: JobFile, role: str, *, cpus_per_slot: int | None = None, slots: int = 1) -> int:
    """CPU threads of one agent process: rollout.threads_per_unit, trainer.threads_per_rank; unset, the cores its
    `slots` GPU slots get on its site (`cpus_per_slot`, from the inventory's nodes), else 1. The controller: 1."""
    given = {"rollout": job.rollout.threads_per_unit, "trainer": job.trainer.threads_per_rank}.get(role, 1)
    if given is not None:
        return given
    return cpus_per_slot * slots if cpus_per_slot else 1


def thread_env(threads: int) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def parallel_from_env(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """This agent's RLCTL_PARALLEL as a dict ({} when not launched by rlctl); a trainer rank without an
    explicit `rank` (a SLURM task) takes $SLURM_PROCID, else $RANK. ValueError if the variable is not JSON."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_PARALLEL)
    if not raw:
        return {}
    try:
        out = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{ENV_PARALLEL} is not JSON: {raw!r}") from e
    if not isinstance(out, dict):
        raise ValueError(f"{ENV_PARALLEL} must be a JSON object, got {raw!r}")
    if out.get("role") == "trainer" and "rank" not in out:
        rank = env.get("SLURM_PROCID") or env.get("RANK")
        if rank is not None:
            out["rank"] = int(rank)
    return dict(out)


def code_mismatch(environ: dict[str, str] | None = None) -> str | None:
    """Why this agent must not run, in one line, where its launcher's rlctl (RLCTL_CODE) is other code than its
    own (rlctl.buildid): a site that runs another checkout or install of rlctl than the operator's; None where they
    are the same, or no launcher said (an agent started by hand, an older launcher)."""
    env = os.environ if environ is None else environ
    theirs = env.get(ENV_CODE)
    if not theirs:
        return None
    import rlctl
    from rlctl.buildid import code_digest

    ours = code_digest()
    if theirs == ours:
        return None
    return (
        f"rlctl here ({rlctl.__file__.removesuffix('/__init__.py')}, {rlctl.__version__}, code {ours}) is other code "
        f"than the rlctl that started this (code {theirs}): install that rlctl on this host, or point the site's "
        "python at the environment that has it (`rlctl check --reach` asks every site before a launch)"
    )
