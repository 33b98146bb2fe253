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

The result is one plain dict (the JSON of `rlctl plan -o json`); `view.py` renders it.
"""

from __future__ import annotations

import logging
import math
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from rlctl.config.hostfill import PLACEMENT_HINT, placement_error, rollout_host_order, trainer_slots
from rlctl.config.inventory import Inventory, Link, Site
from rlctl.config.job import DatasetTask, Job, JobFile, LengthsTask
from rlctl.errors import ConfigError, PlanError
from rlctl.launch.backends import kind_of
from rlctl.planner import alloc
from rlctl.planner.costs import DecodeCost, TrainWorkload, fsdp_gathered_bytes, shards_state
from rlctl.planner.curves import GenCurve, TrainCurve, gen_curve, train_stage_curve, units_that_fit
from rlctl.planner.dispatch import Rule, SkewSplit, fixed_split
from rlctl.planner.engine import Barrier
from rlctl.planner.sim import (
    DispatchConfig,
    Estimate,
    GenResult,
    Unit,
    simulate_generation,
    simulate_split,
    site_split,
)
from rlctl.planner.simjob import MODES, EngineSpec, IterationWork, Mode, UnitShare, simulate_job, weight_transfer_s
from rlctl.planner.split import shard_trainer, split_refusal
from rlctl.planner.workload import LengthModel, noise_for_recall, predict_lengths
from rlctl.profiler.analytical import TP_DEGREES, analytical_profile, training_entry
from rlctl.profiler.profile import ProfileFile, SiteProfile
from rlctl.profiler.traincost import (
    TrainingPasses,
    flops_per_token,
    forward_units,
    passes_for,
    streamed_units,
    trained_models,
)

log = logging.getLogger(__name__)

DEFAULT_RECALL = 0.87  # StreamRL Table 4, 7B ranker, top 20 %
DELTA_FRACTION = 0.1  # bytes of a lossless delta relative to full weights (DESIGN §7), between anchors
MIN_SIM_ITERATIONS = 6  # iterations simulated per mode (batches repeat when `sim_iterations` is less), 1 warm-up


@dataclass(frozen=True)
class PlanOptions:
    sim_iterations: int = 4
    ranker_recall: float = DEFAULT_RECALL
    curves_in_output: bool = True
    # how the trainer runs the job's algorithm (epochs, mini-batches, recomputation, an old log-prob
    # pass); default rlctl's trainer. `reference` always comes from the job (kl_coef > 0).
    trainer: TrainingPasses = field(default_factory=TrainingPasses)
    # the trainer tp whose passed-over hosts the rollout fills first on a site they share
    # (`hostfill.rollout_host_order`); None: the job's trainer.tensor_parallel, else `make_plan` plans each tp class
    trainer_order_tp: int | None = None


def length_model(job: Job) -> LengthModel:
    """The output lengths the plan sizes for. Lengths that grow (`growth_per_iteration`) are taken at the job's
    middle iteration: one allocation serves the whole run, and with linear growth that is its mean workload."""
    task = job.spec.task
    middle = (job.spec.iterations - 1) / 2
    if isinstance(task, LengthsTask):
        return LengthModel.of(task).at_iteration(middle)
    if isinstance(task, DatasetTask):
        # a prior until the job measures its own lengths (the controller's ranker refits online): outputs
        # lognormal around a quarter of the cap, prompts at half their limit
        cap = task.max_output_tokens
        return LengthModel(max(1.0, cap / 4), 0.8, cap, max(1, task.max_prompt_tokens // 2))
    prompt = (task.num_digits_min + task.num_digits_max) // 2 + 1
    lm = LengthModel(task.median_output_tokens, task.sigma, task.max_output_tokens, prompt, task.growth_per_iteration)
    return lm.at_iteration(middle)


def profile_for(
    job: Job, profile: ProfileFile | None, *, profile_file: str = "profile", trainer: TrainingPasses | None = None
) -> ProfileFile:
    sites = {job.spec.placement.trainer.site, *(r.site for r in job.spec.placement.rollout)}
    arch = job.spec.model.arch
    if profile is None:
        inv = job.inventory.sites
        prof = analytical_profile(
            arch,
            {s: (inv[s].spec, inv[s].gpus_per_node, inv[s].gpu_cost_per_hour) for s in sorted(sites)},
            algorithm=job.spec.algorithm.kind,
            passes=passes_for(job.spec.algorithm, trainer),
        )
        return _with_job_splits(job, prof, trainer=trainer)
    if profile.algorithm != job.spec.algorithm.kind:  # the trained models, hence the memory, differ
        raise ConfigError(
            profile_file,
            "algorithm",
            f"profile is for {profile.algorithm!r}, job runs {job.spec.algorithm.kind!r}",
            hint=f"run rlctl profile --job {shlex.quote(str(job.path))}",
        )
    if profile.model.name != arch.name:
        raise ConfigError(
            profile_file,
            "model.name",
            f"profile is for {profile.model.name!r}, job trains {arch.name!r}",
            # the job's model by its own name (`--model NAME` takes only built-in names; an HF model's is its folder's)
            hint=f"run rlctl profile --job {shlex.quote(str(job.path))}",
        )
    missing = sorted(sites - set(profile.sites))
    if missing:
        raise ConfigError(
            profile_file,
            "sites",
            f"no profile for site(s) {', '.join(missing)}; has {', '.join(sorted(profile.sites))}",
            hint="profile every site the job places a role on",
        )
    for s in sorted(sites):  # a site whose GPUs the inventory has changed since: its costs are another GPU's
        have, now = profile.sites[s].gpu, job.inventory.sites[s].spec.name
        if have != now:
            raise ConfigError(
                profile_file,
                f"sites.{s}.gpu",
                f"profiled on {have!r}; the inventory ({job.inventory.origin[s]}) gives site {s!r} {now!r} now",
                hint=f"run rlctl profile --job {shlex.quote(str(job.path))}",
            )
    return profile


def _with_job_splits(job: Job, prof: ProfileFile, *, trainer: TrainingPasses | None) -> ProfileFile:
    """The roofline with entries at the trainer splits the job may run that its grid lacks (the grid's pp are powers
    of two), so a split the backend runs is priced rather than taken for one that does not fit: the job's own
    (pp 3 of a 3-layer model), or, for a megatron trainer of a fixed GPU count, every tp × pp dividing that count
    whose pp divides the layers (7 GPUs of a 28-layer model: pp 7)."""
    spec = job.spec
    t_site = spec.placement.trainer.site
    mine = prof.sites[t_site]
    have = {(e.tp, e.pp) for e in mine.training}
    gpus = spec.placement.trainer.gpus
    arch = spec.model.arch
    if (split := spec.trainer.model_split) is not None:
        splits = [split]
    elif spec.trainer.backend == "megatron" and gpus != "auto":
        per_node = job.inventory.sites[t_site].gpus_per_node
        splits = [
            (tp, pp)
            for tp in TP_DEGREES
            if tp <= per_node
            for pp in range(1, arch.layers + 1)
            if int(gpus) % (tp * pp) == 0 and split_refusal(arch, "megatron", tp=tp, pp=pp) is None
        ]
    else:
        return prof
    gpu, passes = job.inventory.sites[t_site].spec, passes_for(spec.algorithm, trainer)
    extra = [
        training_entry(arch, gpu, tp=tp, pp=pp, algorithm=spec.algorithm.kind, passes=passes)
        for tp, pp in splits
        if (tp, pp) not in have
    ]
    if not extra:
        return prof
    only = mine.model_copy(update={"training": [*mine.training, *extra]})
    return prof.model_copy(update={"sites": {**prof.sites, t_site: only}})


def _for_engine(site: SiteProfile, engine: str, *, name: str, profile_file: str) -> SiteProfile:
    """The site with the generation entries of `engine`: those measured with it, else those of any
    engine (analytical); a site measured only with another engine is refused."""
    mine = [e for e in site.generation if e.engine == engine]
    mine = mine or [e for e in site.generation if e.engine is None]
    if not mine and site.generation:
        other = sorted({e.engine or "" for e in site.generation})
        raise ConfigError(
            profile_file,
            f"sites.{name}.generation",
            f"measured with engine {', '.join(other)}; the job rolls out with {engine!r}",
            hint=f"run rlctl profile --source measured --engine {engine} (or --job with this job)",
        )
    return site.model_copy(update={"generation": mine})


def _for_backend(site: SiteProfile, backend: str, *, name: str, profile_file: str) -> SiteProfile:
    """The site as the job trains: its training entries measured with another trainer backend are refused
    (analytical entries, of no backend, serve any)."""
    other = sorted({e.backend for e in site.training if e.backend and e.backend != backend})
    if other:
        raise ConfigError(
            profile_file,
            f"sites.{name}.training",
            f"measured with trainer backend {', '.join(other)}; the job trains with {backend!r}",
            hint=f"run rlctl profile --source measured --trainer-backend {backend} (or --job with this job)",
        )
    return site


def train_cost(job: Job, prof: ProfileFile, trainer: TrainingPasses) -> dict[str, Any]:
    """The job's training passes against the profile's: scale of the profile's seconds per token, and
    the share that streams (the rest waits for the whole batch)."""
    kind = job.spec.algorithm.kind
    passes = passes_for(job.spec.algorithm, trainer)
    units = forward_units(kind, passes)
    return {
        "algorithm": kind,
        "passes": passes.model_dump(),
        "forward_units": units,
        "flops_per_token": flops_per_token(kind, passes, prof.model.params),
        "profile_passes": prof.training_passes.model_dump(),
        "scale_of_profile": units / forward_units(prof.algorithm, prof.training_passes),
        "streamed_fraction": streamed_units(kind, passes) / units,
        "optimizer_steps": passes.optimizer_steps,
        "mini_batches": passes.mini_batches,
    }


def _mask_fixed(seconds: np.ndarray, fixed: int | None) -> np.ndarray:
    """A role with a fixed GPU count may only use exactly that many."""
    if fixed is None:
        return seconds
    out = np.full_like(seconds, math.inf)
    out[fixed] = seconds[fixed]
    return out


def _rollout_hosts(site: Site, *, shared: bool, trainer_tp: int = 1) -> list[int]:
    """The GPUs of the site's hosts in the order x rollout GPUs fill them (`hostfill.rollout_host_order`, the order
    `GpuPool.take` places units in): inventory order, but from the last host on the site the trainer shares, whose
    ranks fill the first hosts (`GpuPool.take_ranks`), after the hosts too small for one of its `trainer_tp` groups."""
    gpus = [g for _, g in site.hosts]
    return rollout_host_order(gpus, shares_trainer=shared, gpus=gpus, trainer_tp=trainer_tp)


def _order_tp(job: Job, opts: PlanOptions) -> int:
    """The trainer tp the rollout's host order follows: the job's trainer.tensor_parallel, else the tp class
    `make_plan` plans (`_tp_classes`); the launch follows the plan's tp (`launch.layout.order_tp`)."""
    if opts.trainer_order_tp is not None:
        return opts.trainer_order_tp
    return (job.spec.trainer.model_split or (1, 1))[0]


