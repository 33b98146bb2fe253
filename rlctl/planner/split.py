"""Which tp × pp splits of a model the trainer backends run, said as the job field that asks for one and what is
valid: the `torch` trainer none (each rank holds a whole replica), the `megatron` trainer those whose tp divides
the attention heads, the key/value heads, the MLP width and the vocabulary (column/row-parallel layers and a
vocab-parallel embedding) and whose pp divides the layers (every stage holds as many). The planner refuses a job's
split by it and searches only those; `rlctl check` (`rlctl.ops.preflight.backends.trainer_split_problems`) says the
same.
And where the torch trainer shards its replica over dp with FSDP2 instead (`launch_layout`), for plan and launch alike.
The tps of either role the analytical profile prices are these rules' (`trainer_tp_refusal`, and vLLM's for a rollout
unit, `rollout_tp_refusal`: a tp that does not divide the key/value heads, nor is a multiple of them, it cannot shard).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlctl.models.catalog import ModelArch

if TYPE_CHECKING:
    from rlctl.config.job import Job, JobFile
    from rlctl.planner.costs import Sharding, ShardRule


def split_refusal(arch: ModelArch, backend: str, *, tp: int, pp: int) -> tuple[str, str] | None:
    """(job field, why and what is valid) for the first reason `backend` cannot train `arch` at tp × pp; None when
    it can."""
    return next(iter(split_refusals(arch, backend, tp=tp, pp=pp)), None)


def split_refusals(arch: ModelArch, backend: str, *, tp: int, pp: int) -> list[tuple[str, str]]:
    """Every reason `backend` cannot train `arch` at tp × pp, one (job field, why and what is valid) each: a backend
    without model parallelism, then a pp that does not divide the layers, then the first dimension tp does not
    divide."""
    out = [
        (
            field,
            f"{n}: the {backend!r} trainer has no model parallelism (each rank holds a whole replica); use 1, or "
            "trainer.backend 'megatron'",
        )
        for field, n in (("trainer.tensor_parallel", tp), ("trainer.pipeline_parallel", pp))
        if n > 1 and backend != "megatron"
    ]
    if out:
        return out
    if pp > 1 and arch.layers % pp:
        out.append(
            (
                "trainer.pipeline_parallel",
                f"{pp} does not divide the model's num_hidden_layers {arch.layers} (every stage holds as many); use "
                "a divisor",
            )
        )
    if (why := trainer_tp_refusal(arch, tp)) is not None:
        out.append(("trainer.tensor_parallel", why))
    return out


def trainer_tp_refusal(arch: ModelArch, tp: int) -> str | None:
    """Why the megatron trainer cannot split `arch` over tp GPUs (the first dimension tp does not divide: its column-
    and row-parallel layers and vocab-parallel embedding shard each, a key/value head never replicated); None when it
    can. The trainer's tps the planner searches and the analytical profile prices
    (`rlctl.profiler.analytical.training_entries`)."""
    for what, n in (
        ("num_attention_heads", arch.heads),
        ("num_key_value_heads", arch.kv_heads),
        ("intermediate_size", arch.intermediate),
        ("vocab_size", arch.vocab),
    ):
        if n % tp:
            return f"{tp} does not divide the model's {what} {n}; use a divisor"
    return None


def rollout_tp_refusal(arch: ModelArch, tp: int) -> str | None:
    """Why vLLM cannot shard `arch` over tp GPUs, as its layers divide it (vllm.model_executor.layers.linear: the
    query heads and the MLP width split over tp; the key/value heads too where tp is below their count, else each is
    replicated on tp / kv_heads GPUs, which needs tp a multiple of them; the vocabulary is padded, so any tp); None
    when it can. The rollout's tps the analytical profile prices (`rlctl.profiler.analytical.generation_entries`), so
    a plan never gives a unit a tp its engine refuses (the embedded engine runs tp 1 only, whatever the plan)."""
    kv = arch.kv_heads
    for what, n in (("num_attention_heads", arch.heads), ("intermediate_size", arch.intermediate)):
        if n % tp:
            return f"{tp} does not divide the model's {what} {n}; use a divisor"
    if tp < kv and kv % tp:
        return f"{tp} does not divide the model's num_key_value_heads {kv}; use a divisor, or a multiple of {kv}"
    if tp > kv and tp % kv:
        return (
            f"{tp} is not a multiple of the model's num_key_value_heads {kv} (each is replicated on tp / {kv} GPUs); "
            f"use one, or a divisor of {kv}"
        )
    return None


def trainer_sharding(job: Job, *, tp: int, pp: int, dp: int) -> dict[str, bool]:
    """The plan's trainer config keys for FSDP2 at tp × pp × dp (`launch_layout`, `costs.Sharding.config`): {}
    where it does not shard, {"fsdp": True} where it does, with "reduce_per_step" where its ranks hold their
    unsharded fp32 gradients between reduce-scatters (once an optimizer step, versus once a cut)."""
    return launch_layout(job, tp=tp, pp=pp, dp=dp).config()


def launch_layout(job: Job, *, tp: int, pp: int, dp: int) -> Sharding:
    """How the job's trainer runs at tp × pp × dp (`rlctl.planner.costs.trainer_layout`, the decision the planner
    prices, shows and simulates too: `costs.train_curve`), on the job's `shard_rule` and the planner's figures for
    the model on its site's GPU: what the launch writes (`rlctl.ops.counts.plan_counts`)."""
    from rlctl.devices import kind_for
    from rlctl.planner.costs import trainer_layout
    from rlctl.profiler.analytical import training_entry
    from rlctl.profiler.traincost import lora_passes

    spec = job.spec
    gpu = job.inventory.sites[spec.placement.trainer.site].spec
    # a KL term's reference policy is on the GPU too, as the planner counts it; with LoRA, the adapters' state alone
    arch = spec.model.arch  # (an HF model's: its directory read)
    passes = lora_passes(spec.algorithm, arch=arch, lora=spec.trainer.lora)
    # FSDP2 runs at no model split: the replica's entry decides (a split's never shards)
    entry = training_entry(arch, gpu, tp=tp, pp=pp, algorithm=spec.algorithm.kind, passes=passes)
    rule = shard_rule(spec, arch, mini_batches=passes.mini_batches, cpu=kind_for(gpu.name) != "cuda")
    return trainer_layout(rule, entry, dp=dp, hbm_bytes=gpu.hbm_bytes)


