"""Where the stages sit on a site's hosts: the order rollout GPUs fill them, the hosts a count spans, a site's
network rate, and the trainer's stage curve over its GPU slots (each tp group on one host, `hostfill`), with the
errors of a trainer split or count that cannot be placed."""

from __future__ import annotations

import numpy as np

from rlctl.config.hostfill import PLACEMENT_HINT, placement_error, rollout_host_order
from rlctl.config.inventory import Site
from rlctl.config.job import Job
from rlctl.errors import ConfigError, PlanError
from rlctl.launch.backends import kind_of
from rlctl.planner.costs import TrainWorkload
from rlctl.planner.curves import TrainCurve, train_stage_curve
from rlctl.planner.inputs import site_for_backend
from rlctl.planner.split import split_refusal
from rlctl.profiler.profile import ProfileFile


def rollout_hosts(site: Site, *, shared: bool, trainer_tp: int = 1) -> list[int]:
    """The GPUs of the site's hosts in the order x rollout GPUs fill them (`hostfill.rollout_host_order`, the order
    `GpuPool.take` places units in): inventory order, but from the last host on the site the trainer shares, whose
    ranks fill the first hosts (`GpuPool.take_ranks`), after the hosts too small for one of its `trainer_tp` groups."""
    gpus = [g for _, g in site.hosts]
    return rollout_host_order(gpus, shares_trainer=shared, gpus=gpus, trainer_tp=trainer_tp)


def hosts_spanned(host_gpus: list[int], gpus: int) -> int:
    """The hosts `gpus` GPU slots fill, host by host in the order of `host_gpus` (12 GPUs of 8-GPU hosts: 2)."""
    filled = hosts = 0
    for g in host_gpus:
        if filled >= gpus:
            break
        filled, hosts = filled + g, hosts + 1
    return hosts


def site_node_bytes_per_s(site: Site) -> float:
    return site.network.bandwidth_gbps * 1e9 / 8


PLACE_HINT = (
    "use a trainer GPU count whose tp groups fit the hosts, or a trainer.tensor_parallel that divides their GPUs"
)