def _tp_classes(job: Job, prof: ProfileFile) -> list[list[int]]:
    """The profile's trainer tps grouped by the rollout host order each gives on a site the trainer shares
    (`hostfill.rollout_host_order`: a host of fewer GPUs than tp is the rollout's first): where the planner chooses
    the tp, a split is priced with its own tp's order, as the launch places it, and `make_plan` plans each order.
    One class where the job sets trainer.tensor_parallel, the trainer has its site to itself or every host holds
    every tp's groups."""
    spec = job.spec
    t_site = spec.placement.trainer.site
    if spec.trainer.model_split is not None or t_site not in {r.site for r in spec.placement.rollout}:
        return [[(spec.trainer.model_split or (1, 1))[0]]]
    hosts = [g for _, g in job.inventory.sites[t_site].hosts]
    classes: dict[tuple[bool, ...], list[int]] = {}
    for tp in sorted({e.tp for e in prof.sites[t_site].training if e.tp <= max(hosts, default=0)}):
        classes.setdefault(tuple(g < tp for g in hosts), []).append(tp)
    return list(classes.values()) or [[1]]


def _with_trainer_tps(prof: ProfileFile, site: str, tps: list[int]) -> ProfileFile:
    """The profile with only the training entries of `site` at `tps`."""
    mine = prof.sites[site]
    only = mine.model_copy(update={"training": [e for e in mine.training if e.tp in tps]})
    return prof.model_copy(update={"sites": {**prof.sites, site: only}})


def _hosts_spanned(host_gpus: list[int], gpus: int) -> int:
    """The hosts `gpus` GPU slots fill, host by host in the order of `host_gpus` (12 GPUs of 8-GPU hosts: 2)."""
    filled = hosts = 0
    for g in host_gpus:
        if filled >= gpus:
            break
        filled, hosts = filled + g, hosts + 1
    return hosts


def _node_bytes_per_s(site: Site) -> float:
    return site.network.bandwidth_gbps * 1e9 / 8


PLACE_HINT = (
    "use a trainer GPU count whose tp groups fit the hosts, or a trainer.tensor_parallel that divides their GPUs"
)


