"""Preflight of memory: a trainer rank's weights, gradients and optimizer state against its GPU (or slot), and an
embedded rollout unit's K/V storage plus weights against what it gets, alone or beside units sharing it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlctl.config.inventory import Site
from rlctl.config.job import Job, JobFile
from rlctl.config.task import DatasetTask, DigitsTask
from rlctl.devices import kind_for
from rlctl.launch.agentenv import ParallelConfig
from rlctl.launch.backends import kind_of
from rlctl.launch.layout import PlannedAgent, trainer_parallel
from rlctl.models.catalog import ModelArch
from rlctl.models.hf import DTYPE_BYTES
from rlctl.ops.preflight.base import Problem
from rlctl.ops.preflight.data import job_model_config
from rlctl.planner.context import longest_request
from rlctl.rl.tasks import MAX_DIGITS

if TYPE_CHECKING:
    from rlctl.profiler.actmem import Activations


def trainer_memory_problems(job: Job, plan: dict[str, Any]) -> list[Problem]:
    """The plan's trainer placement where its ranks do not fit its site's GPUs (`trainer_memory_refusal`), with the
    job fields that change it: where the model's state alone fits and its cut's activations do not, the cut's
    fields (`_activation_hint`)."""
    spec, name = job.spec, str(plan["trainer"]["site"])
    m = trainer_memory(spec, name, job.inventory.sites[name], trainer_parallel(plan))
    if m is None or m.fits:
        return []
    if m.need_gb - m.activations_gb <= m.usable_gb:
        return [Problem("batch.train_micro_batch_tokens", m.why, hint=_activation_hint(spec, m))]
    hint = (
        "split each replica: trainer.tensor_parallel / pipeline_parallel (with more GPUs if needed)"
        if spec.trainer.backend == "megatron"
        else "give the trainer more GPUs and let it shard (trainer.shard: auto or fsdp), or a bigger site"
    )
    return [Problem("placement.trainer.gpus", m.why, hint=hint)]


def trainer_memory_refusal(
    spec: JobFile, site_name: str, site: Site, split: ParallelConfig, *, arch: ModelArch | None = None
) -> str | None:
    """Why the trainer of `spec` at `split` (its tp × pp × dp ranks, FSDP2 where `split.fsdp`) does not fit site
    `site_name`, one line with the figures: its ranks' memory (the planner's figure, `rlctl.planner.costs.rank_bytes`:
    weights, gradients and the optimizer state, all divided over dp where FSDP2 shards it, PPO's critic's beside the
    policy's and sharded alike, and the activations of its share of a cut, `rlctl.profiler.actmem`) exceeds what a
    GPU of the site holds — or, on a `gpu: CPU` site, the host memory its nodes give a slot (`memory_gb`; not checked
    where the inventory does not say). None where it fits.
    `rlctl check` judges the plan's split by it, `launch --resume --trainer-split` the split it asks
    (`rlctl.ops.trainersplit`); `arch`: the model's figures where they are not read from the job file (a resume's from
    the job dir's copy of an HF model)."""
    m = trainer_memory(spec, site_name, site, split, arch=arch)
    return None if m is None or m.fits else m.why


@dataclass(frozen=True)
class TrainerMemory:
    """A trainer rank's memory at a split against what it gets (`trainer_memory`)."""

    need_gb: float  # the rank's, activations included
    activations_gb: float
    usable_gb: float  # TRAIN_MEM_FRACTION of what it gets
    cuts: Activations | None  # what its activations are priced on (None: not priced)
    split: ParallelConfig
    why: str  # one line with the figures

    @property
    def fits(self) -> bool:
        return self.need_gb <= self.usable_gb


