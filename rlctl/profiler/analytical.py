"""Roofline cost models from catalog specs (DESIGN §4): decode, prefill, KV capacity, training.

Decode step of one instance with TP GPUs, batch BS at context C (every GPU reads its weight shard
and its share of the KV cache; the step is bound by HBM bandwidth or by FLOPs, whichever is slower):

    t = max((W + BS·C·kv) / (TP·η_bw·HBM_bw), (2·P + 4·layers·heads·head_dim·C)·BS / (TP·η_f·FLOPS))
        + TP all-reduces (2 per layer) + t_fixed(layers)

Training: FLOPs per token = 2·P·u, u the forward units of the algorithm's passes (`traincost`: e.g.
3 for rlctl's GRPO without KL, 4 + 4·C/P for its PPO with KL, C its critic's), at MFU η_train, plus Megatron-style TP
all-reduces of each pass's activations (a layer's: 4 in an update, 2 in a forward; PPO's critic's as the policy's,
`traincost.tp_allreduces`). Attention FLOPs in training are left out (≈5 % at 8K for 7B).
"""

from __future__ import annotations

from rlctl.config.runtime import Lora
from rlctl.hardware import GpuSpec
from rlctl.models.catalog import ModelArch
from rlctl.planner.split import rollout_tp_refusal, trainer_tp_refusal
from rlctl.profiler.profile import GenerationEntry, ModelSpec, ProfileFile, SiteProfile, TrainingEntry
from rlctl.profiler.traincost import (
    TrainingPasses,
    critic_flop_params,
    flops_per_token,
    lora_adapters,
    tp_allreduces,
    trained_params,
)

# a trainer rank's memory besides its model state and its cut's activations (`rlctl.profiler.actmem`, priced apart
# since they grow with the cut's tokens): the CUDA context (≈ 0.5 GB with torch's kernels), NCCL's buffers (≈ 0.3–0.6
# GB a communicator at its default 4 MiB a channel and protocol; a rank has up to three: tp, pp, dp) and cuBLAS's
# workspaces. Not measured here (no GPU); the 2 GB it held with the activations in it, kept as the fixed part's bound
RANK_WORKING_BYTES = 2e9
REFERENCE_BYTES_PER_PARAM = 4  # a KL term's reference policy, held in fp32 by rlctl's trainers as the policy is

ETA_BW = 0.7  # achievable fraction of HBM bandwidth in decode
ETA_FLOPS = 0.5  # achievable fraction of peak FLOPs in decode / prefill matmuls
ETA_TRAIN = 0.40  # training MFU before communication
ETA_LINK = 0.7  # achievable fraction of NVLink bandwidth
KV_MEM_FRACTION = 0.9  # like vLLM's gpu_memory_utilization
ALLREDUCE_LATENCY_S = 8e-6
DEFAULT_CONTEXTS = [1024, 2048, 4096, 8192, 16384, 32768]
DEFAULT_BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
TP_DEGREES = [1, 2, 4, 8]
PP_DEGREES = [1, 2, 4, 8, 16]


def fixed_step_s(gpu: GpuSpec, model: ModelArch) -> float:
    """Per-step overhead outside the roofline: kernel launches, sampling, scheduling."""
    if gpu.name == "CPU":  # interpreter + op dispatch dominate on one core (DESIGN §10: 1.39 ms at BS 1)
        return 5e-4 + 3e-4 * model.layers
    return 1e-3 + 4e-5 * model.layers


def decode_step_s(model: ModelArch, gpu: GpuSpec, *, tp: int, batch: int, context: int) -> float:
    mem_bytes = model.weight_bytes + batch * context * model.kv_bytes_per_token
    t_mem = mem_bytes / (tp * ETA_BW * gpu.hbm_bytes_per_s)
    # QKᵀ and AV: 2 · head_dim · C each for every query head (heads · head_dim is not hidden where head_dim is explicit)
    flops = (2 * model.active + 4 * model.layers * model.heads * model.head_dim * context) * batch  # (a MoE's active)
    t_flops = flops / (tp * ETA_FLOPS * gpu.flops)
    t_comm = 0.0
    if tp > 1:
        ring_bytes = 2 * (tp - 1) / tp * batch * model.hidden * 2
        t_comm = 2 * model.layers * (ALLREDUCE_LATENCY_S + ring_bytes / (ETA_LINK * gpu.nvlink_gb_per_s * 1e9))
    return max(t_mem, t_flops) + t_comm + fixed_step_s(gpu, model)


def prefill_s_per_token(model: ModelArch, gpu: GpuSpec, *, tp: int) -> float:
    return 2 * model.active / (tp * ETA_FLOPS * gpu.flops)


