"""The core attention of rlctl's megatron layer spec: torch's scaled_dot_product_attention.

    query [sq, b, np, hn], key/value [sk, b, ng, hn] ─▶ SDPA (causal, GQA) ─▶ context [sq, b, np·hn]

Megatron's local `DotProductAttention` materialises the [b·np, sq, sk] score matrix (baddbmm, masked
softmax, bmm): O(s²) memory per layer and a rounding order of its own. SDPA is what `transformers` runs by
default (its `sdpa` attention) and what the embedded engine's model runs: a fused kernel on CPU (flash
attention's blocking, no score matrix kept for backward) and the GPU's flash/memory-efficient kernels. With
it the trainer's fp32 logits are the ones transformers computes, up to the order of its own additions.

Causal self-attention only, as the GPT layer spec builds it: the mask comes from the layer's
`attn_mask_type` (`is_causal`), and the causal mask the caller passes is not read (right padding is
harmless, as in the rest of the model). Grouped-query attention repeats each key/value group over its
query heads, as transformers' `repeat_kv` does. No dropout (rlctl's config sets every dropout to 0), no
packed sequences, no attention bias, no context parallel: each is refused where it would be used.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from rlctl.trainers.megatron.model import import_megatron


def sdpa_attention() -> type:
    """The SDPA core-attention class (a DotProductAttention subclass, so megatron builds it like its own)."""
    import_megatron()
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    class SdpaAttention(DotProductAttention):
        def forward(
            self,
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            attention_mask: torch.Tensor | None,
            attn_mask_type: Any = None,
            attention_bias: torch.Tensor | None = None,
            packed_seq_params: Any = None,
        ) -> torch.Tensor:
            del attention_mask  # causal by construction: the layer's attn_mask_type says so
            if packed_seq_params is not None or attention_bias is not None:
                raise ValueError("rlctl's SDPA attention takes neither packed sequences nor an attention bias")
            if (attn_mask_type or self.attn_mask_type) != AttnMaskType.causal:
                raise ValueError(f"rlctl's SDPA attention is causal only, not {attn_mask_type or self.attn_mask_type}")
            sq, b, heads, hn = query.shape
            groups = key.shape[2]
            q = query.permute(1, 2, 0, 3)  # [b, np, sq, hn]
            k, v = key.permute(1, 2, 0, 3), value.permute(1, 2, 0, 3)  # [b, ng, sk, hn]
            if heads != groups:
                k = k.repeat_interleave(heads // groups, dim=1)
                v = v.repeat_interleave(heads // groups, dim=1)
            context = F.scaled_dot_product_attention(q, k, v, is_causal=sq > 1, scale=self.softmax_scale)
            return context.permute(2, 0, 1, 3).reshape(sq, b, heads * hn)

    return SdpaAttention
