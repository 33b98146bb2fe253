"""What a plan prices, checked once: its options, the job's length model, the profile it reads (the roofline
with the job's trainer splits, or a file refused when it is for another job, model, site or GPU), each site's
entries for the job's engine and trainer backend, the training passes' cost and the trainer tp classes
`make_plan` plans one by one."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from rlctl.config.job import Job
from rlctl.config.task import DatasetTask, LengthsTask
from rlctl.errors import ConfigError
from rlctl.planner.split import split_refusal
from rlctl.planner.workload import LengthModel
from rlctl.profiler.analytical import TP_DEGREES, analytical_profile, training_entry
from rlctl.profiler.profile import ProfileFile, SiteProfile, priced_passes
from rlctl.profiler.traincost import (
    TrainingPasses,
    critic_flop_params,
    flops_per_token,
    forward_units,
    lora_passes,
    passes_for,
    streamed_units,
)

DEFAULT_RECALL = 0.87  # StreamRL Table 4, 7B ranker, top 20 %


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


def job_passes(job: Job, trainer: TrainingPasses | None) -> TrainingPasses:
    """The job's training passes on `trainer`: its reference, its LoRA adapters (`trainer.lora`), and the torch
    trainer's `activation_checkpointing` as a recomputed forward an update (`TrainingPasses.recompute`: what it runs,
    `TinyGPT.hidden` checkpointing every layer; its memory: `rlctl.profiler.actmem`). The model's architecture is
    read for the adapters alone: an HF model's is its directory read (config.json and every weight file's header),
    for a job without LoRA to no use."""
    spec, adapters = job.spec, job.spec.trainer.lora
    if adapters is None:
        passes = passes_for(spec.algorithm, trainer)
    else:
        passes = lora_passes(spec.algorithm, arch=spec.model.arch, lora=adapters, trainer=trainer)
    if spec.trainer.activation_checkpointing and spec.trainer.backend == "torch":
        passes = passes.model_copy(update={"recompute": True})
    return passes


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
            passes=job_passes(job, trainer),
            lora=job.spec.trainer.lora,
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
    return _with_job_memory(job, profile, sorted(sites), trainer=trainer)


def _with_job_memory(job: Job, prof: ProfileFile, sites: list[str], *, trainer: TrainingPasses | None) -> ProfileFile:
    """A profile file's training entries at `sites` with the job's memory where the job holds other state than the
    file's entries: other trained parameters (`trainer.lora` against the file's `lora`: a full fine-tune's file for a
    LoRA job, one of other adapters, or a LoRA file for a full fine-tune) or a reference policy the file was profiled
    without (a KL term). A file's memory is the roofline's formula at the passes it prices (`priced_passes`),
    measured profiles too (`rlctl profile` times the steps: `rlctl.profiler.build._measured_training`), so the
    formula with the job's passes is what a profile of the job would hold, and what the launch decides FSDP2 by
    (`rlctl.planner.split.launch_layout`): a file profiled without the job's reference priced a replica unsharded
    that the launch shards. The seconds per token stay the file's, scaled to the job's passes by `train_cost`."""
    passes = job_passes(job, trainer)
    have = priced_passes(prof)
    if (passes.adapter_params, passes.reference) == (have.adapter_params, have.reference):
        return prof
    arch, kind = job.spec.model.arch, job.spec.algorithm.kind
    out = dict(prof.sites)
    for s in sites:
        gpu = job.inventory.sites[s].spec
        entries = []
        for e in prof.sites[s].training:
            m = training_entry(arch, gpu, tp=e.tp, pp=e.pp, algorithm=kind, passes=passes)
            memory = {"fixed_bytes_per_gpu": m.fixed_bytes_per_gpu, "sharded_bytes_per_gpu": m.sharded_bytes_per_gpu}
            entries.append(e.model_copy(update=memory))
        out[s] = prof.sites[s].model_copy(update={"training": entries})
    return prof.model_copy(update={"sites": out})


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
    gpu, passes = job.inventory.sites[t_site].spec, job_passes(job, trainer)
    extra = [
        training_entry(arch, gpu, tp=tp, pp=pp, algorithm=spec.algorithm.kind, passes=passes)
        for tp, pp in splits
        if (tp, pp) not in have
    ]
    if not extra:
        return prof
    only = mine.model_copy(update={"training": [*mine.training, *extra]})
    return prof.model_copy(update={"sites": {**prof.sites, t_site: only}})


def site_for_engine(site: SiteProfile, engine: str, *, name: str, profile_file: str) -> SiteProfile:
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


def site_for_backend(site: SiteProfile, backend: str, *, name: str, profile_file: str) -> SiteProfile:
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
    kind, params = job.spec.algorithm.kind, prof.model.arch.active  # (FLOPs: a MoE's active parameters)
    critic = critic_flop_params(prof.model.arch)  # (PPO's: the policy's trunk, no lm_head matmul)
    passes = job_passes(job, trainer)
    units = forward_units(kind, passes, params=params, critic=critic)
    # a profile's passes hold adapters where its entries are of them (its `lora`: `rlctl profile --job` of a LoRA job,
    # or the roofline built for one, `profile_for`): scaled by 1; a full fine-tune's: a LoRA job's by ≈ 2/3
    profile_passes = priced_passes(prof)
    return {
        "algorithm": kind,
        "passes": passes.model_dump(),
        "lora_adapter_params": passes.adapter_params,
        "forward_units": units,
        "flops_per_token": flops_per_token(kind, passes, params, critic=critic),
        "profile_passes": profile_passes.model_dump(),
        "profile_lora_adapter_params": profile_passes.adapter_params,
        "scale_of_profile": units / forward_units(prof.algorithm, profile_passes, params=params, critic=critic),
        "streamed_fraction": streamed_units(kind, passes, params=params) / units,
        "optimizer_steps": passes.optimizer_steps,
        "mini_batches": passes.mini_batches,
    }


def host_order_tp(job: Job, opts: PlanOptions) -> int:
    """The trainer tp the rollout's host order follows: the job's trainer.tensor_parallel, else the tp class
    `make_plan` plans (`trainer_tp_classes`); the launch follows the plan's tp (`launch.layout.order_tp`)."""
    if opts.trainer_order_tp is not None:
        return opts.trainer_order_tp
    return (job.spec.trainer.model_split or (1, 1))[0]


def trainer_tp_classes(job: Job, prof: ProfileFile) -> list[list[int]]:
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


def with_trainer_tps(prof: ProfileFile, site: str, tps: list[int]) -> ProfileFile:
    """The profile with only the training entries of `site` at `tps`."""
    mine = prof.sites[site]
    only = mine.model_copy(update={"training": [e for e in mine.training if e.tp in tps]})
    return prof.model_copy(update={"sites": {**prof.sites, site: only}})