def shard_rule(spec: JobFile, arch: ModelArch, *, mini_batches: int = 1, cpu: bool = False) -> ShardRule:
    """What decides the job's FSDP2 at a layout (`rlctl.planner.costs.ShardInputs`): whether its trainer shards
    (`costs.shards_state`), always (`trainer.shard: fsdp`) or where a replica does not fit, the layers an FSDP2 rank
    gathers (`costs.fsdp_gathered_bytes`), the trained gradients (`traincost.grad_bytes`: the models', or LoRA's
    adapters'), and a rank's share of the learner's largest cut, whose activations it holds (`profiler.actmem`,
    its cuts no more than an optimizer step of `mini_batches` a pass; `cpu`: the trainer's site is a `gpu: CPU` one,
    where the torch trainer computes in fp32), and what a rank of a model split holds to publish (`costs.export_bytes`).
    The plan's workload holds the same
    (`rlctl.planner.plan.train_workload`)."""
    from rlctl.planner.costs import ShardRule, export_bytes, fsdp_gathered_bytes, shards_state
    from rlctl.profiler.actmem import job_activations
    from rlctl.profiler.traincost import grad_bytes, lora_params

    adapters = lora_params(arch, spec.trainer.lora)
    sharded = shards_state(spec.trainer.backend, shard=spec.trainer.shard)
    return ShardRule(
        shards_state=sharded,
        shards_always=spec.trainer.shard == "fsdp",
        gathered_bytes=fsdp_gathered_bytes(arch, adapter_params=adapters) if sharded else 0.0,
        grad_bytes=grad_bytes(arch, spec.algorithm.kind, adapter_params=adapters),
        lora=bool(adapters),
        activations=job_activations(spec, arch, mini_batches=mini_batches, cpu=cpu),
        export_bytes=export_bytes(arch, backend=spec.trainer.backend, cpu=cpu),
    )
