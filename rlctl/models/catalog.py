"""Model architectures the cost models need, with built-ins (StreamRL Table 2, Qwen3, Llama 3.1, Mistral and Phi-4
dense, the Qwen3 and Qwen2 MoEs, the demo model).

An HF checkpoint directory's figures come from its config.json: `rlctl.models.hfdir.check_hf_dir`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelArch:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    vocab: int
    intermediate: int
    params: float  # total parameter count: what memory holds and weights travel as
    bytes_per_param: int = 2  # bf16 weights
    explicit_head_dim: int | None = None  # HF `head_dim` where it is not hidden / heads (e.g. Qwen3, Gemma)
    # config.json's max_position_embeddings: the longest prompt + output a job may ask of it (`rlctl plan` and
    # `rlctl check` refuse more: rlctl.planner.context); None where not known (not checked). Not a cost figure: a
    # profile's model (which has none) is the same architecture
    max_positions: int | None = field(default=None, compare=False)
    # the parameters one token computes with, where fewer than `params`: a MoE's router and top-k experts of each
    # sparse layer (and a Qwen2MoE's shared expert and its gate, which every token runs); None: every parameter (a
    # dense model). FLOPs are priced by it, memory by `params`
    active_params: float | None = None
    # a MoE's sparse layer as a token runs it, for its activations (`rlctl.profiler.actmem`): the MLP width it runs
    # (top-k × the experts' width, plus a Qwen2MoE's shared expert), how many experts it routes to and among how
    # many; None / 0 for a dense model. Not compared: a profile's model (written before them, or a plan's `arch`
    # model, which has none) is the same architecture
    token_intermediate: int | None = field(default=None, compare=False)
    experts_per_token: int = field(default=0, compare=False)
    experts: int = field(default=0, compare=False)
    # a MoE's sparse layers as its weights hold them, for LoRA's adapters (`rlctl.profiler.traincost.lora_params`: one
    # on each expert's projections, a shared expert's, a dense layer's): an expert's MLP width (HF's
    # moe_intermediate_size), a shared expert's (0: none) and how many layers have a dense MLP of `intermediate`
    expert_intermediate: int = field(default=0, compare=False)
    shared_expert_intermediate: int = field(default=0, compare=False)
    dense_layers: int = field(default=0, compare=False)
    # Qwen3's and Qwen3MoE's per-head RMSNorms of q and k before RoPE (q_norm, k_norm), for its activations
    # (`rlctl.profiler.actmem`); not compared, as the MoE figures
    qk_norm: bool = field(default=False, compare=False)
    # HF's tie_word_embeddings: lm_head computes with the embedding's weight (counted once in `params`), so autocast's
    # bf16 copy of it is kept for the backward like every other matmul weight's (`rlctl.profiler.actmem`); not compared
    tied: bool = field(default=False, compare=False)

    @property
    def active(self) -> float:
        """The parameters a token's FLOPs are of (`active_params`, else `params`)."""
        return self.params if self.active_params is None else self.active_params

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden // self.heads

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer, bf16."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param


# Qwen3-30B-A3B and Qwen3-235B-A22B (Qwen3MoeForCausalLM): 128 experts (of 768 and 1536) in each of their 48 and 94
# layers, top 8 a token; their intermediate the config's dense width (no layer of them dense). Parameters:
# transformers' count on the meta device, and of them the router and 8 experts a token computes with in each layer. A
# token's MLP width: 8 × 768 and 8 × 1536
_QWEN3_MOE: dict[str, Any] = {
    "explicit_head_dim": 128,
    "max_positions": 40960,
    "experts_per_token": 8,
    "experts": 128,
    "qk_norm": True,
}
QWEN3_30B_A3B = {
    **_QWEN3_MOE,
    "active_params": 3_353_032_704,
    "token_intermediate": 8 * 768,
    "expert_intermediate": 768,
}
QWEN3_235B_A22B = {
    **_QWEN3_MOE,
    "active_params": 22_190_763_520,
    "token_intermediate": 8 * 1536,
    "expert_intermediate": 1536,
}
# Qwen1.5-MoE-A2.7B and Qwen2-57B-A14B (Qwen2MoeForCausalLM): 60 experts of 1408, top 4, and 64 of 2560, top 8, in each
# of their 24 and 28 layers, beside a shared expert of 5632 and 20480 every token runs (gated); their intermediate the
# config's dense width (no layer of them dense). max_positions: the base models' config.json (Qwen1.5-MoE-A2.7B-Chat's
# says 32768). Parameters as for Qwen3's: transformers' count on the meta device, and the active ones of it. A token's
# MLP width: its top-k experts' and the shared expert's, 4 × 1408 + 5632 and 8 × 2560 + 20480
QWEN15_MOE_A27B: dict[str, Any] = {
    "max_positions": 8192,
    "active_params": 2_689_173_504,
    "token_intermediate": 4 * 1408 + 5632,
    "experts_per_token": 4,
    "experts": 60,
    "expert_intermediate": 1408,
    "shared_expert_intermediate": 5632,
}
QWEN2_57B_A14B: dict[str, Any] = {
    "max_positions": 131072,
    "active_params": 14_249_270_784,
    "token_intermediate": 8 * 2560 + 20480,
    "experts_per_token": 8,
    "experts": 64,
    "expert_intermediate": 2560,
    "shared_expert_intermediate": 20480,
}

