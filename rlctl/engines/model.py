"""TinyGPT: the embedded engine's model — a tiny Llama-architecture decoder in HF directory format.

Same module names, config keys and weight names as `LlamaForCausalLM` (RMSNorm, RoPE, SwiGLU MLP,
grouped-query attention, no biases), so a saved directory is an ordinary HF checkpoint:

    <dir>/config.json          architectures, hidden_size, num_hidden_layers, … (HF keys)
    <dir>/model.safetensors    state dict (or pytorch_model.bin via torch.save when the
                               `safetensors` package is missing; loaded with weights_only=True)

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
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
TORCH_FILE = "pytorch_model.bin"


@dataclass
class TinyGPTConfig:
    """HF `LlamaConfig` keys (the subset this model uses). Defaults = the `tiny-demo` catalog entry."""

    vocab_size: int = 66
    hidden_size: int = 96
    intermediate_size: int = 256
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    max_position_embeddings: int = 320
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    bos_token_id: int = 1
    eos_token_id: int = 2
    pad_token_id: int = 0
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_hf(self) -> dict[str, Any]:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "head_dim": self.head_dim,
            "torch_dtype": "float32",
            **asdict(self),
        }

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> TinyGPTConfig:
        arch = d.get("architectures", ["LlamaForCausalLM"])
        if arch != ["LlamaForCausalLM"] or d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"not a TinyGPT (Llama) config: architectures={arch}, hidden_act={d.get('hidden_act')}")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def num_params(self) -> int:
        h, i, n = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        kv = self.num_key_value_heads * self.head_dim
        per_layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return n * per_layer + emb + h


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
        self.q_proj = nn.Linear(c.hidden_size, self.h * self.d, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.kvh * self.d, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.kvh * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, c.hidden_size, bias=False)

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
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
        ang = torch.outer(torch.arange(c.max_position_embeddings, dtype=torch.float64), inv_freq)
        ang = torch.cat([ang, ang], dim=-1)
        self.register_buffer("rope_cos", ang.cos().float(), persistent=False)
        self.register_buffer("rope_sin", ang.sin().float(), persistent=False)
        self.apply(self._init)

    def _init(self, m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=self.config.initializer_range)

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

    # ---- HF directory format ----
    def save_pretrained(self, directory: str | Path) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / CONFIG_FILE).write_text(json.dumps(self.config.to_hf(), indent=2) + "\n")
        sd = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        if self.config.tie_word_embeddings:
            sd.pop("lm_head.weight")
        try:
            from safetensors.torch import save_file
        except ImportError:
            torch.save(sd, d / TORCH_FILE)
        else:
            save_file(sd, str(d / SAFETENSORS_FILE), metadata={"format": "pt"})
        return d

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> TinyGPT:
        d = Path(directory)
        try:
            config = TinyGPTConfig.from_hf(json.loads((d / CONFIG_FILE).read_text()))
        except (OSError, ValueError, TypeError) as e:
            raise ValueError(f"{d}: not a TinyGPT model directory: {e}") from e
        model = cls(config)
        model.load_state_dict(load_state_dict(d), strict=not config.tie_word_embeddings)
        return model


def load_state_dict(directory: str | Path) -> dict[str, torch.Tensor]:
    d = Path(directory)
    if (d / SAFETENSORS_FILE).exists():
        try:
            from safetensors.torch import load_file
        except ImportError as e:
            raise ValueError(
                f"{d / SAFETENSORS_FILE}: reading it needs the safetensors package: pip install safetensors"
            ) from e
        return load_file(str(d / SAFETENSORS_FILE))
    if (d / TORCH_FILE).exists():
        sd: dict[str, torch.Tensor] = torch.load(d / TORCH_FILE, map_location="cpu", weights_only=True)
        return sd
    raise ValueError(f"{d}: no {SAFETENSORS_FILE} or {TORCH_FILE}")


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
