"""`make_plan(job, profile)`: allocation (Alg. 1), configs, dispatch (Alg. 2), simulated times, cost, δ'.

    profile ─▶ stage curves per site ─▶ Algorithm 1 (paper rule and fewest-GPUs-within-ε)
                                              │ chosen allocation (`simulated`, an async job: on one shared site
                                              │ the split the simulator below finds fastest, `search_min`; across
                                              │ datacenters each site's fewest GPUs within SAME_WITHIN of all of
                                              │ them, `search_first`)
                                              ▼
    workload sample ─▶ simulator: generation per dispatch policy, pipeline per mode ─▶ predicted times
                                              ▼
                              rebalance δ', cost per iteration and per 1k samples

The result is one plain dict (the JSON of `rlctl plan -o json`); `view.py` renders it. This module holds the
flow and the dict's assembly; its parts: `inputs.py` (options, length model, the checked profile, training
passes), `placement.py` (host order, the trainer's curve), `search.py` (Algorithm 1 and the simulated searches),
`predict.py` (one allocation simulated), `dispatchreport.py`, `weightsync.py`, `rebalance.py`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import fields, replace
from typing import Any

import numpy as np

from rlctl.config.job import Job, JobFile
from rlctl.devices import kind_for
from rlctl.errors import ConfigError, PlanError
from rlctl.models.catalog import ModelArch
from rlctl.planner import alloc
from rlctl.planner.context import context_refusal
from rlctl.planner.costs import DecodeCost, TrainWorkload
from rlctl.planner.curves import GenCurve, TrainCurve, gen_curve
from rlctl.planner.inputs import (
    PlanOptions,
    host_order_tp,
    length_model,
    profile_for,
    site_for_engine,
    train_cost,
    trainer_tp_classes,
    with_trainer_tps,
)
from rlctl.planner.placement import rollout_hosts, trainer_curve
from rlctl.planner.predict import SimCache, simulate_modes
from rlctl.planner.rebalance import free_gpus_per_site, rebalance_advice, room_for_unit
from rlctl.planner.search import (
    Stages,
    allocate,
    fixed_total,
    mask_fixed,
    simulated_async_s,
    simulated_cross,
    simulated_split,
    units_for,
)
from rlctl.planner.sim import (
    Unit,
)
from rlctl.planner.split import shard_rule
from rlctl.planner.workload import LengthModel
from rlctl.profiler.profile import ProfileFile
from rlctl.profiler.traincost import lora_refusal

log = logging.getLogger(__name__)


def make_plan(
    job: Job, profile: ProfileFile | None = None, options: PlanOptions | None = None, *, profile_file: str = "profile"
) -> dict[str, Any]:
    opts = options or PlanOptions()
    if (refusal := context_refusal(job)) is not None:  # check's line (its `context_problems`), said once there
        raise ConfigError(str(job.path), *refusal)
    adapters = job.spec.trainer.lora  # (the model read for them alone, as `job_passes` reads it)
    if adapters is not None and (why := lora_refusal(job.spec.model.arch, adapters)) is not None:  # check's line too
        raise ConfigError(str(job.path), "trainer.lora.target_modules", why)
    prof = profile_for(job, profile, profile_file=profile_file, trainer=opts.trainer)
    classes = trainer_tp_classes(job, prof) if opts.trainer_order_tp is None else []
    if len(classes) <= 1:
        order = opts.trainer_order_tp or max(classes[0] if classes else [1])
        return _plan(job, prof, replace(opts, trainer_order_tp=order), profile_file=profile_file)
    # the planner chooses the trainer's tp and its site's hosts are not all as large as every tp: a split's passed-
    # over hosts are the rollout's (first in its order) at that split's own tp, as the launch places them, so each
    # class of tps giving one host order is planned on its own, and the fastest plan of them is the plan
    t_site = job.spec.placement.trainer.site
    plans: list[dict[str, Any]] = []
    failed: list[PlanError] = []
    for tps in classes:
        sub = replace(opts, trainer_order_tp=max(tps))
        try:
            plans.append(_plan(job, with_trainer_tps(prof, t_site, tps), sub, profile_file=profile_file))
        except PlanError as e:
            failed.append(e)
            plans.append({"error": str(e)})
    done = [p for p in plans if "error" not in p]
    if not done:
        raise failed[0]
    best = best_plan(job, done)
    best["trainer_tp_classes"] = [
        {
            "tps": tps,
            "chosen": p is best,
            **(
                {"error": p["error"]}
                if "error" in p
                else {
                    "iteration_s": p["predicted"]["iteration_s"][job.spec.pipeline.mode],
                    "gpus_used": sum(a["gpus_used"] for a in p["allocation"]),
                }
            ),
        }
        for tps, p in zip(classes, plans, strict=True)
    ]
    return best


def searches_shared_site(spec: JobFile) -> bool:
    """Whether the plan is the job simulator's search of the split of a site the trainer shares with rollout
    (`simulated_split`), which starts from Algorithm 1's split and its fewest-GPUs alternative (`planning.epsilon`)
    among others: rule simulated, async mode, the rollout count of the trainer's site auto."""
    t_site = spec.placement.trainer.site
    shared = [r for r in spec.placement.rollout if r.site == t_site]
    return spec.planning.rule == "simulated" and spec.pipeline.mode == "async" and any(r.gpus == "auto" for r in shared)


