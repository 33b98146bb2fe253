"""Tiny Hugging Face checkpoints built with `transformers` (weights cannot be downloaded on these machines).

Each variant exercises a part of the HF format the embedded model must read: Qwen2's q/k/v bias
with tied embeddings and a 32-wide head, Llama with an explicit 64-wide head (≠ hidden/heads) and
several EOS ids, Llama with `attention_bias`, Qwen3's per-head q/k norms with a 32-wide head (≠ hidden/heads),
tied or untied with `attention_bias`, Mistral (Llama without biases) with Nemo's explicit head_dim and no sliding
window, and with a sliding window as long as its context (which never binds); Phi3 (q/k/v and gate/up fused in its
file) with grouped-query attention, and tied with a window as long as its context; and windows that bind, Mistral
v0.1's and Phi-3-mini-4k's (`WINDOWED`). Weights are redrawn wider than HF's init (std 0.02 gives near-uniform
logits, where greedy comparisons would hinge on ties) and biases and norm weights are made non-trivial so that they
are checked too. Import `transformers` only after `pytest.importorskip("transformers")`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rlctl.errors import ConfigError
from rlctl.models import hf
from rlctl.models.hf import TinyGPTConfig
from rlctl.models.hfdir import check_hf_dir
from rlctl.models.hfnames import fused_for_file
from rlctl.models.tinygpt import TinyGPT

COMMON: dict[str, Any] = {
    "vocab_size": 96,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
}
VARIANTS: dict[str, dict[str, Any]] = {
    "qwen2-tied-hd32": {
        "arch": "qwen2",
        "hidden_size": 64,
        "num_attention_heads": 2,
        "head_dim": 32,
        "num_key_value_heads": 1,
        "tie_word_embeddings": True,
        "eos_token_id": [2, 3],
        "rope_theta": 1000000.0,
    },
    "llama-hd64-eos3": {
        "arch": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "head_dim": 64,
        "num_key_value_heads": 2,
        "tie_word_embeddings": False,
        "eos_token_id": [2, 5, 7],
        "rope_theta": 500000.0,
    },
    "llama-bias-tied": {
        "arch": "llama",
        "hidden_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "attention_bias": True,
        "tie_word_embeddings": True,
        "eos_token_id": 2,
    },
    "qwen3-tied-hd32": {
        "arch": "qwen3",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "head_dim": 32,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
        "eos_token_id": [2, 3],
        "rope_theta": 1000000.0,
    },
    "qwen3-bias-hd32": {
        "arch": "qwen3",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "head_dim": 32,
        "num_key_value_heads": 2,
        "attention_bias": True,
        "tie_word_embeddings": False,
        "eos_token_id": 2,
    },
    "mistral-hd32-nowindow": {  # Nemo's shape: head_dim 128 with hidden 5120 and 32 heads (≠ 160)
        "arch": "mistral",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "head_dim": 32,
        "num_key_value_heads": 2,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "eos_token_id": 2,
        "rope_theta": 1000000.0,
    },
    "mistral-window-unbinding": {  # the window = max_position_embeddings: every earlier position is in it
        "arch": "mistral",
        "hidden_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "sliding_window": 128,
        "tie_word_embeddings": False,
        "eos_token_id": [2, 3],
    },
    "phi3-gqa": {  # Phi-4's grouped-query attention and θ 250000, no window (its file: qkv_proj, gate_up_proj)
        "arch": "phi3",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "head_dim": 32,  # (vLLM's CPU attention runs heads of 32, not 16; Phi3Attention reads head_dim where given)
        "num_key_value_heads": 2,
        "tie_word_embeddings": False,
        "eos_token_id": 2,
        "pad_token_id": None,  # (transformers' embedding leaves its row untrained: padding_idx)
        "rope_theta": 250000.0,
    },
    "phi3-tied-window-unbinding": {  # Phi-4-mini's tied embeddings; a window as long as the context
        "arch": "phi3",
        "hidden_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "sliding_window": 128,
        "tie_word_embeddings": True,
        "eos_token_id": [2, 3],
        "pad_token_id": None,  # (transformers' embedding leaves its row untrained: padding_idx)
    },
}
# Qwen3MoE (Qwen3-30B-A3B's architecture, its file holding each expert's gate/up/down apart, as transformers 5 writes)
# and Qwen2MoE:
# apart from VARIANTS, which the megatron tests run (megatron is refused for a MoE)
MOE: dict[str, dict[str, Any]] = {
    "qwen3moe-dense1-hd32": {  # layer 1 dense (mlp_only_layers), top 2 of 8 not renormalised (Qwen3-30B-A3B's: true)
        "arch": "qwen3_moe",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "head_dim": 32,
        "num_key_value_heads": 2,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "mlp_only_layers": [1],
        "tie_word_embeddings": False,
        "eos_token_id": 2,
        "rope_theta": 1000000.0,
    },
    "qwen3moe-step2-norm-tied": {  # experts in every 2nd layer (decoder_sparse_step), top 3 of 6 renormalised
        "arch": "qwen3_moe",
        "hidden_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_experts": 6,
        "num_experts_per_tok": 3,
        "moe_intermediate_size": 48,
        "norm_topk_prob": True,
        "decoder_sparse_step": 2,
        "tie_word_embeddings": True,
        "eos_token_id": [2, 3],
    },
    # Qwen2MoE (Qwen1.5-MoE-A2.7B's, Qwen2-57B-A14B's: Qwen2's q/k/v bias, and a shared expert beside the routed ones,
    # gated by sigmoid(shared_expert_gate · x)); head_dim hidden / heads, as vLLM's Qwen2MoeAttention reads it
    "qwen2moe-dense1": {  # layer 1 dense (mlp_only_layers), top 2 of 8 not renormalised (Qwen2MoeConfig's default)
        "arch": "qwen2_moe",
        "hidden_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "mlp_only_layers": [1],
        "tie_word_embeddings": False,
        "eos_token_id": 2,
        "rope_theta": 1000000.0,
    },
    "qwen2moe-step2-norm-tied": {  # experts in every 2nd layer, top 3 of 6 renormalised, 48 wide (vLLM's CPU pads it)
        "arch": "qwen2_moe",
        "hidden_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_experts": 6,
        "num_experts_per_tok": 3,
        "moe_intermediate_size": 48,
        "shared_expert_intermediate_size": 80,
        "norm_topk_prob": True,
        "decoder_sparse_step": 2,
        "tie_word_embeddings": True,
        "eos_token_id": [2, 3],
    },
}
# Mistral v0.1's shape (its window 4096 of 32768 positions): a window that binds, so a model of it is built only for
# sequences within it (apart from VARIANTS, whose tests run sequences of 100 tokens)
WINDOWED: dict[str, dict[str, Any]] = {
    "mistral-v01-window16": {
        "arch": "mistral",
        "hidden_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 64,
        "sliding_window": 16,
        "tie_word_embeddings": False,
        "eos_token_id": 2,
    },
    "phi3-mini-window16": {  # Phi-3-mini-4k's window 2047 of 4096 positions
        "arch": "phi3",
        "hidden_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "sliding_window": 16,
        "tie_word_embeddings": False,
        "eos_token_id": 2,
        "pad_token_id": None,  # (transformers' embedding leaves its row untrained: padding_idx)
    },
}


def hf_model(
    variant: str, *, seed: int = 0, num_hidden_layers: int | None = None, pad_token_id: int | None = None
) -> Any:
    """A randomly initialised transformers model of `variant` (with `num_hidden_layers` instead of the
    common 2 when given, and `pad_token_id` where given), fp32, in eval mode."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Phi3Config,
        Phi3ForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen2MoeConfig,
        Qwen2MoeForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    spec = {**COMMON, **(VARIANTS | WINDOWED | MOE)[variant]}
    if num_hidden_layers is not None:
        spec["num_hidden_layers"] = num_hidden_layers
    if pad_token_id is not None:
        spec["pad_token_id"] = pad_token_id
    kind = spec.pop("arch")
    config_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
        "phi3": (Phi3Config, Phi3ForCausalLM),
        "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
        "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM),
    }[kind]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**spec)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:  # matrices and biases
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return model