def trainer_memory(
    spec: JobFile, site_name: str, site: Site, split: ParallelConfig, *, arch: ModelArch | None = None
) -> TrainerMemory | None:
    """A trainer rank's memory at `split` against what it gets, with the line `trainer_memory_refusal` says (and a
    resume's `rlctl.ops.resumememory.judge_memory`, which compares two of them); None where what a rank gets is not
    known."""
    from rlctl.planner.costs import TRAIN_MEM_FRACTION, export_bytes, fsdp_gathered_bytes, held_export_bytes, rank_bytes
    from rlctl.profiler.actmem import job_activations
    from rlctl.profiler.analytical import RANK_WORKING_BYTES, training_entry
    from rlctl.profiler.traincost import grad_bytes, lora_passes

    tp, pp, dp = split.tp, split.pp, split.dp
    gpu = site.spec
    if kind_for(gpu.name) == "cuda":
        have_gb, what = gpu.hbm_gb, f"a {gpu.name} holds {gpu.hbm_gb:g} GB"
    elif (slot := site.memory_per_slot_gb()) is not None:
        have_gb, what = slot, f"a slot of site {site_name!r} gets {slot:g} GB of its nodes' memory_gb"
    else:
        return None
    arch = arch if arch is not None else spec.model.arch
    # with a KL term (kl_coef > 0) the reference policy's weights too, as the planner counts them
    passes = lora_passes(spec.algorithm, arch=arch, lora=spec.trainer.lora)  # LoRA: its adapters
    entry = training_entry(arch, gpu, tp=tp, pp=pp, algorithm=spec.algorithm.kind, passes=passes)
    # only torch's FSDP2 shards a rank's state over dp here (megatron runs without its distributed optimizer):
    # otherwise every rank holds its tp × pp shard's whole state (`rlctl.planner.costs.shards_state`). PPO's critic's
    # too: FSDP2 shards it over the policy's mesh (`rlctl.trainers.fsdp.shard_critic`)
    shards = dp if split.fsdp else 1
    gathered = fsdp_gathered_bytes(arch, adapter_params=passes.adapter_params) if shards > 1 else 0.0
    # FSDP2 reducing once a step holds the step's unsharded fp32 gradients too (`costs.holds_grad_sync`)
    grads = grad_bytes(arch, spec.algorithm.kind, adapter_params=passes.adapter_params)
    held = grads if shards > 1 and split.reduce_per_step else 0.0
    # (None: its state alone judged; on a CPU site the torch trainer computes in fp32)
    cuts = job_activations(spec, arch, mini_batches=passes.mini_batches, cpu=kind_for(gpu.name) != "cuda")
    acts = 0.0 if cuts is None else cuts.rank_bytes(tp=tp, pp=pp, fsdp=shards > 1)
    # a megatron rank of a tp × pp split (a CPU site's) keeps the full fp32 weights it gathers to publish
    export = held_export_bytes(
        export_bytes(arch, backend=spec.trainer.backend, cpu=kind_for(gpu.name) != "cuda"), tp=tp, pp=pp
    )
    need_gb = rank_bytes(
        entry, shards=shards, gathered_bytes=gathered + held, activation_bytes=acts, export_bytes=export
    )
    need_gb /= 1e9
    if shards > 1:
        state_gb = (entry.fixed_bytes_per_gpu + entry.sharded_bytes_per_gpu - RANK_WORKING_BYTES) / 1e9
        state = "weights, gradients" + (
            ", optimizer state and the reference policy" if passes.reference else " and optimizer state"
        )
        parts = f"{state} {state_gb:.1f} GB ÷ {shards} (FSDP2), layers gathered "
        parts += f"{gathered / 1e9:.1f} GB" + (f", a step's unsharded gradients {held / 1e9:.1f} GB" if held else "")
    else:
        fixed_gb, sharded_gb = entry.fixed_bytes_per_gpu / 1e9, entry.sharded_bytes_per_gpu / 1e9
        weights = (
            "weights, gradients and the reference policy's weights" if passes.reference else "weights and gradients"
        )
        parts = f"{weights} {fixed_gb:.1f} GB, optimizer state {sharded_gb:.1f} GB"
    if export:
        parts += f", the full weights gathered to publish {export / 1e9:.1f} GB (fp32)"
    if spec.algorithm.kind == "ppo":
        parts = f"the policy's and its critic's {parts}"
    if cuts is not None:
        tokens = cuts.rank_tokens
        how = ["recomputed"] if cuts.checkpointing and cuts.backend == "torch" else []
        how += ["fp32"] if cuts.fp32 else []  # (the torch trainer on a CPU site: no autocast)
        label = f" ({', '.join(how)})" if how else ""
        parts += f", activations{label} of a cut's {tokens:,} tokens a rank "
        parts += f"{acts / 1e9:.1f} GB"
    why = (
        f"the trainer's {tp * pp * dp} rank(s) at tp {tp} pp {pp} dp {dp} need {need_gb:.1f} GB each ({parts}), "
        f"and {what} ({TRAIN_MEM_FRACTION:.0%} usable)"
    )
    return TrainerMemory(need_gb, acts / 1e9, TRAIN_MEM_FRACTION * have_gb, cuts, split, why)