_QWEN3: dict[str, Any] = {"max_positions": 40960, "qk_norm": True}  # the dense Qwen3s' context and q/k norms

BUILTIN_MODELS: dict[str, ModelArch] = {
    m.name: m
    for m in [
        # max_positions: each base model's published config.json (Qwen2.5's base 131072, its Instruct's 32768)
        ModelArch("qwen2.5-7b", 28, 3584, 28, 4, 152064, 18944, 7.62e9, max_positions=131072),
        ModelArch("qwen2.5-32b", 64, 5120, 40, 8, 152064, 27648, 32.8e9, max_positions=131072),
        ModelArch("qwen2.5-72b", 80, 8192, 64, 8, 152064, 29568, 72.7e9, max_positions=131072),
        # their config.json's figures; params as the architecture counts them (Qwen3's q/k norms, 4B's tied embeddings)
        ModelArch("qwen3-4b", 36, 2560, 32, 8, 151936, 9728, 4.02e9, explicit_head_dim=128, tied=True, **_QWEN3),
        ModelArch("qwen3-8b", 36, 4096, 32, 8, 151936, 12288, 8.19e9, **_QWEN3),
        ModelArch("qwen3-14b", 40, 5120, 40, 8, 151936, 17408, 14.77e9, **_QWEN3),
        ModelArch("qwen3-32b", 64, 5120, 64, 8, 151936, 25600, 32.76e9, explicit_head_dim=128, **_QWEN3),
        ModelArch("llama3.1-8b", 32, 4096, 32, 8, 128256, 14336, 8.03e9, max_positions=131072),
        ModelArch("llama3.1-70b", 80, 8192, 64, 8, 128256, 28672, 70.55e9, max_positions=131072),
        ModelArch("mistral-7b", 32, 4096, 32, 8, 32768, 14336, 7.25e9, max_positions=32768),  # v0.3 (no sliding window)
        ModelArch(
            "mistral-nemo-12b", 40, 5120, 32, 8, 131072, 14336, 12.25e9, explicit_head_dim=128, max_positions=1024000
        ),
        ModelArch("phi4-14b", 40, 5120, 40, 10, 100352, 17920, 14.66e9, max_positions=16384),  # Phi3ForCausalLM, untied
        ModelArch("qwen3-30b-a3b", 48, 2048, 32, 4, 151936, 6144, 30_532_122_624, **QWEN3_30B_A3B),
        ModelArch("qwen3-235b-a22b", 94, 4096, 64, 4, 151936, 12288, 235_093_634_560, **QWEN3_235B_A22B),
        ModelArch("qwen1.5-moe-a2.7b", 24, 2048, 16, 16, 151936, 5632, 14_315_784_192, **QWEN15_MOE_A27B),
        ModelArch("qwen2-57b-a14b", 28, 3584, 28, 4, 151936, 18944, 57_408_658_944, **QWEN2_57B_A14B),
        # The embedded CPU engine's demo model (rlctl/models/tinygpt.py): Llama architecture, fp32,
        # 3 heads of 32 (vLLM's CPU attention supports head sizes 32, 64, 80, …; not 24)
        # (its positions TinyGPTConfig's default max_position_embeddings)
        ModelArch("tiny-demo", 3, 96, 3, 3, 66, 256, 3.4512e5, bytes_per_param=4, max_positions=320),
    ]
}
