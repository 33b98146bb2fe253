"""The RoPE scaling megatron-core 0.16.1's GPTModel runs, from an HF config's (`hf.RopeScaling`), and the models it
is not built for (`moe_refusal`); imports nothing heavy, so that `rlctl check` refuses here what the trainer could not
build.

    none     rotary_base θ alone
    linear   seq_len_interpolation_factor = factor (positions ÷ factor: the frequencies' ÷ factor)
    llama3   rope_scaling=True, rope_scaling_factor = factor; its low/high frequency factors and pretraining context
             are fixed in RotaryEmbedding._apply_scaling at Llama 3.1's (1, 4, 8192): a config with others is refused
    longrope refused (megatron-core has none; the torch backend runs it)

RoPE on part of each head (a Phi3's partial_rotary_factor, Phi-4-mini's 0.75) is GPTModel's `rotary_percent`:
RotaryEmbedding's frequencies over int(head_dim × fraction) dimensions, which `_apply_rotary_pos_emb_bshd` rotates
(rotate_half within them) and the rest passed as they are, as transformers' Phi3 does. rlctl reads that fraction for
a Phi3 alone, whose RoPE is default or longrope, so no other scaling meets it here.
    yarn     position_embedding_type 'yarn' (YarnRotaryEmbedding: transformers' ramp, defaults and truncation), its
             numbers read off the TransformerConfig as `yarn_*` attributes (`yarn_config`: no config class of
             megatron-core declares them); cos and sin × the attention factor megatron-core computes from factor,
             mscale and mscale_all_dim (in Attention), so an `attention_factor` other than that is refused
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlctl.models.hf import MOE_ARCHITECTURES, TinyGPTConfig
from rlctl.models.rope import YARN_BETA_FAST, YARN_BETA_SLOW, resolved

MEGATRON_LLAMA3 = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def rope_args(c: TinyGPTConfig) -> dict[str, Any]:
    """GPTModel's keyword arguments for `c`'s RoPE scaling; ValueError (one line) for a scaling it cannot run."""
    s = c.rope_scaling
    if s is not None and s.kind == "longrope":
        raise ValueError(
            "RoPE 'longrope' (short_factor and long_factor per frequency) is not in megatron-core 0.16.1; use "
            "trainer.backend 'torch' for this model"
        )
    if c.partial_rotary_factor != 1:  # (the loaders take it for a Phi3 alone: default RoPE or longrope)
        assert s is None, s
        return {"position_embedding_type": "rope", "rotary_percent": c.partial_rotary_factor}
    if s is None:
        return {"position_embedding_type": "rope"}
    s = resolved(s, c.max_position_embeddings)  # (llama3's and yarn's pretraining context set)
    assert s is not None
    if s.kind == "linear":
        return {"position_embedding_type": "rope", "seq_len_interpolation_factor": s.factor}
    if s.kind == "yarn":
        computed = dataclasses.replace(s, attention_factor=None).attention_scaling()
        if s.attention_factor is not None and s.attention_factor != computed:
            raise ValueError(
                f"RoPE 'yarn' with attention_factor {s.attention_factor:g}: megatron-core computes it from factor, "
                f"mscale and mscale_all_dim ({computed:g} here); use trainer.backend 'torch' for this model"
            )
        return {"position_embedding_type": "yarn"}
    have = {k: getattr(s, k) for k in MEGATRON_LLAMA3}
    if have != MEGATRON_LLAMA3:
        said = ", ".join(f"{k} {v:g}" for k, v in have.items())
        fixed = ", ".join(f"{v:g}" for v in MEGATRON_LLAMA3.values())
        raise ValueError(
            f"RoPE 'llama3' with {said}: megatron-core fixes these at Llama 3.1's ({fixed}); use trainer.backend "
            "'torch' for this model"
        )
    return {"position_embedding_type": "rope", "rope_scaling": True, "rope_scaling_factor": s.factor}


def yarn_config(c: TinyGPTConfig) -> dict[str, Any]:
    """The attributes GPTModel (building YarnRotaryEmbedding) and Attention (its cos/sin factor) read off the
    TransformerConfig for RoPE 'yarn'; {} for the others. mscale and mscale_all_dim go in only where both are given:
    transformers' factor is 0.1·ln(factor) + 1 otherwise, megatron-core's too where either is None."""
    s = resolved(c.rope_scaling, c.max_position_embeddings)
    if s is None or s.kind != "yarn":
        return {}
    both = s.mscale is not None and s.mscale_all_dim is not None
    return {
        "yarn_rotary_scaling_factor": s.factor,
        "yarn_original_max_position_embeddings": s.original_max_position_embeddings,
        "yarn_beta_fast": YARN_BETA_FAST if s.beta_fast is None else s.beta_fast,
        "yarn_beta_slow": YARN_BETA_SLOW if s.beta_slow is None else s.beta_slow,
        "yarn_mscale": s.mscale if both else None,
        "yarn_mscale_all_dim": s.mscale_all_dim if both else None,
        "yarn_correction_range_round_to_int": s.truncate is not False,
    }


def moe_refusal(c: TinyGPTConfig) -> None:
    """ValueError (one line) for a Qwen3MoE or Qwen2MoE: rlctl builds megatron-core's dense GPTModel only (no MoE
    layers, router or expert weights' names), so `c`'s experts would not be what it trains."""
    if c.moe is not None:
        name = MOE_ARCHITECTURES[c.architecture]
        raise ValueError(
            f"a {name}'s experts (rlctl builds megatron-core's dense GPTModel only); use trainer.backend 'torch'"
        )