def _trainer_curve(
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
    t_prof = _for_backend(prof.sites[t_site], backend, name=t_site, profile_file=profile_file)
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
        node_bytes_per_s=_node_bytes_per_s(inv.sites[t_site]),
        split=split,
    )
    if not np.isfinite(tcurve.seconds).any():
        tp_pp = split or ((1, 1) if backend != "megatron" else None)
        asked = f" at tp {tp_pp[0]} pp {tp_pp[1]}" if tp_pp else " at any tp × pp"
        why = (
            f"{prof.model.arch.name} training state does not fit in {t_fixed or site.total_gpus} × "
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
    if tw.shards_state and gpus == 1:
        return " (one rank holds its whole state: FSDP2 shards it over 2 or more)"
    if tw.shards_state:
        return " (FSDP2 over every trainer GPU: weights, gradients and optimizer state sharded)"
    if job.spec.trainer.backend == "megatron":
        return " (the megatron trainer has no distributed optimizer: every rank holds its tp × pp shard's whole state)"
    return " (every rank holds its whole state)"


def make_plan(
    job: Job, profile: ProfileFile | None = None, options: PlanOptions | None = None, *, profile_file: str = "profile"
) -> dict[str, Any]:
    opts = options or PlanOptions()
    prof = profile_for(job, profile, profile_file=profile_file, trainer=opts.trainer)
    classes = _tp_classes(job, prof) if opts.trainer_order_tp is None else []
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
            plans.append(_plan(job, _with_trainer_tps(prof, t_site, tps), sub, profile_file=profile_file))
        except PlanError as e:
            failed.append(e)
            plans.append({"error": str(e)})
    done = [p for p in plans if "error" not in p]
    if not done:
        raise failed[0]
    best = _best_plan(job, done)
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
    (`_simulated_split`), which starts from Algorithm 1's split and its fewest-GPUs alternative (`planning.epsilon`)
    among others: rule simulated, async mode, the rollout count of the trainer's site auto."""
    t_site = spec.placement.trainer.site
    shared = [r for r in spec.placement.rollout if r.site == t_site]
    return spec.planning.rule == "simulated" and spec.pipeline.mode == "async" and any(r.gpus == "auto" for r in shared)


def _best_plan(job: Job, plans: list[dict[str, Any]]) -> dict[str, Any]:
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
    order_tp = _order_tp(job, opts)
    arch = prof.model.arch
    inv = job.inventory
    lm = length_model(job)
    samples = spec.batch.samples_per_iteration
    plan_lengths = lm.quantiles(samples)
    tokens = float(plan_lengths.sum() + samples * lm.prompt_tokens)
    tcost = train_cost(job, prof, opts.trainer)
    tw = TrainWorkload(
        tokens,
        samples,
        spec.batch.train_micro_batch_samples,
        arch.params * 2 * trained_models(spec.algorithm.kind),
        pass_scale=tcost["scale_of_profile"],
        mini_batches=tcost["mini_batches"],
        optimizer_steps=tcost["optimizer_steps"],
        shards_state=(sharded := shards_state(spec.trainer.backend, shard=spec.trainer.shard)),
        gathered_bytes=fsdp_gathered_bytes(arch) if sharded else 0.0,
    )

    t_site = spec.placement.trainer.site
    t_fixed = None if spec.placement.trainer.gpus == "auto" else int(spec.placement.trainer.gpus)
    r_sites = [r.site for r in spec.placement.rollout]
    r_fixed = {r.site: (None if r.gpus == "auto" else int(r.gpus)) for r in spec.placement.rollout}
    shared = t_site in r_sites
    t_total = inv.sites[t_site].total_gpus
    tcurve, t_slots = _trainer_curve(job, prof, tw, t_fixed=t_fixed, profile_file=profile_file, order_tp=order_tp)
    # the trainer's GPU slots (`hostfill.trainer_slots`): its ranks, and a leftover its tp groups pass over
    n_train = t_slots if t_slots is not None else t_total
    train_s = _mask_fixed(tcurve.seconds, t_slots)
    budgets: dict[str, int] = {s: inv.sites[s].total_gpus if (f := r_fixed[s]) is None else f for s in r_sites}
    if shared:  # x + y ≤ n on the shared site; both fixed → n is their sum
        # a fixed trainer's slots are chosen with the rollout's: a split that passes over more leftovers takes
        # GPUs the rollout could use. Every point of the curve holds exactly the fixed ranks (`_trainer_curve`),
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
                train_s = _mask_fixed(tcurve.seconds, t_slots)
        budgets[t_site] = n_train = n_shared
    gcurves: dict[str, GenCurve] = {}
    for s in r_sites:
        r_prof = _for_engine(prof.sites[s], spec.rollout.engine, name=s, profile_file=profile_file)
        gcurves[s] = gen_curve(
            r_prof,
            plan_lengths,
            prompt_tokens=lm.prompt_tokens,
            engine_max_batch=spec.rollout.max_batch_size,
            max_gpus=budgets[s],
            tp=spec.rollout.tensor_parallel,
            host_gpus=_rollout_hosts(inv.sites[s], shared=s == t_site, trainer_tp=order_tp),
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
        choice, alt, fill, base = _allocate(
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
    # (`_trainer_curve`), the fastest within n − x is the split it runs beside x rollout GPUs
    if searches_shared_site(spec):
        chosen, search = _simulated_split(
            stages, t_site=t_site, streamed_fraction=tcost["streamed_fraction"], seeds=(choice.x, base.x, alt.x)
        )
    elif rule == "simulated" and spec.pipeline.mode == "async" and not shared and (search_rollout or t_fixed is None):
        chosen, search = _simulated_cross(
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


def _allocate(
    job: Job,
    gcurves: dict[str, GenCurve],
    train: tuple[np.ndarray, np.ndarray],
    budgets: dict[str, int],
    r_fixed: dict[str, int | None],
    n_train: int,
    shared: bool,
    t_site: str,
) -> tuple[alloc.Choice, alloc.Choice, np.ndarray, alloc.Choice]:
    """(paper rule, fewest GPUs within ε, rollout GPUs per site at each total (`alloc.fill_table`), baseline: even
    split or full allocation).

    `train` = (curve masked to fixed counts, unmasked curve); the baseline ignores fixed counts.
    """
    train_s, train_raw = train
    r_sites = list(gcurves)
    curves = [_mask_fixed(gcurves[s].seconds, r_fixed[s]) for s in r_sites]
    order = fill_order(job, gcurves, budgets, r_fixed, t_site if shared else None)
    # the `auto` sites the trainer does not share split what reaches them as finishes soonest: one curve of mixed
    # GPU types, filled in cost order, would put units on the cheaper site while a faster one waits
    searched = [i for i, s in enumerate(r_sites) if r_fixed[s] is None and not (shared and s == t_site)]
    sizes = [budgets[s] for s in r_sites]
    fill = alloc.fill_table([gcurves[s].seconds for s in r_sites], sizes, order, searched=searched)
    combined = alloc.combine_rollout(curves, fill)
    combined[: fixed_total(r_fixed, t_site if shared else None)] = math.inf  # every fixed site holds its count
    raw = alloc.combine_rollout([gcurves[s].seconds for s in r_sites], fill)
    m = sum(budgets.values())
    eps = job.spec.planning.epsilon
    if shared:
        others = m - budgets[t_site]
        n = budgets[t_site]
        shifted = np.full(n + 1, math.inf)
        shifted[1:] = combined[others + 1 : others + n + 1]
        c = alloc.single_dc(shifted, train_s, n)
        paper = alloc.Choice(c.x + others, c.y, c.t_gen_s, c.t_train_s)
        f = alloc.fewest_gpus(shifted, train_s, m=n, n=n, reference_s=c.iteration_s, epsilon=eps, shared=True)
        half = n // 2
        base = alloc.Choice(others + half, n - half, float(raw[others + half]), float(train_raw[n - half]))
        return paper, alloc.Choice(f.x + others, f.y, f.t_gen_s, f.t_train_s), fill, base
    paper = alloc.cross_dc(combined, train_s, m, n_train)
    full = max(float(combined[m]), float(train_s[n_train]))
    fewest = alloc.fewest_gpus(combined, train_s, m=m, n=n_train, reference_s=full, epsilon=eps)
    return paper, fewest, fill, alloc.Choice(m, n_train, float(raw[m]), float(train_raw[n_train]))


def fill_order(
    job: Job, gcurves: dict[str, GenCurve], budgets: dict[str, int], r_fixed: dict[str, int | None], shared: str | None
) -> list[int]:
    """The order rollout sites are filled in (indices into `gcurves`), so that k rollout GPUs are the first k of
    it: the sites whose count the job fixes first (each always holds all of its count), then the others, each
    group by the lowest cost per unit of work at full allocation; a site the trainer shares (`shared`) last, so
    that the count beyond the other sites is its share. The `auto` sites between split what reaches them as
    finishes soonest (`alloc.fill_table`); this order breaks their ties (the cheaper first)."""
    inv = job.inventory.sites
    r_sites = list(gcurves)
    work_cost = [inv[s].gpu_cost_per_hour * budgets[s] * float(gcurves[s].seconds[budgets[s]]) for s in r_sites]
    order = sorted(range(len(r_sites)), key=lambda i: (r_fixed[r_sites[i]] is None, work_cost[i], i))
    if shared is not None:
        order = [i for i in order if r_sites[i] != shared] + [r_sites.index(shared)]
    return order


def fixed_total(r_fixed: dict[str, int | None], shared: str | None) -> int:
    """The rollout GPUs of the sites whose count the job fixes, but for a shared site (filled last): the fewest
    rollout GPUs of a feasible allocation filled in `fill_order`."""
    return sum(f for s, f in r_fixed.items() if f is not None and s != shared)


def _units(gcurves: dict[str, GenCurve], per_site: dict[str, int]) -> list[Unit]:
    """The rollout units of `per_site` GPUs per site: its curve's configuration at that count."""
    units: list[Unit] = []
    for s, x in per_site.items():
        cfg = gcurves[s].configs[x] if x > 0 else None
        if cfg is not None:
            units += [Unit(s, gcurves[s].costs[cfg.tp])] * cfg.instances
    return units


SEARCH_GRID = 9  # splits of the shared site simulated before the search narrows around the best
SAME_TIME = 1e-9  # simulated times this close (relative) are one: their difference is float rounding


UnitsKey = tuple[tuple[str, int], ...]  # rollout units by site and cost (`_units_key`)


@dataclass
class SimCache:
    """What `_simulate` keeps across the allocations a search simulates (the plan's own among them), each by what it
    depends on: the simulated batches by rollout units (the same beside every trainer), and a mode's simulated
    iteration by those units, their weight sync and the trainer's step, so two allocations that differ only in GPUs
    left idle (13 and 15 GPUs of tp 4 units) or a trainer count whose fastest configuration is another's are
    simulated once."""

    batches: dict[UnitsKey, list[Batch]] = field(default_factory=dict)
    iterations: dict[tuple[UnitsKey, float, float, float, Mode], float] = field(default_factory=dict)


def _units_key(units: list[Unit]) -> UnitsKey:
    return tuple((u.site, id(u.cost)) for u in units)


class Stages(NamedTuple):
    """What a search of the allocation simulates: the job, its workload and stage curves, the sites' GPU budgets
    and the rollout GPUs per site at each total (`alloc.fill_table`); `cache`: what the simulations keep (the plan's
    own allocation among them)."""

    job: Job
    lm: LengthModel
    gcurves: dict[str, GenCurve]
    tcurve: TrainCurve
    tw: TrainWorkload
    budgets: dict[str, int]
    fill: np.ndarray
    opts: PlanOptions
    cache: SimCache


def _simulated_split(
    stages: Stages,
    *,
    t_site: str,
    streamed_fraction: float,
    seeds: tuple[int, ...],
) -> tuple[alloc.Choice, dict[str, Any]]:
    """The split of the site both stages share that the job simulator finds fastest in async mode: there a unit's
    next iteration fills the rows its current one's long tail frees (`_shares`), so generation costs less than one
    iteration's makespan and Algorithm 1, which balances that makespan against training, gives rollout too many
    GPUs (docs/planning.md). Rollout gets x of the site's n GPUs (after every other rollout site's whole budget), the
    trainer the fastest configuration within n − x. Minimised over x by `search_min` on a grid of SEARCH_GRID
    splits and `seeds` (rollout GPU counts: Algorithm 1's, its fewest-GPUs alternative, the even split: the simulated
    iteration moves in steps of whole units and hosts, not smoothly in x)."""
    gcurves, budgets, fill = stages.gcurves, stages.budgets, stages.fill
    r_sites = list(gcurves)
    n = budgets[t_site]
    others = sum(budgets.values()) - n
    gen = alloc.combine_rollout([gcurves[s].seconds for s in r_sites], fill)
    train = np.asarray(stages.tcurve.seconds, dtype=float)
    fastest, fastest_at = alloc.prefix_min(train[:n])  # the fastest trainer within n − x GPUs, and where
    feasible = [x for x in range(1, n) if math.isfinite(gen[others + x]) and math.isfinite(fastest[n - x])]
    if not feasible:
        raise PlanError(f"site {t_site!r}: no split of its {n} GPUs runs both stages")
    runs: dict[int, tuple[int, float]] = {}  # x → (trainer GPUs, simulated async iteration s)
    simulated = _async_iteration(stages, train=train, streamed_fraction=streamed_fraction)

    def iteration(x: int) -> float:
        y = int(fastest_at[n - x])
        runs[x] = (y, simulated(others + x, y))
        return runs[x][1]

    def nearest(x: int) -> int:  # the feasible split nearest a seed (a combined rollout count)
        return min(feasible, key=lambda v: (abs(v - (x - others)), v))

    starts = {nearest(x) for x in seeds}
    best = search_min(iteration, feasible, grid=SEARCH_GRID, seeds=sorted(starts))
    y = runs[best][0]
    chosen = alloc.Choice(others + best, y, float(gen[others + best]), float(train[y]))
    evaluated = [
        {"rollout_gpus": others + x, "trainer_gpus": yx, "iteration_s": s} for x, (yx, s) in sorted(runs.items())
    ]
    return chosen, {"mode": "async", "kind": "shared_site", "site": t_site, "chosen": chosen.x, "evaluated": evaluated}


# simulated async iterations this close count as the same: across datacenters a stage gives up GPUs while the
# iteration stays within it of the full allocation's, and the plan advises no unit that saves less
SAME_WITHIN = 0.01


def _simulated_cross(
    stages: Stages,
    *,
    n_train: int,
    search_rollout: bool,
    search_trainer: bool,
    min_rollout: int,
    streamed_fraction: float,
) -> tuple[alloc.Choice, dict[str, Any]]:
    """Across datacenters every site's GPUs are there to use; what a plan decides is how few of them it needs.
    Algorithm 1 shrinks the stage that is faster by its makespan to the other's time; in async mode a unit's next
    iteration fills its current one's tail, so that makespan overstates what generation costs and Algorithm 1
    keeps rollout GPUs the job does not need. Here the job simulator decides: from the full allocation (its
    simulated async iteration T), a stage whose GPU count is `auto` gives up GPUs while the iteration stays within
    SAME_WITHIN of T (the fewest found by `search_first`, on the simulated times), one stage then the other; of the
    two orders, the one that costs less per iteration (the sites' `gpu_cost_per_hour`) is chosen. Rollout sites
    whose count the job fixes come first in the fill order and hold it: rollout counts below `min_rollout`
    (their sum) are not tried."""
    job, gcurves, budgets, fill = stages.job, stages.gcurves, stages.budgets, stages.fill
    r_sites = list(gcurves)
    inv = job.inventory.sites
    t_site = job.spec.placement.trainer.site
    sizes = [budgets[s] for s in r_sites]
    m = sum(sizes)
    gen = alloc.combine_rollout([gcurves[s].seconds for s in r_sites], fill)
    train = np.asarray(stages.tcurve.seconds, dtype=float)
    fastest, fastest_at = alloc.prefix_min(train[: n_train + 1])  # the fastest trainer within y GPUs, and where
    xs = [x for x in range(max(1, min_rollout), m + 1) if math.isfinite(gen[x])] if search_rollout else [m]
    ys = sorted({int(fastest_at[y]) for y in range(1, n_train + 1) if math.isfinite(fastest[y])})
    ys = ys if search_trainer else [n_train]
    if not xs or not ys or xs[-1] != m or not math.isfinite(train[ys[-1]]):
        raise PlanError(f"{job.spec.name}: the full allocation ({m} rollout, {n_train} trainer GPUs) cannot run")
    runs: dict[tuple[int, int], float] = {}
    simulated = _async_iteration(stages, train=train, streamed_fraction=streamed_fraction)

    def iteration(x: int, y: int) -> float:
        if (x, y) not in runs:
            runs[x, y] = simulated(x, y)
        return runs[x, y]

    bound = iteration(m, ys[-1]) * (1 + SAME_WITHIN)

    def cost(x: int, y: int) -> float:
        per_site = alloc.split_combined(x, fill)
        per_hour = sum(inv[s].gpu_cost_per_hour * g for s, g in zip(r_sites, per_site, strict=True))
        return (per_hour + inv[t_site].gpu_cost_per_hour * y) * iteration(x, y)

    def fewest_rollout(y: int) -> int:
        return search_first(lambda x: iteration(x, y) <= bound, xs)

    def fewest_trainer(x: int) -> int:
        return search_first(lambda y: iteration(x, y) <= bound, ys)

    ends = []
    x = fewest_rollout(ys[-1])  # rollout first, then the trainer
    y = fewest_trainer(x)
    ends.append((cost(x, y), iteration(x, y), x + y, x, y))
    y = fewest_trainer(m)  # the trainer first, then rollout
    x = fewest_rollout(y)
    ends.append((cost(x, y), iteration(x, y), x + y, x, y))
    _, _, _, x, y = min(ends)
    chosen = alloc.Choice(x, y, float(gen[x]), float(train[y]))
    evaluated = [{"rollout_gpus": xe, "trainer_gpus": ye, "iteration_s": t} for (xe, ye), t in sorted(runs.items())]
    search = {
        "mode": "async",
        "kind": "across_datacenters",
        "sites": [*r_sites, t_site],
        "within": SAME_WITHIN,
        "chosen": x,
        "chosen_trainer": y,
        "evaluated": evaluated,
    }
    return chosen, search


def _async_iteration(stages: Stages, *, train: np.ndarray, streamed_fraction: float) -> Callable[[int, int], float]:
    """The simulated async iteration (s) with x rollout GPUs (split per site as the stages' fill table says) and
    the trainer configuration at index y of `train` (the trainer curve's seconds)."""
    job, lm, gcurves, _, tw, _, fill, opts, cache = stages
    r_sites = list(gcurves)

    def run(x: int, y: int) -> float:
        per_site = dict(zip(r_sites, alloc.split_combined(x, fill), strict=True))
        units = _units(gcurves, per_site)
        return _async_s(
            job, lm, units, tw, float(train[y]), per_site, opts, streamed_fraction=streamed_fraction, cache=cache
        )

    return run


def _async_s(
    job: Job,
    lm: LengthModel,
    units: list[Unit],
    tw: TrainWorkload,
    train_s: float,
    per_site: dict[str, int],
    opts: PlanOptions,
    *,
    streamed_fraction: float,
    cache: SimCache | None = None,
) -> float:
    """The simulated async iteration (s) of `units` (GPUs `per_site`) beside a trainer step of `train_s`."""
    at_step = train_s * (1 - streamed_fraction)
    sim = _simulate(job, lm, units, tw, (train_s, at_step), per_site, opts, modes=("async",), report=False, cache=cache)
    return float(sim["predicted"]["iteration_s"]["async"])


def search_first(ok: Callable[[int], bool], xs: list[int]) -> int:
    """The first x of `xs` (ascending) for which `ok` holds, by bisection (exact when `ok` is monotone: false, then
    true); `ok(xs[-1])` is taken to hold."""
    lo, hi = 0, len(xs) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(xs[mid]):
            hi = mid
        else:
            lo = mid + 1
    return xs[lo]


def search_min(f: Callable[[int], float], xs: list[int], *, grid: int, seeds: Sequence[int] = ()) -> int:
    """An x of `xs` (ascending) minimising f, evaluating f at most once per x: f at `grid` evenly spaced xs and
    the seeds, then at the midpoint (in `xs`) between the best so far and each evaluated neighbour, until the best
    one's neighbours are adjacent in `xs`. Exact for a strictly unimodal f; for another, a local minimum near the best
    grid point. Ties (within SAME_TIME: float rounding) go to the smaller x. Seeds not in `xs` are left out."""
    seen: dict[int, float] = {}
    pos = {x: i for i, x in enumerate(xs)}
    seeds = [x for x in seeds if x in pos]

    def at(x: int) -> None:
        if x not in seen:
            seen[x] = f(x)

    k = len(xs)
    grid = max(grid, 2)
    first = xs if k <= grid else [xs[round(i * (k - 1) / (grid - 1))] for i in range(grid)]
    for x in [*first, *seeds]:
        at(x)
    while True:
        done = sorted(seen)
        low = min(seen.values())
        # ties to the smaller x, a tie within float noise too (a trainer-bound iteration: 41.645674772565364 s
        # beside 9 rollout GPUs, 41.64567477256537 s beside 2, the same pipeline)
        best = next(x for x in done if seen[x] <= low + abs(low) * SAME_TIME)
        i = done.index(best)
        mids = [xs[(pos[best] + pos[nb]) // 2] for nb in done[max(i - 1, 0) : i + 2] if abs(pos[nb] - pos[best]) > 1]
        if not mids:
            return best
        for x in mids:
            at(x)


@lru_cache(maxsize=16)
def _noise(recall: float, sigma: float) -> float:
    return noise_for_recall(recall, sigma=sigma)


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
    allocation: list[dict[str, Any]] = [
        {
            "site": t_site,
            "role": "trainer",
            "gpu": prof.sites[t_site].gpu,
            "gpus_used": tcfg.gpus,
            "gpus_available": inv.sites[t_site].total_gpus,
            # FSDP2 where the torch trainer shards its replica (the launch's `rlctl.ops.counts.plan_counts` too)
            "config": tcfg.as_dict() | ({"fsdp": True} if shard_trainer(job, **tcfg.as_dict()) else {}),
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
    units = _units(gcurves, per_site)
    if not units:
        raise PlanError("the allocation has no rollout instance")
    train_s = float(tcurve.seconds[chosen.y])
    sim = _simulate(job, lm, units, tw, (train_s, train_s * (1 - streamed_fraction)), per_site, opts, cache=cache)

    def one_more(site: str, tp: int) -> float:  # the async iteration with one more unit of `tp` GPUs on `site`
        more = per_site | {site: per_site[site] + tp}
        plus = [*units, Unit(site, gcurves[site].costs[tp])]
        return _async_s(job, lm, plus, tw, train_s, more, opts, streamed_fraction=streamed_fraction, cache=cache)

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
        "rebalance": _rebalance(
            gcurves,
            per_site,
            _free_gpus(allocation, inv),
            _room(allocation, inv, t_site, order_tp=_order_tp(job, opts)),
            sim["predicted"],
            one_more=one_more if spec.pipeline.mode == "async" else None,
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


def _simulate(
    job: Job,
    lm: LengthModel,
    units: list[Unit],
    tw: TrainWorkload,
    train: tuple[float, float],
    per_site: dict[str, int],
    opts: PlanOptions,
    *,
    modes: tuple[Mode, ...] = MODES,
    report: bool = True,
    cache: SimCache | None = None,
) -> dict[str, Any]:
    """`train` = (trainer seconds per iteration, the part of them that waits for the whole batch); the iteration
    time of each of `modes`, and with `report` the dispatch report. `cache`: what a search that simulates many
    allocations keeps (`SimCache`)."""
    spec = job.spec
    train_s, at_step_s = train
    cache = SimCache() if cache is None else cache
    key = _units_key(units)
    if key not in cache.batches:
        cache.batches[key] = _batches(job, lm, units, opts)
    batches = cache.batches[key]
    groups = np.arange(spec.batch.prompts_per_iteration).repeat(spec.batch.samples_per_prompt)  # prompt-major
    works = [
        IterationWork(
            g.finish_s,
            (lengths + lm.prompt_tokens).astype(float),
            train_s,
            spec.batch.train_micro_batch_samples,
            at_step_s=at_step_s,
            unit_of=g.unit_of,
            micro_batch_tokens=spec.batch.train_micro_batch_tokens,
            group_of=groups if spec.algorithm.kind == "grpo" else None,  # GRPO trains whole groups
            shares=shares,
        )
        for lengths, _, g, shares in batches
    ]
    gens = [g for _, _, g, _ in batches]
    first_len, first_pred = batches[0][0], batches[0][1]
    w_s = _weight_sync_s(job, per_site, order_tp=_order_tp(job, opts))
    # the pipeline needs a steady state: at least MIN_SIM_ITERATIONS, then η more that only follow them into the
    # engines (an async iteration's tail shares them with the next η; without those its gap is about T_train).
    # From η = steady on, no simulated iteration waits for weights (its shares reach the engines at the start) and
    # a larger η only adds works queued behind `steady` whole iterations in each engine (older first): the same
    # iteration time, at a cost quadratic in η (`simulate_job` runs each engine over i + η shares; η 10^4: minutes)
    steady = max(len(works), MIN_SIM_ITERATIONS)
    eta = drain = min(spec.pipeline.eta, steady)
    works = [works[i % len(works)] for i in range(steady + drain)]
    iteration: dict[Mode, float] = {}
    for m in modes:
        # the works are the batches' (by `key`) with this trainer step, and the job's eta and drain
        done = (key, w_s, train_s, at_step_s, m)
        t = cache.iterations.get(done)
        if t is None:
            run = simulate_job(works, mode=m, weight_sync_s=w_s, eta=eta if m == "async" else 0, drain=drain)
            t = cache.iterations[done] = run.iteration_s()
        iteration[m] = t
    t_gen = float(np.mean([g.makespan_s for g in gens]))
    out: dict[str, Any] = {
        "predicted": {
            "t_gen_s": t_gen,
            "t_train_s": train_s,
            "weight_sync_s": w_s,
            "iteration_s": iteration,
            "samples_per_s": {m: tw.samples / t for m, t in iteration.items()},
        },
    }
    if report:
        dcfg = DispatchConfig(spec.rollout.dispatch, spec.rollout.long_tail_fraction, spec.planning.dispatch_rule)
        out["dispatch"] = _dispatch_report(lm, units, first_len, first_pred, dcfg, gens[0])
    return out


class Batch(NamedTuple):
    """One simulated batch: its output lengths, the ranker's predictions, its generation and the units' shares."""

    lengths: np.ndarray
    pred: np.ndarray
    gen: GenResult
    shares: dict[int, UnitShare]


def _batches(job: Job, lm: LengthModel, units: list[Unit], opts: PlanOptions) -> list[Batch]:
    """The plan's `sim_iterations` batches (drawn from the job's seed) generated on `units`."""
    spec = job.spec
    rng = np.random.default_rng(spec.seed)
    noise = _noise(opts.ranker_recall, lm.sigma)
    dcfg = DispatchConfig(spec.rollout.dispatch, spec.rollout.long_tail_fraction, spec.planning.dispatch_rule)
    # may a unit's next iteration fill the rows its current one's tail frees (vLLM: always)
    barrier = spec.rollout.group_barrier if spec.rollout.engine == "embedded" else "never"
    out: list[Batch] = []
    for _ in range(opts.sim_iterations):
        lengths = lm.sample(spec.batch.prompts_per_iteration, spec.batch.samples_per_prompt, rng)
        pred = predict_lengths(lengths, noise_sigma=noise, rng=rng)
        # Algorithm 2 decides N_l on the first batch; later batches keep it (as a controller would)
        g = simulate_generation(
            lengths,
            pred,
            units,
            dcfg,
            prompt_tokens=lm.prompt_tokens,
            rng=rng,
            keep_splits=out[0].gen.splits if out else None,
        )
        out.append(Batch(lengths, pred, g, _shares(g, lengths, units, prompt_tokens=lm.prompt_tokens, barrier=barrier)))
    return out


def _shares(
    g: GenResult, lengths: np.ndarray, units: list[Unit], *, prompt_tokens: int, barrier: Barrier
) -> dict[int, UnitShare]:
    """Each unit's share of a simulated batch, in its admission order, with its engine: the job simulator runs
    a unit's shares of successive iterations in one engine (in async the next fills this one's tail)."""
    out = {}
    for u, (idx, cap) in g.queues.items():
        cost = units[u].cost
        engine = EngineSpec(
            cost.ptl_s,
            cap,
            prefill_s=prompt_tokens * cost.prefill_s_per_token,
            admit_fixed_s=cost.admit_fixed_s,
            compact_fraction=cost.compact_fraction,
            barrier=barrier,
        )
        out[u] = UnitShare(np.array(idx, dtype=int), lengths[idx], engine)
    return out


def _dispatch_report(
    lm: LengthModel,
    units: list[Unit],
    all_lengths: np.ndarray,
    all_pred: np.ndarray,
    dcfg: DispatchConfig,
    gen: GenResult,
) -> dict[str, Any]:
    """Algorithm 2 on the rollout site with the most units (its share of the first simulated batch): both rules ×
    three cost models (Eq. 2 with P90/P50, Eq. 2 with group means + critical path, the simulator),
    each split simulated on the true lengths; identical splits are simulated once."""
    # the most units; of equal counts the first in the placement (`units` follow it), whatever the hash seed
    site = max(dict.fromkeys(u.site for u in units), key=lambda s: sum(u.site == s for u in units))
    site_idx = [u for u, unit in enumerate(units) if unit.site == site]
    mine = np.isin(gen.unit_of, site_idx)
    lengths, pred = all_lengths[mine], all_pred[mine]
    cost = units[site_idx[0]].cost
    n_units = len(site_idx)
    table: dict[str, dict[str, Any]] = {}
    simulated: dict[tuple[int, int, int], float] = {}

    def sim_of(sp: SkewSplit) -> float:
        key = (sp.num_long, sp.long_batch, sp.regular_batch)
        if key not in simulated:
            simulated[key] = simulate_split(lengths, pred, cost, sp, prompt_tokens=lm.prompt_tokens)
        return simulated[key]

    combos: list[tuple[Rule, Estimate]] = [
        ("sum", "quantile"),
        ("max", "quantile"),
        ("sum", "mean"),
        ("max", "mean"),
        ("max", "simulate"),
    ]
    for rule, est in combos:
        cfg = DispatchConfig("skew_aware", dcfg.alpha, rule, length_estimate=est)
        sp = site_split(pred, cost, n_units, cfg, prompt_tokens=lm.prompt_tokens, length_dist=lengths)
        sim_s = sim_of(sp)
        table[_key(rule, est)] = {
            "rule": rule if est != "simulate" else "-",
            "length_estimate": est,
            "long_tail_units": sp.num_long,
            "regular_units": sp.num_regular,
            "long_tail_batch": sp.long_batch,
            "regular_batch": sp.regular_batch,
            "estimate_s": sp.latency_s,
            "simulated_s": sim_s,
            "abs_error": abs(sp.latency_s - sim_s) / max(sim_s, 1e-12),
        }
    chosen = table[_key(dcfg.rule, dcfg.length_estimate)]
    no_split = sim_of(
        fixed_split(
            list(pred), num_units=n_units, num_long=0, alpha=dcfg.alpha, long_batch=0, regular_batch=cost.max_batch
        )
    )
    return {
        "policy": dcfg.policy,
        "rule": dcfg.rule,
        "length_estimate": dcfg.length_estimate,
        "alpha": dcfg.alpha,
        "site": site,
        "long_tail_units": chosen["long_tail_units"],
        "regular_units": chosen["regular_units"],
        "long_tail_batch": chosen["long_tail_batch"],
        "regular_batch": chosen["regular_batch"],
        "candidates": table,
        "better_rule": _better({r: table[f"{r}/quantile"] for r in ("sum", "max")}),
        "samples_on_site": int(mine.sum()),
        "no_split_simulated_s": no_split,
        "policy_simulated_s": gen.makespan_s,
    }


def _key(rule: str, est: str) -> str:
    return "simulate" if est == "simulate" else f"{rule}/{est}"


def _better(rules: dict[str, Any]) -> str:
    """Which rule's estimate is closer to the simulated time of the split it picked ("tie" if equal)."""
    s, m = rules["sum"]["abs_error"], rules["max"]["abs_error"]
    return "tie" if math.isclose(s, m, rel_tol=1e-9) else ("sum" if s < m else "max")


def _weight_sync_s(job: Job, per_site: dict[str, int], *, order_tp: int = 1) -> float:
    """The slowest rollout site's weight sync (s) of `per_site` rollout GPUs; `order_tp`: the trainer tp the
    shared site's rollout host order follows (`_order_tp`)."""
    spec = job.spec
    inv = job.inventory
    t_site = spec.placement.trainer.site
    full = job.spec.model.arch.weight_bytes
    every = spec.weight_sync.anchor_every
    if spec.weight_sync.mode == "full":
        size = full
    elif every is None:  # full copies only on demand (joins, resumes): every update is a delta
        size = full * DELTA_FRACTION
    else:
        size = full * (1 / every + (1 - 1 / every) * DELTA_FRACTION)
    worst = 0.0
    for s, x in per_site.items():
        if x == 0:
            continue
        local = _node_bytes_per_s(inv.sites[s])
        link_bps, lat = (local, 0.0) if s == t_site else _route(inv, t_site, s)
        # one relay per host after the first: 12 GPUs of 8-GPU hosts are 2 hosts, one hop
        hosts = _rollout_hosts(inv.sites[s], shared=s == t_site, trainer_tp=order_tp)
        hops = _hosts_spanned(hosts, x) - 1
        # another datacenter's relay heads chains_per_datacenter chains of the other hosts (`weights/plan.py`), which
        # share its host's link; in the trainer's datacenter (its site or another there) the trainer's ranks head the
        # chains, one of hosts per trainer host
        chains = (
            1 if inv.sites[s].datacenter == inv.sites[t_site].datacenter else spec.weight_sync.chains_per_datacenter
        )
        worst = max(
            worst,
            weight_transfer_s(
                size,
                link_bytes_per_s=link_bps,
                latency_s=lat,
                local_bytes_per_s=local,
                num_local_hops=hops,
                chunk_bytes=spec.weight_sync.chunk_bytes,
                relay_chains=chains,
            ),
        )
    return worst


def _route(inv: Inventory, a: str, b: str) -> tuple[float, float]:
    """Bytes per second and latency (s) of the weights' way from site `a` to site `b` as the broadcast routes them
    (`rlctl.weights.plan`: datacenters joined by the declared links, one copy into each): a link declared between
    the two sites; else, in one datacenter, the slower of the two sites' networks (no inter-DC link crossed); else
    the fewest-hop path of datacenters over the declared links, at its slowest hop's rate (each hop the fastest link
    between its two datacenters) and the sum of its hops' latencies. ConfigError when no path joins them."""
    link = inv.link(a, b)
    if link is not None:
        return link.bandwidth_gbps * 1e9 / 8, link.latency_ms / 1e3
    dc_a, dc_b = inv.sites[a].datacenter, inv.sites[b].datacenter
    if dc_a == dc_b:
        return min(_node_bytes_per_s(inv.sites[a]), _node_bytes_per_s(inv.sites[b])), 0.0
    fastest: dict[frozenset[str], Link] = {}  # between each pair of datacenters
    for ln in inv.links:
        key = frozenset(inv.sites[s].datacenter for s in ln.between)
        if len(key) == 2 and (key not in fastest or ln.bandwidth_gbps > fastest[key].bandwidth_gbps):
            fastest[key] = ln
    came: dict[str, str | None] = {dc_a: None}  # breadth first from a's datacenter: the path of fewest hops
    todo = [dc_a]
    while todo and dc_b not in came:
        here = todo.pop(0)
        for key in fastest:
            if here in key and (there := next(iter(key - {here}))) not in came:
                came[there] = here
                todo.append(there)
    if dc_b not in came:  # the inventory's omission: named in its files, exit 2
        raise ConfigError(
            ", ".join(dict.fromkeys((inv.origin[a], inv.origin[b]))),
            "links",
            f"no link declared between sites {a!r} and {b!r}, nor a path of links from datacenter {dc_a!r} to "
            f"{dc_b!r}: the trainer's weights reach the rollout over them",
            hint=f"add {{between: [{a}, {b}], bandwidth_gbps: N, latency_ms: N}} under 'links:'",
        )
    hops, dc = [], dc_b
    while (up := came[dc]) is not None:
        hops.append(fastest[frozenset((up, dc))])
        dc = up
    return min(h.bandwidth_gbps for h in hops) * 1e9 / 8, sum(h.latency_ms for h in hops) / 1e3


def _free_gpus(allocation: list[dict[str, Any]], inv: Any) -> dict[str, int]:
    used: dict[str, int] = {}
    for a in allocation:
        used[a["site"]] = used.get(a["site"], 0) + a["gpus_used"]
    return {s: inv.sites[s].total_gpus - u for s, u in used.items()}


def _room(allocation: list[dict[str, Any]], inv: Any, t_site: str, *, order_tp: int) -> Callable[[str, int], bool]:
    """Whether one more rollout unit of `tp` GPUs fits on a site: on one host (tensor parallel stays inside a
    node), in the slots the trainer leaves (its tp groups fill the first hosts: `hostfill.trainer_slots`), beside
    the site's units, which fill the hosts in the order `GpuPool.take` does (`_rollout_hosts`)."""
    t = allocation[0]
    site = inv.sites[t_site]
    placed = trainer_slots(
        [g for _, g in site.hosts],
        t["gpus_used"],
        tp=t["config"]["tp"],
        slurm=kind_of(site).ranks_are_tasks,
        order_tp=order_tp,
    )
    assert placed is not None  # the trainer curve holds only configurations that place
    trainer = placed[0]
    units = {a["site"]: a["instances"] for a in allocation if a["role"] == "rollout"}

    def fits(site: str, tp: int) -> bool:
        slots = inv.sites[site].total_gpus - (trainer if site == t_site else 0)
        hosts = _rollout_hosts(inv.sites[site], shared=site == t_site, trainer_tp=order_tp)
        return slots > 0 and int(units_that_fit(hosts, tp, slots)[slots]) > units[site]

    return fits


def _rebalance(
    gcurves: dict[str, GenCurve],
    per_site: dict[str, int],
    free: dict[str, int],
    room: Callable[[str, int], bool],
    predicted: dict[str, Any],
    *,
    one_more: Callable[[str, int], float] | None = None,
) -> dict[str, Any]:
    """δ' = reduction of generation time from one more DP unit on the best site with room for one (`room`).

    P_gen comes from the stage curve of the planning workload; as lengths grow the controller
    re-estimates it from recent lengths (the rule itself: add a unit when δ = T_gen − T_train ≥ δ').

    In async mode (`one_more(site, tp)`: the simulated async iteration with one more unit there) a unit's next
    iteration fills its current one's tail, so the stage makespans overstate what generation holds back: δ is
    the simulated iteration minus T_train (the trainer's wait) and δ' what the unit saves of that iteration; a
    unit that saves less than SAME_WITHIN of it (generation bound by its longest samples, not by units) is not
    added. The controller's rule measures the same δ in async mode, with δ' = period / (N + 1)
    (`rlctl.agents.rebalance`)."""
    delta = predicted["t_gen_s"] - predicted["t_train_s"]
    options = []  # (room for it, gain, site, tp): one more instance of the site's current TP
    for s, x in per_site.items():
        cfg = gcurves[s].configs[x] if x else None
        tp = cfg.tp if cfg else min(gcurves[s].costs)
        est = gcurves[s].estimators[tp]
        n = cfg.instances if cfg else 0
        gain = est.time_s(n) - est.time_s(n + 1) if n else math.inf
        options.append((room(s, tp), gain, s, tp))
    has_room, gain, site, tp = max(options)
    pays = True
    if one_more is not None:
        t = float(predicted["iteration_s"]["async"])
        delta, gain = t - predicted["t_train_s"], t - one_more(site, tp)
        pays = gain >= SAME_WITHIN * t
    out = {
        "basis": "simulated_async" if one_more is not None else "stage_times",
        "delta_s": delta,
        "delta_prime_s": gain,
        "site": site,
        "unit_gpus": tp,
        "free_gpus": free[site],
        "add_unit": bool(has_room and pays and delta >= gain * (1 - 1e-9)),  # 1e-9: a unit closing the gap exactly
    }
    if not has_room:
        out["reason"] = (
            "no rollout site has room for another unit (its TP degree free on one host; δ' is what one would gain)"
        )
    elif not pays:
        out["reason"] = (
            f"not needed: one more unit saves < {SAME_WITHIN:.0%} of the simulated iteration (generation is bound "
            "by its longest samples, not by units)"
        )
    return out


def _decode_json(cost: DecodeCost) -> dict[str, Any]:
    """A unit's decode cost as plan.json keeps it for the controller's migration (`rlctl.agents.migration.Cost`):
    seconds per decode step at batch 1 … max_batch, and per prefilled token."""
    return {
        "ptl_s": [round(float(x), 7) for x in cost.ptl_s[1 : cost.max_batch + 1]],
        "prefill_s_per_token": round(cost.prefill_s_per_token, 9),
    }