def best_plan(job: Job, plans: list[dict[str, Any]]) -> dict[str, Any]:
    """Of plans of the same job (one per trainer tp class), the fastest iteration in the job's mode, of equal ones
    the fewest GPUs; under `planning.rule: fewest_gpus` the fewest GPUs within ε of the fastest."""
    mode = job.spec.pipeline.mode

    def key(p: dict[str, Any]) -> tuple[float, int]:
        return float(p["predicted"]["iteration_s"][mode]), sum(int(a["gpus_used"]) for a in p["allocation"])

    fastest = min(key(p)[0] for p in plans)
    # with every count fixed the plans hold the same GPUs (the trainer's ranks, the rollout's counts): none is fewer
    if job.spec.planning.rule == "fewest_gpus" and job.spec.placement.any_auto:
        near = [p for p in plans if key(p)[0] <= fastest * (1 + job.spec.planning.epsilon)]
        return min(near, key=lambda p: (key(p)[1], key(p)[0]))
    return min(plans, key=key)


def idle_gpus(gpus: int, tp: int) -> str:
    """What a fixed rollout count that is no multiple of its `rollout.tensor_parallel` leaves idle, and the counts
    near it to use (0 GPUs is no count)."""
    left = gpus % tp
    use = " or ".join(str(n) for n in (gpus - left, gpus - left + tp) if n > 0)
    return (
        f"{gpus} is not a multiple of rollout.tensor_parallel {tp}: {gpus // tp} unit(s) and {left} GPU(s) idle; "
        f"use {use}"
    )