def write_checkpoint(
    variant: str,
    directory: Path,
    *,
    seed: int = 0,
    max_shard_size: str | None = None,
    dtype: torch.dtype | None = None,
    num_hidden_layers: int | None = None,
    pad_token_id: int | None = None,
) -> Any:
    """Save `hf_model(variant)` with transformers' own save_pretrained (sharded when
    `max_shard_size` is given, cast to `dtype`); returns the fp32 model that was saved."""

    def make() -> Any:
        return hf_model(variant, seed=seed, num_hidden_layers=num_hidden_layers, pad_token_id=pad_token_id)

    model = make()
    out = model if dtype is None else make().to(dtype)
    kw = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    out.save_pretrained(directory, **kw)
    (directory / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "WordLevel"}}\n')
    return model


def as_transformers_holds(tensors: dict[str, torch.Tensor], config: TinyGPTConfig) -> dict[str, torch.Tensor]:
    """The model's tensors (or their gradients) under the names and layout a transformers 5 model holds them in: a
    Phi3's q/k/v fused as its file's; a Qwen3MoE or Qwen2MoE layer's experts as its 3-D `mlp.experts.gate_up_proj`
    [experts, 2 × moe_intermediate, hidden] ([gate; up] per expert) and `mlp.experts.down_proj` (its file: one tensor
    per expert, `expected_shapes`)."""
    out = fused_for_file(tensors, config)
    for n in range(config.num_hidden_layers):
        if not config.sparse_layer(n):
            continue
        assert config.moe is not None
        p, experts = f"model.layers.{n}.mlp.experts.", range(config.moe.num_experts)
        out[f"{p}gate_up_proj"] = torch.stack(
            [torch.cat([out.pop(f"{p}{e}.gate_proj.weight"), out.pop(f"{p}{e}.up_proj.weight")]) for e in experts]
        )
        out[f"{p}down_proj"] = torch.stack([out.pop(f"{p}{e}.down_proj.weight") for e in experts])
    return out


