"""Tiny random Llama checkpoints with RoPE scaling, built and saved with `transformers` (its LlamaForCausalLM is the
oracle of rlctl's scaled RoPE). Import only after `pytest.importorskip("transformers")`."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

HEAD_DIM, THETA = 32, 10000.0  # frequencies 10^(-i/4): each llama3 band holds some at both contexts below (`bands`)
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
LLAMA31 = {**LLAMA3, "factor": 8.0, "original_max_position_embeddings": 8192}  # Llama 3.1's, megatron-core's only
LINEAR = {"rope_type": "linear", "factor": 4.0}
# YaRN as Qwen2.5/Qwen3 say it (their pretraining context 32768, here 32: the ramp spans frequency indices 0 to 3 of
# 16); then with each of its optional keys, and with an attention factor of its own
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
YARN_TUNED = {**YARN, "beta_fast": 8.0, "beta_slow": 2.0, "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": False}
YARN_ATTENTION = {**YARN, "attention_factor": 1.3}
YARN_8 = {**YARN_TUNED, "original_max_position_embeddings": 8}  # the megatron tests' 24 positions run past 8


def with_rope(directory: Path, rope: dict[str, Any]) -> Path:
    """`directory`'s checkpoint (written by transformers 5: `rope_parameters`) rescaled by `rope`, θ kept."""
    config = json.loads((directory / "config.json").read_text())
    config["rope_parameters"] |= rope
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def bands(rope: dict[str, Any]) -> set[str]:
    """Which of llama3's cases the frequencies θ^(-2i/d) fall in: a wavelength 2π/freq shorter than the pretraining
    context ÷ high_freq_factor (kept), longer than it ÷ low_freq_factor (÷ factor), or between."""
    turns = [rope["original_max_position_embeddings"] * THETA ** (-i / HEAD_DIM) / (2 * math.pi)
             for i in range(0, HEAD_DIM, 2)]  # fmt: skip
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    return {"kept" if t > high else "divided" if t < low else "between" for t in turns}


# the tiny models' shape: hidden 64, 2 layers, 2 heads of 32, 1 KV head
SHAPE = {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1}  # fmt: skip


def _drawn(model_class: Any, config: Any, seed: int) -> Any:
    """A `model_class` of `config` in eval mode, its weights drawn wider than HF's init (norms 1 ± 0.1, the rest
    0.2·N(0, 1), from `seed`), so that the logits are far from uniform."""
    torch.manual_seed(seed)
    model = model_class(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g) if name.endswith("norm.weight") else
                    0.2 * torch.randn(p.shape, generator=g))  # fmt: skip
    return model


def llama(
    rope: dict[str, Any] | None,
    directory: Path,
    *,
    legacy: bool = False,
    seed: int = 0,
    qwen2: bool = False,
    positions: int = 128,
) -> Any:
    """A random fp32 LlamaForCausalLM (`qwen2`: Qwen2ForCausalLM, biased q/k/v) (hidden 64, 2 layers, head 32,
    `positions` max_position_embeddings) saved with transformers' own save_pretrained, which writes transformers
    5's `rope_parameters` (θ inside); `legacy`: config.json rewritten as Llama 3.1's and Qwen2.5's files have it
    (`rope_scaling`, θ beside it). Returns the model."""
    import transformers

    prefix = "Qwen2" if qwen2 else "Llama"
    config = getattr(transformers, f"{prefix}Config")(
        **SHAPE,
        max_position_embeddings=positions,
        rope_theta=THETA,
        rope_scaling=dict(rope) if rope else None,
    )
    model = _drawn(getattr(transformers, f"{prefix}ForCausalLM"), config, seed)
    model.save_pretrained(directory)
    cfg = json.loads((directory / "config.json").read_text())
    assert cfg["rope_parameters"]["rope_theta"] == THETA and "rope_scaling" not in cfg
    if legacy:
        del cfg["rope_parameters"]
        cfg |= {"rope_theta": THETA, **({"rope_scaling": dict(rope)} if rope else {})}
        (directory / "config.json").write_text(json.dumps(cfg))
    return model


LONGROPE_CONTEXT = 32  # the tiny Phi3s' original_max_position_embeddings (Phi-3.5-mini's and Phi-4-mini's 4096)


def longrope(frequencies: int, *, seed: int = 0, **extra: Any) -> dict[str, Any]:
    """A longrope entry as the Phi-3/Phi-4-mini files say it (`type`), of `frequencies` numbers each: short_factor
    near 1 (theirs 1 … 1.3), long_factor 2 … 8 (theirs 1 … 60), so that the two passes compute far apart."""
    g = torch.Generator().manual_seed(seed)
    short = [round(1 + 0.5 * float(x), 4) for x in torch.rand(frequencies, generator=g)]
    long = [round(2 + 6 * float(x), 4) for x in torch.rand(frequencies, generator=g)]
    return {"type": "longrope", "short_factor": short, "long_factor": long, **extra}


def phi3(
    directory: Path, *, partial: float = 1.0, legacy: bool = False, seed: int = 0, scaled: bool = True, **extra: Any
) -> Any:
    """A random fp32 Phi3ForCausalLM with longrope (hidden 64, 2 heads of 32, 1 KV head, 128 positions, pretrained
    on 32, `extra` keys in its entry; not `scaled`: default RoPE, no rope_scaling), RoPE on `partial` of each head
    (Phi-4-mini's 0.75), saved by transformers 5 (`rope_parameters`; `legacy`: rewritten as the Phi-3/Phi-4-mini files
    have it, `rope_scaling` with θ, original_max_position_embeddings and partial_rotary_factor at the top). Returns
    the model."""
    import transformers

    rope = longrope(int(HEAD_DIM * partial) // 2, seed=seed, **extra) if scaled else None
    config = transformers.Phi3Config(
        **SHAPE,
        max_position_embeddings=128,
        original_max_position_embeddings=LONGROPE_CONTEXT,
        rope_theta=THETA,
        partial_rotary_factor=partial,
        pad_token_id=0,
        eos_token_id=2,
        rope_scaling=None if rope is None else dict(rope),
    )
    model = _drawn(transformers.Phi3ForCausalLM, config, seed)
    model.save_pretrained(directory)
    cfg = json.loads((directory / "config.json").read_text())
    assert cfg["rope_parameters"]["rope_type"] == ("longrope" if scaled else "default")
    assert cfg["original_max_position_embeddings"] == 32
    if legacy:
        del cfg["rope_parameters"]
        cfg |= {"rope_theta": THETA, "rope_scaling": rope, "partial_rotary_factor": partial}
        (directory / "config.json").write_text(json.dumps(cfg))
    return model
