"""The RoPE scaling megatron-core 0.16.1's GPTModel runs, from an HF config's (`hf.RopeScaling`), and the models it
is not built for (`moe_refusal`); imports nothing heavy, so that `rlctl check` refuses here what the trainer could not
build.

    none     rotary_base θ alone
    linear   seq_len_interpolation_factor = factor (positions ÷ factor: the frequencies' ÷ factor)
    llama3   rope_scaling=True, rope_scaling_factor = factor; its low/high frequency factors and pretraining context
             are fixed in RotaryEmbedding._apply_scaling at Llama 3.1's (1, 4, 8192): a config with others is refused
"""

from __future__ import annotations

from typing import Any

from rlctl.models.hf import TinyGPTConfig

MEGATRON_LLAMA3 = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def rope_args(c: TinyGPTConfig) -> dict[str, Any]:
    """GPTModel's keyword arguments for `c`'s RoPE scaling; ValueError (one line) for llama3 bands it cannot run."""
    s = c.rope_scaling
    if s is None:
        return {}
    if s.kind == "linear":
        return {"seq_len_interpolation_factor": s.factor}
    have = {k: getattr(s, k) for k in MEGATRON_LLAMA3}
    if have != MEGATRON_LLAMA3:
        said = ", ".join(f"{k} {v:g}" for k, v in have.items())
        fixed = ", ".join(f"{v:g}" for v in MEGATRON_LLAMA3.values())
        raise ValueError(
            f"RoPE 'llama3' with {said}: megatron-core fixes these at Llama 3.1's ({fixed}); use trainer.backend "
            "'torch' for this model"
        )
    return {"rope_scaling": True, "rope_scaling_factor": s.factor}


def moe_refusal(c: TinyGPTConfig) -> None:
    """ValueError (one line) for a Qwen3MoE: rlctl builds megatron-core's dense GPTModel only (no MoE layers, router or
    expert weights' names), so `c`'s experts would not be what it trains."""
    if c.moe is not None:
        raise ValueError(
            "a Qwen3MoE's experts (rlctl builds megatron-core's dense GPTModel only); use trainer.backend 'torch'"
        )