def trainer_curve(
    job: Job, prof: ProfileFile, tw: TrainWorkload, *, t_fixed: int | None, profile_file: str, order_tp: int
) -> tuple[TrainCurve, int | None]:
    """The trainer's stage curve over its site's GPU slots, each tp group of a configuration on one host
    (`hostfill`), and for a fixed trainer count the slots its best configuration takes (None for `auto`).
    PlanError naming the site, its hosts' GPUs and tp when a fixed count cannot be placed so."""
    spec, inv = job.spec, job.inventory
    t_site = spec.placement.trainer.site
    site = inv.sites[t_site]
    host_gpus = [g for _, g in site.hosts]
    split = spec.trainer.model_split
    backend = spec.trainer.backend
    if split is not None:  # the job's split: refused as `rlctl check` refuses it, naming the field
        if (refusal := split_refusal(spec.model.arch, backend, tp=split[0], pp=split[1])) is not None:
            raise ConfigError(str(job.path), *refusal)
        if t_fixed is not None and t_fixed % (split[0] * split[1]):
            raise ConfigError(
                str(job.path),
                spec.trainer.split_field,
                f"tp {split[0]} × pp {split[1]} does not divide placement.trainer.gpus {t_fixed} (GPUs = tp × pp × dp)",
            )
    have = sorted({(e.tp, e.pp) for e in prof.sites[t_site].training})
    if split is not None and split not in have and prof.source == "measured":  # a roofline has every split it can
        raise ConfigError(
            profile_file,
            f"sites.{t_site}.training",
            f"no entry at the job's tp {split[0]} pp {split[1]} (it has tp, pp: "
            f"{', '.join(f'{tp} {pp}' for tp, pp in have) or 'none'})",
            hint="profile with the job (rlctl profile --job JOB), which covers its trainer split",
        )
    tp, pp = split or (1, 1)
    slurm = kind_of(site).ranks_are_tasks  # SLURM places the ranks, as many per node (`hostfill.slurm_layout`)
    if (why := placement_error(t_site, host_gpus, t_fixed or tp * pp, tp=tp, slurm=slurm)) is not None:
        field = "placement.trainer.gpus" if t_fixed is not None else "trainer.tensor_parallel"  # the job's either way
        raise ConfigError(str(job.path), field, why, hint=PLACEMENT_HINT)
    t_prof = site_for_backend(prof.sites[t_site], backend, name=t_site, profile_file=profile_file)
    if split is None:  # the splits it searches: those the backend runs for this model (torch: tp 1 pp 1 only)
        runs = [e for e in t_prof.training if split_refusal(spec.model.arch, backend, tp=e.tp, pp=e.pp) is None]
        t_prof = t_prof.model_copy(update={"training": runs})
    tcurve = train_stage_curve(
        t_prof,
        tw,
        max_gpus=site.total_gpus,
        host_gpus=host_gpus,
        ranks=t_fixed,
        slurm=slurm,
        # a host too small for one group is the rollout's on a shared site (it reaches it first)
        order_tp=order_tp if t_site in {r.site for r in spec.placement.rollout} else 1,
        node_bytes_per_s=site_node_bytes_per_s(inv.sites[t_site]),
        split=split,
    )
    if not np.isfinite(tcurve.seconds).any():
        tp_pp = split or ((1, 1) if backend != "megatron" else None)
        asked = f" at tp {tp_pp[0]} pp {tp_pp[1]}" if tp_pp else " at any tp × pp"
        why = (
            f"{prof.model.arch.name} training state and activations do not fit in {t_fixed or site.total_gpus} × "
            f"{prof.sites[t_site].gpu}{asked}{_rank_state(job, tw, gpus=t_fixed or site.total_gpus)}"
        )
        if backend != "megatron" and not tw.shards_state:  # no GPU count helps: the job's choice not to shard
            raise ConfigError(
                str(job.path), "trainer.shard", f"'none': {why}", hint="'auto': FSDP2 divides it over the ranks"
            )
        more = "more GPUs (placement.trainer.gpus)" if t_fixed is not None else "more GPUs on the trainer site"
        if backend == "megatron" and split:
            hint = more + ", or another trainer.tensor_parallel / pipeline_parallel"
        else:
            hint = more
        # a rank's share of a cut is its budgets' at any dp: fewer tokens help where it holds more than one row
        acts = tw.activations
        if acts is not None and acts.rank_tokens > acts.seq_tokens:
            hint += ", or fewer tokens a rank's share of a cut (batch.train_micro_batch_tokens)"
        if acts is not None and backend == "torch" and not acts.checkpointing:
            hint += ", or trainer.activation_checkpointing: true"
        if t_fixed is not None:  # the job's count: a field of its file
            raise ConfigError(str(job.path), "placement.trainer.gpus", f"{t_fixed}: {why}", hint=hint)
        raise PlanError(f"site {t_site!r}: {why}", hint=hint)
    if t_fixed is None:
        return tcurve, None
    # every point holds exactly the fixed count; a later one a faster split whose tp groups pass over more
    # leftovers (8 ranks on 6-GPU hosts: tp 2 in 8 slots, tp 4 in 10). The fastest, the fewest slots of equal
    # ones: where the trainer has its site to itself the slots beyond its ranks cost nothing (a shared site
    # chooses the slots with the rollout's: `make_plan`). The launch runs the plan's split (`counts.plan_counts`)
    return tcurve, int(np.argmin(tcurve.seconds))


def _rank_state(job: Job, tw: TrainWorkload, *, gpus: int) -> str:
    """Why a rank holds its whole state, where it does (`costs.shards_state`): the memory the planner priced a
    trainer rank at, said where no layout fits on `gpus` GPUs."""
    return _state_said(job, tw, gpus=gpus)[:-1] + _activations_said(tw, gpus=gpus) + ")"


def _state_said(job: Job, tw: TrainWorkload, *, gpus: int) -> str:
    if tw.shards_state and gpus == 1:
        return " (one rank holds its whole state: FSDP2 shards it over 2 or more)"
    if tw.shards_state:
        return " (FSDP2 over every trainer GPU: weights, gradients and optimizer state sharded)"
    if job.spec.trainer.backend == "megatron":
        return " (the megatron trainer has no distributed optimizer: every rank holds its tp × pp shard's whole state)"
    return " (every rank holds its whole state)"


def _activations_said(tw: TrainWorkload, *, gpus: int) -> str:
    """A rank's activations at tp 1 pp 1 over `gpus` data-parallel ranks (`profiler.actmem`), where priced."""
    a = tw.activations
    if a is None:
        return ""
    at = a.rank_bytes(fsdp=tw.shards_state and gpus > 1) / 1e9
    return f"; a cut's activations {at:.1f} GB a rank at tp 1 pp 1, its {a.rank_tokens:,} tokens"