def _plan(job: Job, prof: ProfileFile, opts: PlanOptions, *, profile_file: str) -> dict[str, Any]:
    """`make_plan` with the rollout's host order at `opts.trainer_order_tp`."""
    spec = job.spec
    order_tp = host_order_tp(job, opts)
    arch = prof.model.arch
    inv = job.inventory
    lm = length_model(job)
    samples = spec.batch.samples_per_iteration
    plan_lengths = lm.quantiles(samples)
    tokens = float(plan_lengths.sum() + samples * lm.prompt_tokens)
    tcost = train_cost(job, prof, opts.trainer)
    tw = train_workload(job, arch, tcost, tokens=tokens)

    t_site = spec.placement.trainer.site
    t_fixed = None if spec.placement.trainer.gpus == "auto" else int(spec.placement.trainer.gpus)
    r_sites = [r.site for r in spec.placement.rollout]
    r_fixed = {r.site: (None if r.gpus == "auto" else int(r.gpus)) for r in spec.placement.rollout}
    shared = t_site in r_sites
    t_total = inv.sites[t_site].total_gpus
    tcurve, t_slots = trainer_curve(job, prof, tw, t_fixed=t_fixed, profile_file=profile_file, order_tp=order_tp)
    # the trainer's GPU slots (`hostfill.trainer_slots`): its ranks, and a leftover its tp groups pass over
    n_train = t_slots if t_slots is not None else t_total
    train_s = mask_fixed(tcurve.seconds, t_slots)
    budgets: dict[str, int] = {s: inv.sites[s].total_gpus if (f := r_fixed[s]) is None else f for s in r_sites}
    if shared:  # x + y ≤ n on the shared site; both fixed → n is their sum
        # a fixed trainer's slots are chosen with the rollout's: a split that passes over more leftovers takes
        # GPUs the rollout could use. Every point of the curve holds exactly the fixed ranks (`trainer_curve`),
        # so Algorithm 1 weighs the splits' times and slots against generation as it does an `auto` trainer's;
        # beside a fixed rollout count, the fastest split that fits what it leaves
        fixed_x = r_fixed[t_site]
        n_shared = t_total
        if t_slots is not None:
            train_s = tcurve.seconds
            fewest = int(np.argmax(np.isfinite(tcurve.seconds)))
            if fixed_x is not None:
                if fewest + fixed_x > t_total:
                    passed = f" (its tp groups take {fewest} slots of the hosts)" if fewest != t_fixed else ""
                    raise ConfigError(
                        str(job.path),
                        "placement",
                        f"site {t_site!r}: trainer {t_fixed} GPU(s){passed} + rollout {fixed_x} need "
                        f"{fewest + fixed_x}; the inventory gives it {t_total}",
                        hint="lower the GPU counts in the job's placement, or add nodes to the site",
                    )
                t_slots = int(np.argmin(tcurve.seconds[: t_total - fixed_x + 1]))
                n_shared = t_slots + fixed_x
                train_s = mask_fixed(tcurve.seconds, t_slots)
        budgets[t_site] = n_train = n_shared
    gcurves: dict[str, GenCurve] = {}
    for s in r_sites:
        r_prof = site_for_engine(prof.sites[s], spec.rollout.engine, name=s, profile_file=profile_file)
        gcurves[s] = gen_curve(
            r_prof,
            plan_lengths,
            prompt_tokens=lm.prompt_tokens,
            engine_max_batch=spec.rollout.max_batch_size,
            max_gpus=budgets[s],
            tp=spec.rollout.tensor_parallel,
            host_gpus=rollout_hosts(inv.sites[s], shared=s == t_site, trainer_tp=order_tp),
        )
        priced = sorted({e.tp for e in r_prof.generation})
        tps = [t for t in priced if t <= max(budgets[s], 1)]
        tp = spec.rollout.tensor_parallel
        if not gcurves[s].costs and tps and tp is not None and tp not in priced:  # it fits, at other tps
            raise ConfigError(
                str(job.path),
                "rollout.tensor_parallel",
                f"{tp}: the {prof.source} profile prices the units of {arch.name} on site {s!r} at tp "
                f"{', '.join(map(str, tps))} only; use one of them",
            )
        if not gcurves[s].costs and tp is not None and (fixed := r_fixed[s]) is not None and fixed < tp:
            # priced at tp, on fewer GPUs than one unit takes: the count's error (as check says it), not the tp's
            raise ConfigError(str(job.path), f"placement.rollout[{r_sites.index(s)}].gpus", idle_gpus(fixed, tp))
        if not gcurves[s].costs:
            raise PlanError(
                f"site {s!r}: model {arch.name} does not fit on {prof.sites[s].gpu} at any TP degree "
                f"≤ {prof.sites[s].gpus_per_node}",
                hint="use a larger GPU or a smaller model",
            )
    try:
        choice, alt, fill, base = allocate(
            job, gcurves, (train_s, tcurve.seconds), budgets, r_fixed, n_train, shared, t_site
        )
    except ValueError as e:
        if shared:  # each stage fits on its own (refused above otherwise), not both beside each other
            need_t, need_g = (int(np.argmax(np.isfinite(c))) for c in (train_s, gcurves[t_site].seconds))
            if t_fixed is not None or r_fixed[t_site] is not None:  # the job's count leaves the other stage too few
                if t_fixed is not None:
                    field, said = "placement.trainer.gpus", f"trainer {t_fixed} GPU(s) + a rollout unit {need_g}"
                    need = need_t + need_g  # the trainer's slots, with any its tp groups pass over
                else:
                    field = f"placement.rollout[{r_sites.index(t_site)}].gpus"
                    said = f"rollout {r_fixed[t_site]} GPU(s) + the trainer {need_t} at least"
                    need = int(r_fixed[t_site] or 0) + need_t
                raise ConfigError(
                    str(job.path),
                    field,
                    f"site {t_site!r}: {said} need {need}; the inventory gives it {t_total}",
                    hint="lower the GPU counts in the job's placement, or add nodes to the site",
                ) from e
            raise PlanError(
                f"site {t_site!r}: its {budgets[t_site]} GPU(s) cannot hold both stages of {arch.name}: the trainer "
                f"needs {need_t} at least and a rollout unit {need_g}",
                hint="add GPUs to the site, or place the rollout on another site",
            ) from e
        raise PlanError(f"{spec.name}: {e}", hint="check the GPU counts in placement") from e
    rule = spec.planning.rule
    search: dict[str, Any] | None = None
    search_rollout = any(f is None for f in r_fixed.values())  # the fixed sites hold their counts throughout
    stages = Stages(job, lm, gcurves, tcurve, tw, budgets, fill, opts, SimCache())
    # a fixed trainer count searches the same splits: every point of its curve holds exactly its ranks
    # (`trainer_curve`), the fastest within n − x is the split it runs beside x rollout GPUs
    if searches_shared_site(spec):
        chosen, search = simulated_split(
            stages, t_site=t_site, streamed_fraction=tcost["streamed_fraction"], seeds=(choice.x, base.x, alt.x)
        )
    elif rule == "simulated" and spec.pipeline.mode == "async" and not shared and (search_rollout or t_fixed is None):
        chosen, search = simulated_cross(
            stages,
            n_train=n_train,
            search_rollout=search_rollout,
            search_trainer=t_fixed is None,
            min_rollout=fixed_total(r_fixed, None),
            streamed_fraction=tcost["streamed_fraction"],
        )
    else:
        chosen = alt if rule == "fewest_gpus" else choice
    per_site = alloc.split_combined(chosen.x, fill)
    out = _assemble(
        job,
        prof,
        lm,
        gcurves,
        tcurve,
        chosen,
        choice,
        alt,
        dict(zip(r_sites, per_site, strict=True)),
        tw,
        opts,
        streamed_fraction=tcost["streamed_fraction"],
        cache=stages.cache,
    )
    out["training"] = tcost
    out["rule_applied"] = "simulated" if search is not None else ("paper" if rule == "simulated" else rule)
    if search is not None:
        out["search"] = search
    out["baseline"] = {
        "kind": "even_split" if shared else "full_allocation",
        "rollout_gpus": base.x,
        "trainer_gpus": base.y,
        "t_gen_s": base.t_gen_s,
        "t_train_s": base.t_train_s,
        "iteration_s": base.iteration_s,
    }
    curves = out.pop("stage_curves", None)
    out = _json_safe(out)
    if curves is not None:  # only finite points are listed: no conversion needed (it is the bulk of a big plan)
        out["stage_curves"] = curves
    return out