def kv_capacity_tokens(model: ModelArch, gpu: GpuSpec, *, tp: int) -> int:
    free = KV_MEM_FRACTION * gpu.hbm_bytes * tp - model.weight_bytes
    return int(free // model.kv_bytes_per_token) if free > 0 else 0


def generation_entries(
    model: ModelArch,
    gpu: GpuSpec,
    *,
    gpus_per_node: int,
    contexts: list[int] | None = None,
    batch_sizes: list[int] | None = None,
) -> list[GenerationEntry]:
    """One entry per TP degree that fits in a node, that vLLM shards the model over (`rollout_tp_refusal`: e.g. not 4
    or 8 of Phi-4's 10 key/value heads) and that leaves room for at least one full-context sequence."""
    contexts = contexts or DEFAULT_CONTEXTS
    batch_sizes = batch_sizes or DEFAULT_BATCHES
    out = []
    for tp in (t for t in TP_DEGREES if t <= gpus_per_node and rollout_tp_refusal(model, t) is None):
        kv_tokens = kv_capacity_tokens(model, gpu, tp=tp)
        if kv_tokens < contexts[0]:
            continue
        grid = [[decode_step_s(model, gpu, tp=tp, batch=b, context=c) for b in batch_sizes] for c in contexts]
        out.append(
            GenerationEntry(
                tp=tp,
                contexts=contexts,
                batch_sizes=batch_sizes,
                ptl_s=grid,
                prefill_s_per_token=prefill_s_per_token(model, gpu, tp=tp),
                kv_capacity_tokens=kv_tokens,
            )
        )
    return out


def training_entries(
    model: ModelArch, gpu: GpuSpec, *, gpus_per_node: int, algorithm: str, passes: TrainingPasses | None = None
) -> list[TrainingEntry]:
    """One entry per (TP, PP) of the roofline's grid: TP within a node that the trainer splits the model over
    (`trainer_tp_refusal`: dividing the heads, the key/value heads, the MLP width and the vocabulary), PP up to the
    layers."""
    return [
        training_entry(model, gpu, tp=tp, pp=pp, algorithm=algorithm, passes=passes)
        for tp in TP_DEGREES
        if tp <= gpus_per_node and trainer_tp_refusal(model, tp) is None
        for pp in PP_DEGREES
        if pp <= model.layers
    ]


def training_entry(
    model: ModelArch, gpu: GpuSpec, *, tp: int, pp: int, algorithm: str, passes: TrainingPasses | None = None
) -> TrainingEntry:
    """Seconds per token of every pass of `algorithm` with `passes` (default: rlctl's trainer, no KL) at
    tensor degree `tp` and pipeline degree `pp`, and the memory of the trained models (+ reference weights if
    it runs)."""
    passes = passes or TrainingPasses()
    critic = critic_flop_params(model)  # (PPO's: the policy's trunk, no lm_head matmul)
    flops = flops_per_token(algorithm, passes, model.active, critic=critic)  # (a MoE's active parameters; memory: all)
    compute = flops / (tp * ETA_TRAIN * gpu.flops)  # seconds per token for the TP group
    comm = 0.0
    if tp > 1:  # each pass's all-reduces of the activations, bf16, a layer's by the pass (`tp_allreduces`): PPO's
        # critic's as the policy's layers', versus scaled by its FLOPs (C/P, its lm_head's matmul, which all-reduces
        # nothing), and a forward 2 of an update's 4, versus 1/3 of them as its FLOPs (a reference forward, the
        # critic's values forward). A profile of other passes is still scaled by FLOPs (`train_cost`)
        ring = 2 * (tp - 1) / tp * model.hidden * 2
        comm = tp_allreduces(algorithm, passes) * model.layers / pp * ring / (ETA_LINK * gpu.nvlink_gb_per_s * 1e9)
    shard = model.params / (tp * pp)
    trained_shard = trained_params(model, algorithm) / (tp * pp)  # (PPO's critic: no lm_head, `critic_params`)
    # bf16 weights + grads of the trained models and the reference's weights stay whole per rank (the reference in
    # fp32, as rlctl's trainers load it: `rlctl.agents.trainer` makes it as it makes the policy);
    # fp32 master weights and Adam moments (12 B/param) are sharded over DP (distributed optimizer).
    fixed = 4 * trained_shard + shard * REFERENCE_BYTES_PER_PARAM * passes.reference + RANK_WORKING_BYTES
    sharded = 12 * trained_shard
    if passes.adapter_params:  # LoRA (GRPO: one trained model): the policy's frozen weights in fp32 (as rlctl's
        # trainer holds them, 4 B), and only the adapters' weights, gradients and AdamW state (16 B each)
        adapters = passes.adapter_params / (tp * pp)
        fixed = shard * (4 + REFERENCE_BYTES_PER_PARAM * passes.reference) + 4 * adapters + RANK_WORKING_BYTES
        sharded = 12 * adapters
    return TrainingEntry(
        tp=tp, pp=pp, gpu_s_per_token=tp * (compute + comm), fixed_bytes_per_gpu=fixed, sharded_bytes_per_gpu=sharded
    )


def analytical_site(
    model: ModelArch,
    gpu: GpuSpec,
    *,
    gpus_per_node: int,
    cost_per_gpu_hour: float,
    algorithm: str = "grpo",
    passes: TrainingPasses | None = None,
) -> SiteProfile:
    return SiteProfile(
        gpu=gpu.name,
        gpus_per_node=gpus_per_node,
        hbm_bytes=gpu.hbm_bytes,
        cost_per_gpu_hour=cost_per_gpu_hour,
        generation=generation_entries(model, gpu, gpus_per_node=gpus_per_node),
        training=training_entries(model, gpu, gpus_per_node=gpus_per_node, algorithm=algorithm, passes=passes),
    )


def analytical_profile(
    model: ModelArch,
    sites: dict[str, tuple[GpuSpec, int, float]],
    *,
    algorithm: str = "grpo",
    passes: TrainingPasses | None = None,
    lora: Lora | None = None,
) -> ProfileFile:
    """`sites` maps site name → (GPU spec, GPUs per node, cost per GPU-hour); `lora`: the entries are of its adapters
    trained (`passes`' adapter_params: its `lora_params`), as the file records."""
    passes = (passes or TrainingPasses()).model_copy(update=lora_adapters(model, lora))
    return ProfileFile.model_validate(
        {
            "apiVersion": "rlctl/v1",
            "kind": "Profile",
            "source": "analytical",
            "model": ModelSpec.of(model),
            "algorithm": algorithm,
            "training_passes": passes,
            "lora": lora,
            "sites": {
                name: analytical_site(
                    model, gpu, gpus_per_node=gpn, cost_per_gpu_hour=cost, algorithm=algorithm, passes=passes
                )
                for name, (gpu, gpn, cost) in sites.items()
            },
        }
    )
