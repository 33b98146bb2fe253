"""`launch --resume JOB --trainer-split tp=T,pp=P[,dp=D]`: a job resumed with its trainer split otherwise than its
plan.json says (the trainer moved to another GPU count), checked as a launch checks the split, before plan.json is
rewritten.

    --trainer-split text ─▶ parse_split ─▶ resplit_plan(plan.json, job.json, sites.json) ─▶ the new plan, or one line
                                              │ the model's heads / layers divide (`planner.split.split_refusals`,
                                              │   what `rlctl check` says of trainer.tensor_parallel)
                                              │ a rank fits the site's GPU memory (`preflight.memory.
                                              │   trainer_memory_refusal`, what `rlctl check` says of the plan's)
                                              │ the site holds tp × pp × dp ranks (`agentplan.planned_agents`, as the
                                              │   run places them; a SLURM site's nodes each tp group, `hostfill`)
                                              │ the resumed ranks share the job dir (`refuse_unshared_trainer`)
                                              │ an exclusive SLURM site's nodes hold every job (`preflight.placement`)
                                              │ (a split refused for memory: the hint names the fewest GPUs that fit
                                              │   and that these room checks, `_check_room`, pass)
                                              ▼
                          `launch --resume` writes it to plan.json as its run starts (put back if none starts)

The trainer keeps its site; its section of the plan changes (`ranks` = tp × pp × dp, `parallel`), and the planner's
figures for it (`planner`: its allocation row, predicted times, rebalance advice) are made again for the new split
(`_repriced`), or dropped where they cannot be. A part not
given keeps the plan's value: `tp=1` alone keeps its pp and dp, so the GPU count follows the split (dp is the number
of replicas, which the operator chooses, not the site's free GPUs). job.json keeps the launch's fields: the run reads
the split from the plan (`launch.layout.trainer_parallel`), and the checkpoint's state is rebuilt for it
(`rlctl.checkpoint.resplit`). The new plan's trainer is sharded by FSDP2 where the planner shards that split
(`planner.split.trainer_sharding`, as a launch at it would run), and its state, sharded or not, is rebuilt into that
split's (`rlctl.checkpoint.refsdp`). What the loader does not rebuild is refused here, at the option: FSDP's sharded
state at a tp × pp other than 1 × 1, and a PPO critic's at another tp × pp.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

from rlctl.config.hostfill import PLACEMENT_HINT, placement_error
from rlctl.config.inventory import Inventory, Site
from rlctl.config.job import Job, JobFile
from rlctl.errors import LaunchError, UsageError
from rlctl.launch.agentenv import ParallelConfig
from rlctl.launch.backends import SITES_FILE, kind_of
from rlctl.launch.layout import checkpoint_writers, trainer_parallel
from rlctl.models.catalog import ModelArch
from rlctl.ops.agentplan import planned_agents, refuse_unshared_trainer
from rlctl.ops.preflight.backends import sharding_problems
from rlctl.ops.preflight.memory import trainer_memory_refusal
from rlctl.ops.preflight.placement import exclusive_room_problems
from rlctl.planner.split import split_refusals, trainer_sharding

OPTION = "--trainer-split"
SYNTAX = "tp=T,pp=P[,dp=D]"
_KEYS = ("tp", "pp", "dp")
_PART_OF = {"trainer.tensor_parallel": "tp", "trainer.pipeline_parallel": "pp"}

log = logging.getLogger(__name__)


def parse_split(text: str) -> dict[str, int]:
    """The parts `text` gives ("tp=1,pp=2" → {"tp": 1, "pp": 2}); UsageError, one line naming the option, for
    anything else."""
    out: dict[str, int] = {}
    for part in text.split(","):
        key, eq, value = part.strip().partition("=")
        key = key.strip()
        if not eq or key not in _KEYS or key in out or not value.strip().isdecimal() or int(value) < 1:
            raise UsageError(
                f"{OPTION} {text!r}: {part.strip()!r} is not one of tp=, pp=, dp= with a count of 1 or more; use "
                f"{SYNTAX} (a part left out keeps the plan's)",
                hint=f"e.g. `rlctl launch --resume JOB {OPTION} tp=1,pp=2`",
            )
        out[key] = int(value)
    return out


def resplit_plan(
    plan: dict[str, Any],
    asked: dict[str, int],
    *,
    spec: JobFile,
    sites: dict[str, Site],
    arch: ModelArch,
    inventory: Inventory | None = None,
) -> dict[str, Any] | None:
    """`plan` with its trainer split as `asked` (`parse_split`; the parts not given the plan's), or None where that is
    the plan's split already; UsageError, one line naming the option, where a launch would refuse the split (the
    model, the site's room, each rank's memory, an exclusive SLURM site's nodes) or the checkpoint loader cannot
    rebuild the trainer's state at it. `inventory`: the sites and links the plan's predictions are made again on
    (`jobchanges.launched_inventory`); default `sites` without links (a job in one datacenter)."""
    was = trainer_parallel(plan)
    tp, pp, dp = (asked.get(k, getattr(was, k)) for k in _KEYS)
    given = f"{OPTION} {','.join(f'{k}={v}' for k, v in asked.items())}"
    if (tp, pp, dp) == (was.tp, was.pp, was.dp):
        return None
    name = str(plan["trainer"]["site"])
    site = sites.get(name)  # a site sites.json lacks: refused as the agents are laid out, below
    if was.fsdp and (tp, pp) != (1, 1):  # (`checkpoint.choose.split_problem`: FSDP's state at another dp alone)
        raise UsageError(
            f"{given}: the trainer's state is sharded by FSDP (trainer.shard {spec.trainer.shard!r}, the plan at "
            f"{was.short()}), which a resume rebuilds at another dp alone, at tp 1 pp 1",
            hint=f"use {OPTION} dp=D",
        )
    # the planner shards the new split with FSDP2 where a launch at it would; the checkpoint's state, sharded or not,
    # is rebuilt into its shards (`rlctl.checkpoint.refsdp`)
    job = Job(spec, Inventory(sites, [], [SITES_FILE]), Path(SITES_FILE))
    sharding = trainer_sharding(job, tp=tp, pp=pp, dp=dp) if site is not None else {}
    if spec.algorithm.kind == "ppo" and (tp, pp) != (was.tp, was.pp):
        raise UsageError(
            f"{given}: a PPO critic's state is not rebuilt at another tp × pp (the plan's tp {was.tp} pp {was.pp})",
            hint="keep tp and pp (dp may change), or launch the job anew at this split",
        )
    refused = split_refusals(arch, spec.trainer.backend, tp=tp, pp=pp)  # what `rlctl check` says of the job's split
    if refused:
        field, why = refused[0]
        raise UsageError(f"{given}: {_PART_OF[field]} {why}", hint=f"use {SYNTAX} with a split the model divides by")
    split = ParallelConfig("trainer", tp=tp, pp=pp, dp=dp, **sharding)
    if site is not None and (why_not := trainer_memory_refusal(spec, name, site, split, arch=arch)) is not None:
        raise UsageError(f"{given}: {why_not}", hint=_fitting_hint(plan, spec, sites, arch=arch, was=was, dp=dp))
    new = _with_split(plan, tp=tp, pp=pp, dp=dp, sharding=sharding)
    if unsharded := sharding_problems(job, new):  # FSDP where a launch at the split is refused
        raise UsageError(f"{given}: {unsharded[0].field} {unsharded[0].message}", hint=f"use {SYNTAX} with another dp")
    try:
        _check_room(new, spec=spec, sites=sites)
    except (LaunchError, UsageError) as e:
        raise UsageError(f"{given}: {e}", hint=e.hint) from e
    if "planner" in new:  # (a plan made without the planner has none to redo)
        new["planner"] = _repriced(new, spec=spec, inventory=inventory or Inventory(sites, [], [SITES_FILE]))
    return new


def _repriced(new: dict[str, Any], *, spec: JobFile, inventory: Inventory) -> dict[str, Any]:
    """Plan `new`'s planner section made for its trainer split: the planner's plan of the job with every count pinned
    to the run's (the trainer's ranks at its tp × pp, each rollout site's units × tp) on `inventory`, priced
    by the profile the launch's plan was (`counts.job_profile`: the job's `planning.profile`, else the analytical one
    of the sites' GPUs), for `spec`'s model (an HF model's: the job dir's copy, `launching.resume._resplit`). Where it
    cannot be made (the profile gone, or without an entry at this split; a job across datacenters whose links
    `inventory` lacks; a planner error) the section keeps its rollout rows and the trainer row's config and GPUs,
    its figures dropped (the trainer row's predicted_s, `predicted`, `rebalance`), said in one line; versus the old
    split's figures kept beside the new split."""
    from rlctl.ops.counts import job_profile, launch_plan, planner_section

    t = new["trainer"]
    tp, pp = int(t["parallel"]["tp"]), int(t["parallel"]["pp"])
    try:  # (a rollout site placed `auto` the plan gave no units: a KeyError, said as any other)
        units = {str(g["site"]): int(g["units"]) * int(g.get("tp", 1)) for g in new["rollout"]}
        placement = spec.placement.model_copy(
            update={
                "trainer": spec.placement.trainer.model_copy(update={"gpus": int(t["ranks"])}),
                # an `auto` count at the plan's (a count the job gives is the one its plan priced already)
                "rollout": [
                    r if r.gpus != "auto" else r.model_copy(update={"gpus": units[r.site]})
                    for r in spec.placement.rollout
                ],
            }
        )
        trainer = spec.trainer.model_copy(update={"tensor_parallel": tp, "pipeline_parallel": pp})
        pinned = spec.model_copy(update={"placement": placement, "trainer": trainer})
        job = Job(pinned, inventory, Path(SITES_FILE))
        profile, profile_file = job_profile(job)
        return planner_section(launch_plan(job, profile, profile_file=profile_file))
    except Exception as e:  # noqa: BLE001 - the predictions are advisory, as `counts.plan_counts` holds the planner
        log.warning(
            "the plan's predictions were not redone for the trainer at %s (%s: %s): its trainer figures are dropped "
            "from plan.json",
            trainer_parallel(new).short(),
            type(e).__name__,
            e,
        )
    rows = [
        {k: v for k, v in a.items() if k != "predicted_s"} | {"config": dict(t["parallel"]), "gpus_used": t["ranks"]}
        if a.get("role") == "trainer"
        else a
        for a in new["planner"].get("allocation", [])
    ]
    return {"allocation": rows}


def _with_split(
    plan: dict[str, Any], *, tp: int, pp: int, dp: int, sharding: dict[str, bool] | None = None
) -> dict[str, Any]:
    """A copy of `plan` with its trainer at tp × pp × dp (`ranks`, `parallel`), sharded as `sharding` says (the
    planner's keys at that split, `planner.split.trainer_sharding`: none, unsharded)."""
    new = copy.deepcopy(plan)
    parallel = {"tp": tp, "pp": pp, "dp": dp} | (sharding or {})
    new["trainer"]["ranks"], new["trainer"]["parallel"] = tp * pp * dp, parallel
    return new


def _check_room(new: dict[str, Any], *, spec: JobFile, sites: dict[str, Site]) -> None:
    """LaunchError or UsageError (its line and hint) where the trainer's site does not hold plan `new`'s split as the
    run lays it out: each tp group on one SLURM node, the site's room, the resumed ranks sharing the job dir, an
    exclusive SLURM site's nodes holding every job; what `resplit_plan` refuses, and `_fitting_hint` suggests none
    of."""
    t = new["trainer"]
    name, tp = str(t["site"]), int(t["parallel"]["tp"])
    site = sites.get(name)  # a site sites.json lacks: refused as the agents are laid out, below
    if site is not None and not kind_of(site).slices_gpus:  # SLURM places the ranks: each tp group on one node
        why_not = placement_error(name, [g for _, g in site.hosts], t["ranks"], tp=tp, slurm=True)
        if why_not is not None:
            raise UsageError(why_not, hint=PLACEMENT_HINT)
    # the agents as the run lays them out: the site's room, every tp group on one host
    agents = [a for a, _ in planned_agents(new, sites, spec, master_port=0)]
    trainers = [a for a in agents if a.role == "trainer"]
    refuse_unshared_trainer(
        trainers[0].site, sites[trainers[0].site], trainers, writers=checkpoint_writers(new, spec), resume=True
    )
    # a SLURM site giving each of the job's SLURM jobs its nodes whole (`scheduler.exclusive`): the trainer's job on
    # more nodes leaves fewer for the controller's and the rollout units' there, and one past the site's nodes waits
    # for ever, though the site's GPUs hold them all (what `rlctl check` asks of a launch's agents)
    job = Job(spec, Inventory(sites, [], [SITES_FILE]), Path(SITES_FILE))
    if crowded := exclusive_room_problems(job, agents):
        raise UsageError(
            f"{crowded[0].field} {crowded[0].message}",
            hint=f"use {SYNTAX} with fewer ranks, or resume at the plan's split",
        )


def _fitting_hint(
    plan: dict[str, Any], spec: JobFile, sites: dict[str, Site], *, arch: ModelArch, was: ParallelConfig, dp: int
) -> str:
    """What a refused split's line suggests: the fewest GPUs a replica at `dp` replicas fits in (tp before pp, tp
    within a node: `trainer_memory_refusal`, the model's divisors, the site's GPUs) that the site's room holds
    (`_check_room`, as the next try judges it), else the plan's split."""
    name = str(plan["trainer"]["site"])
    site = sites[name]
    job = Job(spec, Inventory(sites, [], [SITES_FILE]), Path(SITES_FILE))

    def sharding(tp: int, pp: int) -> dict[str, bool]:  # FSDP2 where the planner shards the split (`resplit_plan`)
        return trainer_sharding(job, tp=tp, pp=pp, dp=dp)

    fits = [
        (tp, pp)
        for tp in range(1, site.gpus_per_node + 1)
        for pp in range(1, site.total_gpus // (tp * dp) + 1)
        if not split_refusals(arch, spec.trainer.backend, tp=tp, pp=pp)
        and (spec.algorithm.kind != "ppo" or (tp, pp) == (was.tp, was.pp))  # a critic keeps its tp × pp (above)
        and not (was.fsdp and (tp, pp) != (1, 1))  # FSDP's state at another dp alone (above)
        and trainer_memory_refusal(
            spec, name, site, ParallelConfig("trainer", tp=tp, pp=pp, dp=dp, **sharding(tp, pp)), arch=arch
        )
        is None
    ]
    for tp, pp in sorted(fits, key=lambda s: (s[0] * s[1], s[1])):
        try:
            _check_room(_with_split(plan, tp=tp, pp=pp, dp=dp, sharding=sharding(tp, pp)), spec=spec, sites=sites)
        except (LaunchError, UsageError):
            continue  # the next try would be refused for the site's room: not suggested
        return f"use {OPTION} tp={tp},pp={pp},dp={dp}, the fewest GPUs a replica fits in"
    return (
        f"no tp × pp of site {name!r}'s GPUs at dp {dp} fits: resume at the plan's split ({was.short()}), or launch "
        "the job anew on more or bigger GPUs"
    )


def said(old: dict[str, Any], new: dict[str, Any]) -> str:
    """What a resume says of the change: "trainer on site t: tp2 pp1 dp1 (2 ranks) → tp1 pp2 dp1 (2 ranks)"."""
    return (
        f"trainer on site {new['trainer']['site']}: {trainer_parallel(old).short()} ({old['trainer']['ranks']} "
        f"ranks) → {trainer_parallel(new).short()} ({new['trainer']['ranks']} ranks)"
    )


def predicted_iteration(old: dict[str, Any], new: dict[str, Any], *, mode: str) -> dict[str, Any] | None:
    """The plan's predicted iteration time in the job's pipeline `mode` at the old split and at the new one (its
    planner section's: None where the new split's was not redone, `_repriced`), as `launch --resume --trainer-split
    --dry-run -o json` shows it; None where the plan has no prediction (no planner section)."""
    was = old.get("planner", {}).get("predicted", {}).get("iteration_s", {}).get(mode)
    if was is None:
        return None
    now = new.get("planner", {}).get("predicted", {}).get("iteration_s", {}).get(mode)
    return {"mode": mode, "was_s": was, "now_s": now}


def predicted_said(predicted: dict[str, Any]) -> str:
    """`predicted_iteration`'s figures in the dry run's line: "predicted iteration (async) 25.5 s → 25.3 s"."""
    now = (
        "not predicted (plan.json's figures are dropped)"
        if predicted["now_s"] is None
        else f"{predicted['now_s']:.1f} s"
    )
    return f"predicted iteration ({predicted['mode']}) {predicted['was_s']:.1f} s → {now}"