def train_workload(job: Job, arch: ModelArch, tcost: dict[str, Any], *, tokens: float) -> TrainWorkload:
    """What an iteration's training is priced on (`tokens` trained, `tcost`: `inputs.train_cost`; the cuts of a step
    as the learner makes and pads them, `costs.step_cuts`, of rows at the job's length quantiles), with the job's
    `split.shard_rule` that decides FSDP2 at a layout as the launch decides it (`costs.trainer_layout`): among it the
    gradients summed over dp (`costs.dp_reduced_bytes`), the trained models', or with LoRA the adapters' alone, in
    fp32 as every backend holds and reduces them, and a rank's cut's activations (`profiler.actmem`)."""
    spec = job.spec
    batch = spec.batch
    cpu = kind_for(job.inventory.sites[spec.placement.trainer.site].spec.name) != "cuda"  # (the torch trainer: fp32)
    rule = shard_rule(spec, arch, mini_batches=tcost["mini_batches"], cpu=cpu)
    # one step's rows' lengths: the learner cuts them by rows and padded tokens and each rank pads its share to its
    # longest (the busiest share sets a cut's time, `costs.train_compute_s`); until 2026-12-08 they were taken only
    # with a token budget, for the cuts' count
    lm = length_model(job)
    step = math.ceil(batch.samples_per_iteration / tcost["mini_batches"])
    rows = tuple((lm.quantiles(step) + lm.prompt_tokens).tolist())
    return TrainWorkload(
        tokens,
        batch.samples_per_iteration,
        batch.train_micro_batch_samples,
        pass_scale=tcost["scale_of_profile"],
        mini_batches=tcost["mini_batches"],
        optimizer_steps=tcost["optimizer_steps"],
        micro_batch_tokens=batch.train_micro_batch_tokens,
        row_tokens=rows,
        **{f.name: getattr(rule, f.name) for f in fields(rule)},  # (shallow: its Activations stay one object)
    )