def _fit_tokens(m: TrainerMemory, cuts: Activations) -> int:
    """The largest batch.train_micro_batch_tokens at which a rank's share of a cut (`Activations.rank_tokens`: that
    budget at any dp) fits beside its state at its split; 0 where one longest row alone does not."""
    room_bytes = (m.usable_gb - (m.need_gb - m.activations_gb)) * 1e9
    tp, pp, fsdp = m.split.tp, m.split.pp, bool(m.split.fsdp) and m.split.dp > 1

    def fits(budget: int) -> bool:
        return dataclasses.replace(cuts, max_tokens=budget).rank_bytes(tp=tp, pp=pp, fsdp=fsdp) <= room_bytes

    lo, hi = cuts.seq_tokens, cuts.rank_tokens  # (the share only grows with the budget)
    if not fits(lo):
        return 0
    while lo < hi:  # the largest budget that fits, in [seq_tokens, rank_tokens)
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def _activation_hint(spec: JobFile, m: TrainerMemory) -> str:
    """The fixes of a rank whose state fits and whose cut's activations do not: fewer tokens a rank's share of a cut
    (the budget lowered, or set where the job has none, to the most that fit: it is a rank's at any dp),
    checkpointing (torch), more tp or pp (megatron). More data-parallel ranks do not help: a rank's share is its
    budgets' whatever the dp."""
    assert m.cuts is not None  # (activations priced: their excess is what this hints at)
    fit = _fit_tokens(m, m.cuts)
    budget = spec.batch.train_micro_batch_tokens
    change = (
        f"lower batch.train_micro_batch_tokens ({budget}" if budget else "set batch.train_micro_batch_tokens (unset"
    )
    fixes = [
        f"{change}; {fit:,} tokens a rank fit)"
        if fit
        else f"shorten the task's longest prompt + output ({m.cuts.seq_tokens:,} tokens; a rank holds one row at least)"
    ]
    if spec.trainer.backend == "torch" and not spec.trainer.activation_checkpointing:
        fixes.append("turn on trainer.activation_checkpointing")
    if spec.trainer.backend == "megatron":
        fixes.append("more tensor or pipeline parallel (trainer.tensor_parallel, trainer.pipeline_parallel)")
    return ", or ".join(fixes)


ROLLOUT_MEM_FRACTION = 0.9  # of a GPU's or a slot's memory, as the trainer's (`TRAIN_MEM_FRACTION`)


@dataclass(frozen=True)
class _UnitMemory:
    """What one embedded rollout unit of a site needs and gets (`_unit_memory`)."""

    weights: int  # bytes of the model's weights
    kv: int  # bytes of its K/V storage, max_batch_size rows
    per_row: int  # bytes of one K/V row
    capacity: int  # positions a row holds
    have: float  # bytes of the memory it gets (a GPU, a slot, this machine)
    what: str  # which memory that is, in words


def _unit_memory(job: Job, site_name: str) -> _UnitMemory | None:
    """An embedded-engine rollout unit of `site_name`: its K/V storage (allocated whole at its first admission:
    `rlctl.engines.kvsize`, rollout.max_batch_size rows of the longest request's width), weights, and what it gets: a
    GPU of its site, or on a `gpu: CPU` site the host memory its nodes give a slot (`memory_gb`; where the inventory
    does not say, a `local` site's units share this machine's memory); None where that is not known or the job's
    engine is not the embedded one."""
    from rlctl.engines.kvsize import bytes_per_position, cache_capacity, kv_cache_bytes

    spec, task = job.spec, job.spec.task
    model = job_model_config(job)
    if spec.rollout.engine != "embedded" or model is None or not isinstance(task, DigitsTask | DatasetTask):
        return None
    if isinstance(task, DigitsTask) and max(task.num_digits_min, task.num_digits_max) > MAX_DIGITS:
        return None  # refused by `context_problems`
    config, rows = model[0], spec.rollout.max_batch_size
    capacity = cache_capacity(sum(longest_request(task)), config.max_positions)
    site = job.inventory.sites[site_name]
    gpu = site.spec
    if kind_for(gpu.name) == "cuda":  # the checkpoint's dtype on a GPU, fp32 on a CPU (rlctl.devices)
        value_bytes, have, what = DTYPE_BYTES[config.torch_dtype], gpu.hbm_gb * 1e9, f"a {gpu.name} holds"
    elif (slot := site.memory_per_slot_gb()) is not None:
        value_bytes, have, what = 4, slot * 1e9, f"a slot of site {site_name!r} gets (its nodes' memory_gb)"
    elif kind_of(site).on_this_machine:
        have = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        value_bytes, what = 4, f"this machine, where site {site_name!r} runs its units, has"
    else:
        return None
    per_row = capacity * bytes_per_position(config, value_bytes=value_bytes)
    return _UnitMemory(
        weights=config.num_params() * value_bytes,
        kv=kv_cache_bytes(config, rows=rows, capacity=capacity, value_bytes=value_bytes),
        per_row=per_row,
        capacity=capacity,
        have=have,
        what=what,
    )


