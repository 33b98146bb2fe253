"""TinyGPT: the embedded engine's and the torch trainer's model — a Llama/Qwen2 decoder in HF format.

Same module names, config keys and weight names as `LlamaForCausalLM` / `Qwen2ForCausalLM`
(RMSNorm, RoPE, SwiGLU MLP, grouped-query attention; q/k/v bias for Qwen2, optional q/k/v/o bias
for Llama, explicit head_dim, tied embeddings), so a saved directory is an ordinary HF checkpoint
and an HF checkpoint of those two architectures loads (hf.py owns the directory format and what is
refused). The built-in demo model is `TinyGPT()` (Llama, fp32, no biases).

Two ways to run it:
    forward(tokens[B,T]) -> logits[B,T,V]            training / scoring (right padding is harmless:
                                                     attention is causal)
    prefill(cache, rows, tokens, lengths)            write prompt K/V into cache rows
    decode(cache, tokens[B]) -> logits[B,V]          one token per row at position cache.lengths[row]

The KV cache holds one row per batch slot, each with its own length, so rows at different positions
decode together (continuous batching); `KVCache.select` drops finished rows (lazy compaction).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from rlctl.models import hf
from rlctl.models.hf import (
    CONFIG_FILE,
    INDEX_FILE,
    SAFETENSORS_FILE,
    TORCH_FILE,
    TinyGPTConfig,
    load_state_dict,
)

__all__ = [
    "CONFIG_FILE",
    "INDEX_FILE",
    "SAFETENSORS_FILE",
    "TORCH_FILE",
    "KVCache",
    "TinyGPT",
    "TinyGPTConfig",
    "load_state_dict",
    "param_count",
]


class KVCache:
    """Per-layer K/V of shape [rows, kv_heads, capacity, head_dim] and each row's filled length."""

    def __init__(self, k: list[torch.Tensor], v: list[torch.Tensor], lengths: torch.Tensor) -> None:
        self.k, self.v, self.lengths = k, v, lengths

    @property
    def rows(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def capacity(self) -> int:
        return int(self.k[0].shape[2])

    def grow(self, capacity: int) -> None:
        """Make room for `capacity` positions (copies; rare: only when a longer request arrives)."""
        extra = capacity - self.capacity
        if extra > 0:
            self.k = [F.pad(t, (0, 0, 0, extra)) for t in self.k]
            self.v = [F.pad(t, (0, 0, 0, extra)) for t in self.v]

    def add_rows(self, n: int) -> None:
        pad = (0, 0, 0, 0, 0, 0, 0, n)
        self.k = [F.pad(t, pad) for t in self.k]
        self.v = [F.pad(t, pad) for t in self.v]
        self.lengths = torch.cat([self.lengths, self.lengths.new_zeros(n)])

    def select(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (in that order)."""
        self.k = [t.index_select(0, rows) for t in self.k]
        self.v = [t.index_select(0, rows) for t in self.v]
        self.lengths = self.lengths.index_select(0, rows)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, c: TinyGPTConfig) -> None:
        super().__init__()
        self.h, self.kvh, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, self.h * self.d, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden_size, self.kvh * self.d, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden_size, self.kvh * self.d, bias=c.qkv_bias)
        self.o_proj = nn.Linear(self.h * self.d, c.hidden_size, bias=c.attention_bias)

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kvh, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kvh, self.d).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> torch.Tensor:
        if self.kvh != self.h:
            k = k.repeat_interleave(self.h // self.kvh, dim=1)
            v = v.repeat_interleave(self.h // self.kvh, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, **kw)
        b, _, t, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.h * self.d))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Full causal attention; also returns this layer's K and V (for prefill)."""
        q, k, v = self._qkv(x, cos, sin)
        return self._attend(q, k, v, is_causal=True), k, v

    def decode(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kc: torch.Tensor,
        vc: torch.Tensor,
        pos: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        q, k, v = self._qkv(x, cos, sin)
        rows = torch.arange(x.shape[0])
        kc[rows, :, pos] = k[:, :, 0]
        vc[rows, :, pos] = v[:, :, 0]
        t = mask.shape[-1]
        return self._attend(q, kc[:, :, :t], vc[:, :, :t], attn_mask=mask)


class DecoderLayer(nn.Module):
    def __init__(self, c: TinyGPTConfig) -> None:
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class MLP(nn.Module):
    def __init__(self, c: TinyGPTConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Trunk(nn.Module):  # named `model` in TinyGPT, as in HF
    def __init__(self, c: TinyGPTConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class TinyGPT(nn.Module):
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, config: TinyGPTConfig | None = None) -> None:
        super().__init__()
        self.config = c = config if config is not None else TinyGPTConfig()
        self.model = _Trunk(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        angle_dtype = torch.float64 if c.rope_fp64_angles else torch.float32
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=angle_dtype) / c.head_dim))
        ang = torch.outer(torch.arange(c.max_position_embeddings, dtype=angle_dtype), inv_freq)
        ang = torch.cat([ang, ang], dim=-1)
        self.register_buffer("rope_cos", ang.cos().float(), persistent=False)
        self.register_buffer("rope_sin", ang.sin().float(), persistent=False)
        self.apply(self._init)

    def _init(self, m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=self.config.initializer_range)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)  # as HF initialises them

    def blocks(self) -> list[DecoderLayer]:
        return cast(list[DecoderLayer], list(self.model.layers))

    # ---- full-sequence (training, scoring) ----
    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """Final normed hidden states [B, T, hidden] (the critic's value head reads these)."""
        t = tokens.shape[1]
        if t > self.config.max_position_embeddings:
            raise ValueError(f"sequence of {t} tokens > max_position_embeddings {self.config.max_position_embeddings}")
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        x = self.model.embed_tokens(tokens)
        for layer in self.blocks():
            a, _, _ = layer.self_attn(layer.input_layernorm(x), cos, sin)
            x = x + a
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        out: torch.Tensor = self.model.norm(x)
        return out

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.lm_head(self.hidden(tokens))
        return logits

    # ---- incremental decoding ----
    def new_cache(self, rows: int, capacity: int) -> KVCache:
        c = self.config
        p = self.lm_head.weight
        shape = (rows, c.num_key_value_heads, capacity, c.head_dim)
        k = [p.new_zeros(shape) for _ in range(c.num_hidden_layers)]
        v = [p.new_zeros(shape) for _ in range(c.num_hidden_layers)]
        return KVCache(k, v, torch.zeros(rows, dtype=torch.long))

    @torch.no_grad()
    def prefill(self, cache: KVCache, rows: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor) -> None:
        """Write K/V of `tokens` [n, P] (right-padded; row i has lengths[i] real tokens) into cache `rows`."""
        p = tokens.shape[1]
        cache.lengths[rows] = lengths
        if p == 0:
            return
        cos, sin = self.rope_cos[:p], self.rope_sin[:p]
        x = self.model.embed_tokens(tokens)
        for li, layer in enumerate(self.blocks()):
            a, k, v = layer.self_attn(layer.input_layernorm(x), cos, sin)
            cache.k[li][rows, :, :p] = k
            cache.v[li][rows, :, :p] = v
            if li + 1 < len(self.model.layers):  # the last layer's output is not needed
                x = x + a
                x = x + layer.mlp(layer.post_attention_layernorm(x))

    @torch.no_grad()
    def decode(self, cache: KVCache, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per cache row at position cache.lengths[row]; return next-token logits [rows, V]."""
        pos = cache.lengths
        t = int(pos.max()) + 1
        mask = (torch.arange(t) <= pos[:, None])[:, None, None, :]
        cos, sin = self.rope_cos[pos][:, None, None, :], self.rope_sin[pos][:, None, None, :]
        x = self.model.embed_tokens(tokens[:, None])
        for li, layer in enumerate(self.blocks()):
            x = x + layer.self_attn.decode(layer.input_layernorm(x), cos, sin, cache.k[li], cache.v[li], pos, mask)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        cache.lengths = pos + 1
        logits: torch.Tensor = self.lm_head(self.model.norm(x[:, 0]))
        return logits

    # ---- HF directory format (hf.py) ----
    def save_pretrained(
        self,
        directory: str | Path,
        *,
        max_shard_bytes: int | None = None,
        dtype: torch.dtype = torch.float32,
        tokenizer_from: str | Path | None = None,
    ) -> Path:
        """Write config.json and the weights (sharded above `max_shard_bytes`, cast to `dtype`), and
        copy the tokenizer files of checkpoint `tokenizer_from` when given."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        sd = {k: v.detach().to(dtype) if v.is_floating_point() else v for k, v in self.state_dict().items()}
        if self.config.tie_word_embeddings:
            sd.pop("lm_head.weight")
        hf.save_state_dict(sd, d, max_shard_bytes=max_shard_bytes)
        config = {**self.config.to_hf(), "torch_dtype": str(dtype).removeprefix("torch.")}
        (d / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        if tokenizer_from is not None:
            hf.copy_tokenizer_files(tokenizer_from, d)
        return d

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> TinyGPT:
        """Load an HF Llama/Qwen2 checkpoint directory into fp32; ConfigError for what is not supported."""
        d = Path(directory)
        config = hf.read_config(d)
        sd = load_state_dict(d)
        names = hf.match_weights({k: tuple(v.shape) for k, v in sd.items()}, config, where=str(d))
        model = cls(config)
        missing, _ = model.load_state_dict({k: sd[k] for k in names}, strict=False)
        assert set(missing) <= {"lm_head.weight"}, missing  # lm_head is the tied embedding
        return model


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