def refused_in_one_line(directory: Path, key: str, complaint: str) -> None:
    """`rlctl check`'s reading (check_hf_dir) and the model's loading of checkpoint `directory` each refuse it in one
    line naming its config.json and `key`, saying `complaint`."""
    for load in (check_hf_dir, TinyGPT.from_pretrained):
        with pytest.raises(ConfigError) as e:
            load(directory)
        msg = str(e.value)
        assert msg.startswith(f"{directory / 'config.json'}: {key}: ") and complaint in msg and "\n" not in msg


def rope_rows_loaded(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of RoPE tables of each model `TinyGPT.from_pretrained` loads from now on (this test's), in order."""
    rows: list[int] = []
    load = TinyGPT.from_pretrained

    def recorded(*args: Any, **kw: Any) -> TinyGPT:
        model = load(*args, **kw)
        rows.append(model.rope_cos.shape[0])
        return model

    monkeypatch.setattr(TinyGPT, "from_pretrained", recorded)
    return rows


def config_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The config.json files read from now on (this test's), once per read (`read_config_bytes`, `Path.read_bytes`
    and `read_text`, which `hf.read_config_json` and the tokenizer read JSON with), in order."""
    reads: list[Path] = []
    read_bytes, read_text, config_bytes = Path.read_bytes, Path.read_text, hf.read_config_bytes

    def config_read(path: Path, **kw: Any) -> bytes:
        if path.name == "config.json":
            reads.append(path)
        return config_bytes(path, **kw)

    def bytes_read(self: Path) -> bytes:
        if self.name == "config.json":
            reads.append(self)
        return read_bytes(self)

    def text_read(self: Path, *args: Any, **kw: Any) -> str:
        if self.name == "config.json":
            reads.append(self)
        return read_text(self, *args, **kw)

    monkeypatch.setattr(hf, "read_config_bytes", config_read)
    monkeypatch.setattr(Path, "read_bytes", bytes_read)
    monkeypatch.setattr(Path, "read_text", text_read)
    return reads
