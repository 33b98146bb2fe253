"""A Qwen MoE's experts as its config.json says them (`MoeConfig`, Qwen3MoeConfig's and Qwen2MoeConfig's keys and
defaults) and read (`parse_moe`, called by `rlctl.models.hf` for a Qwen3MoeForCausalLM or a Qwen2MoeForCausalLM); the
model's layer is `rlctl.models.tinygpt.SparseMoE`. Imports no torch."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from rlctl.errors import ConfigError


@dataclass(frozen=True)
class MoeConfig:
    """A Qwen MoE's sparse MLP (Qwen3MoeConfig's keys and defaults): in each sparse layer (`sparse`) a router
    `mlp.gate` [num_experts, hidden] whose softmax's top `num_experts_per_tok` experts (renormalised to sum 1 where
    `norm_topk_prob`) each run a SwiGLU MLP of `moe_intermediate_size` on the token, summed by those weights; the other
    layers a dense MLP of `intermediate_size`. A Qwen2MoE's (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B: `QWEN2_MOE_DEFAULTS`)
    adds to that sum a shared expert, a SwiGLU MLP of `shared_expert_intermediate_size` every token runs, its output
    times sigmoid(`mlp.shared_expert_gate` [1, hidden] · x); a Qwen3MoE has none (0: a Qwen3MoE's
    `shared_expert_intermediate_size`, which vLLM would build one of and transformers not, refused: `parse_moe`).

    The load-balancing loss: where `output_router_logits` is true the torch trainer's loss adds `router_aux_loss_coef`
    × transformers' `load_balancing_loss_func` over each forward pass's real tokens, as Qwen3MoeForCausalLM's and
    Qwen2MoeForCausalLM's do (of the router's logits; the shared expert's gate takes no part: `rlctl.models.moeloss`,
    `rlctl.rl.grpo`). Their config classes' default, and the published checkpoints', is false: an RL step's loss is
    then the policy's alone, as verl trains (its megatron path sets `moe_router_load_balancing_type` "none", "default
    None for RL"). To train with it, set `"output_router_logits": true` (and the coefficient, 0.001 where left out) in
    the model's config.json."""

    num_experts: int = 128
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 768
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    router_aux_loss_coef: float = 0.001
    output_router_logits: bool = False
    shared_expert_intermediate_size: int = 0  # a Qwen2MoE's shared expert (> 0); 0: none (a Qwen3MoE)

    def sparse(self, layer: int) -> bool:
        """Layer `layer` (from 0) has the experts: Qwen3MoeDecoderLayer's (and Qwen2MoeDecoderLayer's) rule,
        `mlp_only_layers` first."""
        every = (layer + 1) % self.decoder_sparse_step == 0
        return layer not in self.mlp_only_layers and self.num_experts > 0 and every

    def to_hf(self) -> dict[str, Any]:
        """config.json's keys (`num_experts`, as published checkpoints and transformers 4 and 5 read it; transformers 5
        writes a Qwen3MoE's as `num_local_experts`, read too); `shared_expert_intermediate_size` where there is one."""
        d = {**asdict(self), "mlp_only_layers": list(self.mlp_only_layers)}
        if not self.shared_expert_intermediate_size:
            del d["shared_expert_intermediate_size"]
        return d


# Qwen2MoeConfig's defaults (Qwen1.5-MoE-A2.7B's figures) where they are not Qwen3MoeConfig's
QWEN2_MOE_DEFAULTS = MoeConfig(
    num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408, shared_expert_intermediate_size=5632
)


def parse_moe(
    d: Mapping[str, Any], bad: Callable[[str, str], ConfigError], num: Callable[..., Any], *, shared: bool = False
) -> MoeConfig:
    """A Qwen3MoE config.json's `MoeConfig` as Qwen3MoeConfig reads it (its defaults where a key is left out;
    `num_local_experts`, what transformers 5 writes, as `num_experts`), or (`shared`) a Qwen2MoE's as Qwen2MoeConfig
    reads it (`QWEN2_MOE_DEFAULTS`; `num_experts` only, and a shared expert of a positive width)."""
    base = QWEN2_MOE_DEFAULTS if shared else MoeConfig()
    if shared and "num_local_experts" in d:  # (Qwen2MoeConfig has no such name: it would read num_experts's default)
        raise bad("num_local_experts", "is not a Qwen2MoeConfig key (it reads num_experts); give num_experts")
    experts = d.get("num_experts", d.get("num_local_experts", base.num_experts))
    if "num_experts" in d and "num_local_experts" in d and d["num_local_experts"] != experts:
        raise bad("num_local_experts", f"{d['num_local_experts']!r} is not num_experts {experts!r}; keep one")
    if type(experts) is not int or experts < 0:
        key = "num_experts" if "num_experts" in d else "num_local_experts"
        raise bad(key, f"{experts!r} is not a number of experts")
    flags = {}
    for key in ("norm_topk_prob", "output_router_logits"):
        flags[key] = d.get(key, False)
        if not isinstance(flags[key], bool):
            raise bad(key, f"{flags[key]!r} is not true or false")
    coef = d.get("router_aux_loss_coef", 0.001)
    if isinstance(coef, bool) or not isinstance(coef, int | float) or coef < 0:
        raise bad("router_aux_loss_coef", f"{coef!r} is not a number ≥ 0")
    width = (
        num("shared_expert_intermediate_size", base.shared_expert_intermediate_size) if shared else _no_shared(d, bad)
    )
    dense = d.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(type(n) is int and n >= 0 for n in dense):
        raise bad("mlp_only_layers", f"{dense!r} is not a list of layer numbers (from 0)")
    moe = MoeConfig(
        num_experts=experts,
        num_experts_per_tok=num("num_experts_per_tok", base.num_experts_per_tok),
        moe_intermediate_size=num("moe_intermediate_size", base.moe_intermediate_size),
        norm_topk_prob=flags["norm_topk_prob"],
        decoder_sparse_step=num("decoder_sparse_step", 1),
        mlp_only_layers=tuple(dense),
        router_aux_loss_coef=float(coef),
        output_router_logits=flags["output_router_logits"],
        shared_expert_intermediate_size=width,
    )
    if experts and moe.num_experts_per_tok > experts:
        raise bad("num_experts_per_tok", f"{moe.num_experts_per_tok} is more than num_experts {experts}")
    return moe


def _no_shared(d: Mapping[str, Any], bad: Callable[[str, str], ConfigError]) -> int:
    """A Qwen3MoE's `shared_expert_intermediate_size`: 0 or left out (vLLM's Qwen3MoeSparseMoeBlock builds a shared
    expert where it is > 0, transformers' none)."""
    shared = d.get("shared_expert_intermediate_size", 0)
    if type(shared) is int and shared > 0:
        why = "vLLM's Qwen3MoE adds a shared expert of that size, transformers' and rlctl's none; give 0 or drop it"
        raise bad("shared_expert_intermediate_size", f"{shared} is not supported: {why}")
    if shared != 0 or type(shared) is not int:
        raise bad("shared_expert_intermediate_size", f"{shared!r} is not supported; supported: 0 (no shared expert)")
    return 0