def _kv_hint(job: Job, fit: int, capacity: int) -> str:
    return (f"use max_batch_size ≤ {fit}" if fit > 0 else "place the rollout on a site with more memory") + (
        f"; the {capacity} positions hold the longest request the task allows (task.max_prompt_tokens + "
        "max_output_tokens): a dataset whose prompts are shorter fits more rows with a lower max_prompt_tokens"
        if isinstance(job.spec.task, DatasetTask)
        else ""
    )


def rollout_memory_problems(job: Job) -> list[Problem]:
    """An embedded-engine rollout unit whose K/V storage plus the model's weights exceed what one unit gets
    (`_unit_memory`; units that share it: `shared_rollout_memory_problems`). A unit that does not fit crashes at its
    first admission, is replaced, and crashes again."""
    rows = job.spec.rollout.max_batch_size
    for i, role in enumerate(job.spec.placement.rollout):
        m = _unit_memory(job, role.site)
        if m is None or m.weights + m.kv <= ROLLOUT_MEM_FRACTION * m.have:
            continue
        fit = int((ROLLOUT_MEM_FRACTION * m.have - m.weights) // m.per_row)
        return [
            Problem(
                "rollout.max_batch_size",
                f"{rows}: each embedded rollout unit on site {role.site!r} (placement.rollout[{i}]) needs "
                f"{m.weights + m.kv:,} bytes, K/V {rows} rows × {m.capacity} positions × {m.per_row // m.capacity:,} "
                f"bytes plus weights {m.weights:,} bytes, and {m.what} {m.have:,.0f} bytes "
                f"({ROLLOUT_MEM_FRACTION:.0%} usable)",
                hint=_kv_hint(job, fit, m.capacity),
            )
        ]
    return []


def shared_rollout_memory_problems(job: Job, agents: list[PlannedAgent]) -> list[Problem]:
    """Rollout units that the layout puts on one GPU (a node's `devices` naming it for several slots), or a local
    `gpu: CPU` site's units without `memory_gb` (all on this machine's memory), need that memory together: refused
    when they do not fit together though one alone would (one alone: `rollout_memory_problems`)."""
    together: dict[tuple[str, str], list[str]] = {}  # (site, GPU or machine) → the units on it
    for a in agents:
        if a.role != "rollout":
            continue
        site = job.inventory.sites[a.site]
        if kind_for(site.spec.name) == "cuda" and a.gpu_slice is not None:
            for device in sorted(set(site.devices_of(a.gpu_slice.host, a.gpu_slice.gpus))):
                together.setdefault((a.site, f"GPU {device} of {a.gpu_slice.host}"), []).append(a.name)
        elif kind_for(site.spec.name) != "cuda" and site.memory_per_slot_gb() is None and kind_of(site).on_this_machine:
            together.setdefault((a.site, "this machine"), []).append(a.name)
    rows = job.spec.rollout.max_batch_size
    for (site_name, where), units in together.items():
        m = _unit_memory(job, site_name)
        k = len(units)
        if m is None or k < 2 or m.weights + m.kv > ROLLOUT_MEM_FRACTION * m.have:
            continue  # one alone, or one that does not fit alone (said by `rollout_memory_problems`)
        if k * (m.weights + m.kv) <= ROLLOUT_MEM_FRACTION * m.have:
            continue
        fit = int((ROLLOUT_MEM_FRACTION * m.have / k - m.weights) // m.per_row)
        return [
            Problem(
                "rollout.max_batch_size",
                f"{rows}: the {k} embedded rollout units of site {site_name!r} on {where} ({', '.join(units)}) "
                f"need {k * (m.weights + m.kv):,} bytes together, {m.weights + m.kv:,} each (K/V {rows} rows plus "
                f"weights), and {m.what} {m.have:,.0f} bytes ({ROLLOUT_MEM_FRACTION:.0%} usable)",
                hint=_kv_hint(job, fit, m.capacity) + "; or fewer units there",
            )
        ]
    return []
