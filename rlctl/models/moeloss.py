"""A Qwen3MoE's or Qwen2MoE's load-balancing loss, the auxiliary loss its router trains with where its config.json sets
`output_router_logits` (transformers' `load_balancing_loss_func`, Switch Transformer's eqs. 4–6), over one forward
pass's real tokens (of the routers' logits: a Qwen2MoE's shared expert, which every token runs, takes no part):

    f_e = (top-k choices of expert e) / (L · T)      over the L sparse layers and the T real tokens (not gradient)
    P_e = (Σ softmax probability of e)  / (L · T)    the router's, with its gradient
    aux = num_experts · Σ_e f_e · P_e                (1 × top_k where every expert is chosen equally, more when not)

and `balanced(model)`, the MoE config of a model that trains with it. The trainer's loss adds
`router_aux_loss_coef` × aux of each micro-batch (`rlctl.rl.grpo.policy_loss`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from rlctl.models.moe import MoeConfig
from rlctl.models.tinygpt import TinyGPT


def balanced(model: nn.Module) -> MoeConfig | None:
    """The MoE config of `model` where its loss takes the load-balancing term: a TinyGPT Qwen3MoE or Qwen2MoE (sharded
    by FSDP2 or with LoRA adapters alike) whose config.json says `output_router_logits` true, as Qwen3MoeForCausalLM
    and Qwen2MoeForCausalLM add it to the loss; None otherwise (a dense model, `output_router_logits` false, their
    config classes' default)."""
    moe = model.config.moe if isinstance(model, TinyGPT) else None
    return moe if moe is not None and moe.output_router_logits and moe.num_experts > 0 else None


def load_balancing_loss(
    router_logits: Sequence[torch.Tensor], real: torch.Tensor, *, num_experts: int, top_k: int
) -> torch.Tensor:
    """aux over the tokens where `real` is true ([B, T]; `router_logits`: each sparse layer's [B·T, num_experts], as
    `TinyGPT.forward(..., router_logits=True)` gives them): transformers' `load_balancing_loss_func` with the pass's
    attention mask, whose padding counts in neither sum. The softmax is in fp32 (transformers': the logits' dtype; the
    same in fp32). 0 where no token is real (transformers': 0 / 0)."""
    m = real.reshape(-1).to(torch.float32)
    device = m.device
    chosen_sum = torch.zeros(num_experts, dtype=torch.float32, device=device)
    prob_sum = torch.zeros(num_experts, dtype=torch.float32, device=device)
    for logits in router_logits:
        p = F.softmax(logits, dim=-1, dtype=torch.float32)
        with torch.no_grad():
            chosen = torch.topk(p, top_k, dim=-1).indices.reshape(-1)
            chosen_sum += torch.zeros_like(chosen_sum).scatter_add_(0, chosen, m.repeat_interleave(top_k))
        prob_sum = prob_sum + (p * m[:, None]).sum(dim=0)
    rows = (m.sum() * len(router_logits)).clamp(min=1.0)
    return num_experts * ((chosen_sum / rows) * (prob_sum / rows)).sum()
