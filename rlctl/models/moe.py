"""A Qwen3MoE's routed experts as its config.json says them (`MoeConfig`, Qwen3MoeConfig's keys and defaults) and
read (`parse_moe`, called by `rlctl.models.hf` for a Qwen3MoeForCausalLM); the model's layer is
`rlctl.models.tinygpt.SparseMoE`. Imports no torch."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from rlctl.errors import ConfigError


@dataclass(frozen=True)
class MoeConfig:
    """A Qwen3MoE's sparse MLP (Qwen3MoeConfig's keys and defaults): in each sparse layer (`sparse`) a router
    `mlp.gate` [num_experts, hidden] whose softmax's top `num_experts_per_tok` experts (renormalised to sum 1 where
    `norm_topk_prob`) each run a SwiGLU MLP of `moe_intermediate_size` on the token, summed by those weights; the other
    layers a dense MLP of `intermediate_size`. No shared expert (Qwen2-MoE's, refused with its architecture; a
    Qwen3MoE's `shared_expert_intermediate_size`, which vLLM would build one of, refused: `parse_moe`).

    The load-balancing loss: where `output_router_logits` is true the torch trainer's loss adds `router_aux_loss_coef`
    × transformers' `load_balancing_loss_func` over each forward pass's real tokens, as Qwen3MoeForCausalLM's does
    (`rlctl.models.moeloss`, `rlctl.rl.grpo`). Qwen3MoeConfig's default, and the published checkpoints', is false: an
    RL step's loss is then the policy's alone, as verl trains (its megatron path sets `moe_router_load_balancing_type`
    "none", "default None for RL"). To train with it, set `"output_router_logits": true` (and the coefficient, 0.001
    where left out) in the model's config.json."""

    num_experts: int = 128
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 768
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    router_aux_loss_coef: float = 0.001
    output_router_logits: bool = False

    def sparse(self, layer: int) -> bool:
        """Layer `layer` (from 0) has the experts: Qwen3MoeDecoderLayer's rule, `mlp_only_layers` first."""
        every = (layer + 1) % self.decoder_sparse_step == 0
        return layer not in self.mlp_only_layers and self.num_experts > 0 and every

    def to_hf(self) -> dict[str, Any]:
        """config.json's keys (`num_experts`, as published checkpoints and transformers 4 and 5 read it; transformers 5
        writes it as `num_local_experts`, read too)."""
        return {**asdict(self), "mlp_only_layers": list(self.mlp_only_layers)}


def parse_moe(d: Mapping[str, Any], bad: Callable[[str, str], ConfigError], num: Callable[..., Any]) -> MoeConfig:
    """A Qwen3MoE config.json's `MoeConfig` as Qwen3MoeConfig reads it (its defaults where a key is left out;
    `num_local_experts`, what transformers 5 writes, as `num_experts`)."""
    experts = d.get("num_experts", d.get("num_local_experts", 128))
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
    shared = d.get("shared_expert_intermediate_size", 0)
    if type(shared) is int and shared > 0:  # (vLLM's Qwen3MoeSparseMoeBlock builds one where it is > 0)
        why = "vLLM's Qwen3MoE adds a shared expert of that size, transformers' and rlctl's none; give 0 or drop it"
        raise bad("shared_expert_intermediate_size", f"{shared} is not supported: {why}")
    if shared != 0 or type(shared) is not int:
        raise bad("shared_expert_intermediate_size", f"{shared!r} is not supported; supported: 0 (no shared expert)")
    dense = d.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(type(n) is int and n >= 0 for n in dense):
        raise bad("mlp_only_layers", f"{dense!r} is not a list of layer numbers (from 0)")
    moe = MoeConfig(
        num_experts=experts,
        num_experts_per_tok=num("num_experts_per_tok", 8),
        moe_intermediate_size=num("moe_intermediate_size", 768),
        norm_topk_prob=flags["norm_topk_prob"],
        decoder_sparse_step=num("decoder_sparse_step", 1),
        mlp_only_layers=tuple(dense),
        router_aux_loss_coef=float(coef),
        output_router_logits=flags["output_router_logits"],
    )
    if experts and moe.num_experts_per_tok > experts:
        raise bad("num_experts_per_tok", f"{moe.num_experts_per_tok} is more than num_experts {experts}")
    return moe