def _json_safe(v: Any) -> Any:
    """inf / nan → None, numpy scalars → Python, so the plan is strict JSON."""
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json_safe(x) for x in v]
    if isinstance(v, float | np.floating):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, np.integer):
        return int(v)
    return v


def _assemble(
    job: Job,
    prof: ProfileFile,
    lm: LengthModel,
    gcurves: dict[str, GenCurve],
    tcurve: TrainCurve,
    chosen: alloc.Choice,
    paper: alloc.Choice,
    fewest: alloc.Choice,
    per_site: dict[str, int],
    tw: TrainWorkload,
    opts: PlanOptions,
    *,
    streamed_fraction: float,
    cache: SimCache | None = None,
) -> dict[str, Any]:
    spec = job.spec
    inv = job.inventory
    t_site = spec.placement.trainer.site
    tcfg = tcurve.configs[chosen.y]
    if tcfg is None:
        raise PlanError("no feasible trainer configuration")
    # the FSDP2 its time was priced with, which the launch runs (`costs.trainer_layout`, `split.launch_layout`)
    once = tcfg.layout.reduce_per_step  # its learner holds its last cut to the flush (`simulate_modes`)
    allocation: list[dict[str, Any]] = [
        {
            "site": t_site,
            "role": "trainer",
            "gpu": prof.sites[t_site].gpu,
            "gpus_used": tcfg.gpus,
            "gpus_available": inv.sites[t_site].total_gpus,
            # FSDP2 where the torch trainer shards its replica (the launch's `rlctl.ops.counts.plan_counts` too)
            "config": tcfg.as_dict() | tcfg.layout.config(),
            "instances": 1,
            "predicted_s": float(tcurve.seconds[chosen.y]),
        }
    ]
    asked = {r.site: r.gpus for r in spec.placement.rollout if r.gpus != "auto"}
    for s, x in per_site.items():
        cfg = gcurves[s].configs[x] if x > 0 else None
        allocation.append(
            {
                "site": s,
                "role": "rollout",
                **({"gpus_asked": int(asked[s])} if s in asked else {}),  # the job's count (units of tp: some idle)
                "gpu": prof.sites[s].gpu,
                "gpus_used": cfg.gpus if cfg else 0,
                "gpus_available": inv.sites[s].total_gpus,
                "config": {"tp": cfg.tp, "dp": cfg.instances} if cfg else None,
                "instances": cfg.instances if cfg else 0,
                "predicted_s": float(gcurves[s].seconds[x]) if x else None,
                "max_batch": gcurves[s].costs[cfg.tp].max_batch if cfg else None,
                "decode": _decode_json(gcurves[s].costs[cfg.tp]) if cfg else None,
            }
        )
    units = units_for(gcurves, per_site)
    if not units:
        raise PlanError("the allocation has no rollout instance")
    train_s = float(tcurve.seconds[chosen.y])
    at_step_s = train_s * (1 - streamed_fraction)
    sim = simulate_modes(
        job, lm, units, tw, (train_s, at_step_s), per_site, opts, cache=cache, reduce_per_step=once, dp=tcfg.dp
    )

    def one_more(site: str, tp: int) -> float:  # the async iteration with one more unit of `tp` GPUs on `site`
        more = per_site | {site: per_site[site] + tp}
        plus = [*units, Unit(site, gcurves[site].costs[tp])]
        return simulated_async_s(
            job,
            lm,
            plus,
            tw,
            train_s,
            more,
            opts,
            streamed_fraction=streamed_fraction,
            cache=cache,
            reduce_per_step=once,
            dp=tcfg.dp,
        )

    iteration_s = sim["predicted"]["iteration_s"][spec.pipeline.mode]
    used = [(a["gpus_used"], inv.sites[a["site"]].gpu_cost_per_hour) for a in allocation]
    gpu_h = sum(g for g, _ in used) * iteration_s / 3600
    cost_u = sum(g * c for g, c in used) * iteration_s / 3600
    per_k = 1000 / tw.samples
    out: dict[str, Any] = {
        "job": spec.name,
        "model": prof.model.name,
        "profile_source": prof.source,
        "mode": spec.pipeline.mode,
        "samples_per_iteration": tw.samples,
        "rule": spec.planning.rule,
        "allocation": allocation,
        "alternatives": {
            name: {
                "rollout_gpus": c.x,
                "trainer_gpus": c.y,
                "t_gen_s": c.t_gen_s,
                "t_train_s": c.t_train_s,
                "iteration_s": c.iteration_s,
            }
            for name, c in (("paper", paper), ("fewest_gpus", fewest))
        },
        **sim,
        "rebalance": rebalance_advice(
            gcurves,
            per_site,
            free_gpus_per_site(allocation, inv),
            room_for_unit(allocation, inv, t_site, order_tp=host_order_tp(job, opts)),
            sim["predicted"],
            one_more=one_more if spec.pipeline.eta > 0 else None,  # as the controller's rule: at η 0 the stage times
        )
        | {"auto": spec.rebalance.auto},
        "cost": {
            "gpu_hours_per_iteration": gpu_h,
            "cost_units_per_iteration": cost_u,
            "gpu_hours_per_1k_samples": gpu_h * per_k,
            "cost_units_per_1k_samples": cost_u * per_k,
        },
    }
    if opts.curves_in_output:
        out["stage_curves"] = {
            "generation": {
                s: [
                    {"gpus": x, "seconds": float(c.seconds[x]), "tp": cfg.tp, "instances": cfg.instances}
                    for x, cfg in enumerate(c.configs)
                    if cfg is not None
                ]
                for s, c in gcurves.items()
            },
            "training": {
                t_site: [
                    {"gpus": y, "seconds": float(tcurve.seconds[y]), **cfg.as_dict()}
                    for y, cfg in enumerate(tcurve.configs)
                    if cfg is not None
                ]
            },
        }
    return out


def _decode_json(cost: DecodeCost) -> dict[str, Any]:
    """A unit's decode cost as plan.json keeps it for the controller's migration (`rlctl.agents.migration.Cost`):
    seconds per decode step at batch 1 … max_batch, and per prefilled token."""
    return {
        "ptl_s": [round(float(x), 7) for x in cost.ptl_s[1 : cost.max_batch + 1]],
        "prefill_s_per_token": round(cost.prefill_s_per_token, 9),
    }
