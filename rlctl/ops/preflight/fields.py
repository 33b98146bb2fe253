"""Preflight of fields that would be ignored: those the job's other choices leave unread (`unread_field_problems`),
those only `rlctl plan` reads (`PLANNING_ONLY`), and fields counted in iterations whose effect comes after the
job's end (warnings: `warn_past_the_end`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from typing import Any

from rlctl.config.job import Job
from rlctl.config.task import DatasetTask
from rlctl.ops.preflight.base import Problem
from rlctl.ops.preflight.sites import job_sites
from rlctl.planner.plan import searches_shared_site

log = logging.getLogger(__name__)


# fields only `rlctl plan` reads: (job section, field, what `rlctl plan` uses it for, why launch ignores it)
PLANNING_ONLY = (
    (
        "rollout",
        "long_tail_fraction",
        "the long-tail units of its simulated dispatch",
        "launch dispatches over every unit alike",
    ),
    ("planning", "dispatch_rule", "the cost model of its simulated dispatch", "launch dispatches without it"),
)


def warn_past_the_end(job: Job, *, edited: Collection[str] | None = None) -> None:
    """Warnings (not refusals: `launch --iterations N` shortens a job for a smoke test, and `launch --resume
    --iterations` lengthens it) for fields counted in iterations whose effect the job ends before, each read as if
    it were not set (a typo's extra zero passed unsaid):
    - delta sync's `anchor_every` more than the job's iterations: no version is that far from the first full copy,
      so no anchor is ever sent;
    - `checkpoint.auto_resume` with `checkpoint.every_iterations` at or past the job's iterations: the only
      checkpoint is the last (`checkpoint.choose.checkpoints_at`), so no failed run has one to be resumed from;
    - `algorithm.lr_decay` linear or cosine with `lr_warmup_iterations` at least the job's iterations − 1: the decay
      starts after the warm-up at the full rate (`rlctl.rl.schedule.StepLr`: the first step after it is at lr), so
      no step decays (lr_decay and min_lr_ratio change nothing). Not in a job of one iteration (nothing to decay);
    - `rebalance.auto` where the larger of `window_iterations` and `cooldown_iterations` is at least the job's
      iterations: the rule decides once it has measured that many (`rlctl.agents.rebalance`), after the last
      iteration at the earliest, so it adds no unit that generates for the job.
    `edited`: a resume's top-level fields edited since its launch: only a warning of one of them (or of `iterations`)
    is said, versus each again on every resume after any edit (the job ran with the rest); None: every warning."""
    spec, iterations = job.spec, job.spec.iterations

    def said(field: str) -> bool:
        return edited is None or field in edited or "iterations" in edited

    sync, ckpt, algo, rebalance = spec.weight_sync, spec.checkpoint, spec.algorithm, spec.rebalance
    if (
        sync.mode == "delta"
        and sync.anchor_every is not None
        and sync.anchor_every > iterations
        and said("weight_sync")
    ):
        log.warning(
            "%s: weight_sync.anchor_every: %d is more than the job's %d iterations: the job ends before its first "
            "anchor, and every version after the first full copy is a delta; use at most %d for periodic anchors, "
            "or leave it out",
            job.path,
            sync.anchor_every,
            iterations,
            iterations,
        )
    # (every_iterations 0 with auto_resume is refused: `unread_field_problems`)
    if ckpt.auto_resume and ckpt.every_iterations >= iterations and said("checkpoint"):
        log.warning(
            "%s: checkpoint.auto_resume: %d resumes a failed run from a checkpoint it completed, and "
            "checkpoint.every_iterations %d is at least the job's %d iterations: its only checkpoint is the last, so "
            "no failed run is resumed; use every_iterations below %d for checkpoints to resume from, or leave "
            "auto_resume out",
            job.path,
            ckpt.auto_resume,
            ckpt.every_iterations,
            iterations,
            iterations,
        )
    last_warm = iterations - 1  # a warm-up of this many steps leaves one, at the full rate, before the job's end
    if algo.lr_decay != "constant" and iterations > 1 and algo.lr_warmup_iterations >= last_warm and said("algorithm"):
        log.warning(
            "%s: algorithm.lr_decay: %r starts after the warm-up at the full rate, and algorithm.lr_warmup_iterations "
            "%d leaves no step of the job's %d iterations to decay; use a warm-up below %d, or leave lr_decay out",
            job.path,
            algo.lr_decay,
            algo.lr_warmup_iterations,
            iterations,
            last_warm,
        )
    measured = max(rebalance.window_iterations, rebalance.cooldown_iterations)
    if rebalance.auto and measured >= iterations and said("rebalance"):
        log.warning(
            "%s: rebalance.auto: true decides once it has measured max(window_iterations, cooldown_iterations) = %d "
            "iterations, and the job has %d: it ends before the rule can add a unit; use a window and cooldown below "
            "%d, or leave auto out",
            job.path,
            measured,
            iterations,
            iterations,
        )


def unread_field_problems(job: Job) -> list[Problem]:
    """Fields the job's other choices leave unread: a value other than the default would be ignored."""
    spec, task = job.spec, job.spec.task
    wandb = "wandb" in spec.tracking.backends
    # the trainer's ranks feed their own datacenter's units; a relay and its chains are another datacenter's
    # (rlctl.weights.plan.plan_broadcast), and the planner prices it so
    dc = {name: site.datacenter for name, site in job.inventory.sites.items()}
    one_dc = all(dc[r.site] == dc[spec.placement.trainer.site] for r in spec.placement.rollout)
    cases: list[tuple[str, Any, str, bool, str]] = [
        ("weight_sync", spec.weight_sync, "anchor_every", spec.weight_sync.mode == "full", "read in mode 'delta' only"),
        (
            "weight_sync",
            spec.weight_sync,
            "chains_per_datacenter",
            one_dc,
            f"read when a rollout site is outside the trainer's datacenter {dc[spec.placement.trainer.site]!r} only "
            "(its relay feeds that many chains; the trainer's ranks feed their own datacenter's units)",
        ),
        ("tracking", spec.tracking, "project", not wandb, "read with the wandb backend only"),
        ("tracking", spec.tracking, "mode", not wandb, "read with the wandb backend only"),
        (
            "trainer",
            spec.trainer,
            "activation_checkpointing",
            spec.trainer.backend == "megatron",
            "the 'torch' backend's (the megatron backend does not recompute activations)",
        ),
        (  # ('fsdp' there is refused by `sharding_problems`, saying what megatron splits by)
            "trainer",
            spec.trainer,
            "shard",
            spec.trainer.backend == "megatron" and spec.trainer.shard == "none",
            "the 'torch' backend's (megatron splits by tensor/pipeline parallel and never shards a replica's state "
            "over its dp ranks: 'none' is what it does anyway)",
        ),
        (
            "checkpoint",
            spec.checkpoint,
            "auto_resume",
            spec.checkpoint.every_iterations == 0,
            "read when checkpoint.every_iterations > 0 only (a failed run is resumed past a checkpoint it completed; "
            "0 writes one only at the end)",
        ),
        (
            "rebalance",
            spec.rebalance,
            "cooldown_iterations",
            not spec.rebalance.auto,
            "read with rebalance.auto: true only (the wait after a unit is added before the rule decides again)",
        ),
    ]
    # decoupled and tis clip π_θ / π_prox, and π_prox is the policy being trained (one optimizer step per iteration):
    # the ratio is 1 in value, inside any clip (rlctl.rl.grpo.policy_loss), so no clip_eps changes the gradient
    algo = spec.algorithm
    clip_unread = (
        f"read with algorithm.off_policy 'clip' only (under {algo.off_policy!r} the clipped ratio is π_θ / π_prox, "
        "1 with one optimizer step per iteration: no clip binds)"
    )
    for name in ("clip_eps", "clip_eps_high"):
        cases.append(("algorithm", algo, name, algo.off_policy != "clip", clip_unread))
    # an agent listens on its site's network.listen_host, else on the job's (rlctl.agents.listen)
    sites = job_sites(job)
    cases.append(
        (
            "transport",
            spec.transport,
            "listen_host",
            all(job.inventory.sites[s].network.listen_host for s in sites),
            "read for a site without network.listen_host only (every site of this job sets its own: "
            f"{', '.join(sites)})",
        )
    )
    # in sync and stream modes (η = 0) a round's prompts are made once the previous iteration is trained, so on a
    # unit no iteration's generation runs beside another's (no group barrier holds one back: rlctl.engines.embedded)
    # and a version arrives when only an in-run evaluation's may run (rlctl.agents.evaluation)
    # (async with staleness 0 too: the controller creates no round ahead of the trainer, `CoreConfig.rounds_ahead`)
    rollout, serial = spec.rollout, spec.pipeline.eta == 0
    evaluating = bool(spec.evaluation.heldout_prompts) and spec.evaluation.every_iterations > 0
    if spec.pipeline.mode == "async":
        where, modes = "pipeline.mode 'async' with staleness > 0", "at staleness 0"
    else:
        where, modes = "pipeline.mode 'async'", "in sync and stream modes"
    barrier = (
        f"read in {where} only ({modes} a unit runs one iteration's generations at a time: none waits behind another's)"
    )
    cases.append(("rollout", rollout, "group_barrier", serial and rollout.engine == "embedded", barrier))
    on_new = (
        f"read in {where}, or with an in-run evaluation (evaluation.every_iterations > 0), only ({modes} a version "
        "arrives when no iteration's generation runs)"
    )
    refused_above = rollout.engine == "embedded" and rollout.on_new_weights == "recompute"
    cases.append(("rollout", rollout, "on_new_weights", serial and not evaluating and not refused_above, on_new))
    # the controller's store of partial generations is filled by a unit's reports and by the work it gives back to
    # migrate (rlctl.agents.unitloss `partial`, rlctl.agents.core `withdrawn`); nothing else
    fills = rollout.partial_report_s or rollout.partial_report_steps or rollout.migrate
    store = (
        "read when units report their running generations (rollout.partial_report_s or partial_report_steps > 0) or "
        "give work back (rollout.migrate: true) only (nothing else fills the store it bounds)"
    )
    cases.append(("rollout", rollout, "partial_store_mb", not fills, store))
    # the planner reads `planning` to choose the counts that are auto; with every count fixed the plan launch writes is
    # the same under every rule and ε (the plans it compares hold the same GPUs). Of the rules ε is fewest_gpus', and
    # seeds the simulated search of a shared site's split (`searches_shared_site`); else only `rlctl plan`'s printed
    # fewest_gpus alternative reads it
    planning, rule = spec.planning, spec.planning.rule
    fixed = "read when a GPU count in placement is 'auto' only (every count here is fixed: the planner chooses none)"
    eps_unread = rule != "fewest_gpus" and not searches_shared_site(spec)
    eps_why = (
        f"read under planning.rule 'fewest_gpus' only here (under {rule!r} only `rlctl plan`'s printed fewest_gpus "
        "alternative reads it)"
    )
    auto = spec.placement.any_auto
    cases.append(("planning", planning, "rule", not auto, fixed))
    cases.append(("planning", planning, "epsilon", not auto or eps_unread, fixed if not auto else eps_why))
    if isinstance(task, DatasetTask):
        why = "read when task.reward_workers > 0 only (0 scores in the caller's thread, with no timeout)"
        cases.append(("task", task, "reward_timeout_s", task.reward_workers == 0, why))
        cases.append(("task", task, "reward_load_timeout_s", task.reward_workers == 0, why))
        # a reward scored in the caller's thread is in when its sample is: none is ever late (rlctl.rl.reward_pool)
        stall = (
            "read when task.reward_workers > 0 only (0 scores each sample in the caller's thread as it arrives: "
            "no reward is late)"
        )
        cases.append(("task", task, "reward_stall_s", task.reward_workers == 0, stall))
        cases.append(("task", task, "shuffle_seed", not task.shuffle, "read when task.shuffle is true only"))
    out = []
    for section, config, name, unread, why in cases:
        value, default = getattr(config, name), type(config).model_fields[name].default
        if unread and value != default:
            out.append(Problem(f"{section}.{name}", f"{_yaml(value)}: {why}; remove it (default {_yaml(default)})"))
    return out


def _yaml(value: Any) -> str:
    """A job field's value as the job file spells it: true, false, null (Python's True, False, None), else repr."""
    return json.dumps(value) if value is None or isinstance(value, bool) else repr(value)


def planning_only_problems(job: Job) -> list[Problem]:
    """Fields only the planner reads: they shape `rlctl plan`'s simulated dispatch (its predicted times), not
    the allocation launch runs, and the controller's dispatch (rlctl.agents.admission: every queued sample to a
    live unit, balanced by predicted tokens) reads neither; a value other than the default would be ignored."""
    out = []
    for section, name, what, why in PLANNING_ONLY:
        value = getattr(getattr(job.spec, section), name)
        default = type(getattr(job.spec, section)).model_fields[name].default
        if value != default:
            out.append(
                Problem(
                    f"{section}.{name}",
                    f"{_yaml(value)}: only `rlctl plan` reads it ({what}); {why}: remove it (default {_yaml(default)})",
                )
            )
    return out
