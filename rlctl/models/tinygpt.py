"""TinyGPT: the embedded engine's and the torch trainer's model — a Llama/Qwen2/Qwen3/Qwen3MoE/Qwen2MoE/Mistral/Phi3
decoder in HF format.

Same module names, config keys and weight names as `LlamaForCausalLM` / `Qwen2ForCausalLM` / `Qwen3ForCausalLM` /
`MistralForCausalLM` (RMSNorm, RoPE, SwiGLU MLP, grouped-query attention; q/k/v bias for Qwen2, optional q/k/v/o
bias for Llama and Qwen3, none for Mistral, Qwen3's per-head q/k RMSNorm before RoPE, explicit head_dim, tied
embeddings; Qwen3MoE's routed experts, and Qwen2MoE's beside a gated shared expert: `SparseMoE`), so a saved
directory is an ordinary HF checkpoint and an HF checkpoint of those architectures loads (`hfdir` owns the
directory, `hf` what is refused). The built-in demo model is `TinyGPT()` (Llama, fp32, no biases).

Two ways to run it:
    forward(tokens[B,T]) -> logits[B,T,V]            training / scoring (right padding is harmless:
                                                     attention is causal); with router_logits=True also a
                                                     Qwen MoE's router logits (the load-balancing loss's)
    prefill(cache, rows, tokens, lengths)            write prompt K/V into cache rows
    decode(cache, tokens[b], rows=b, width=t)        one token for each of the cache's first b rows at position
                                                     cache.lengths[row]; attends over the first t positions

Device and dtype are the module's (`.to("cuda", torch.bfloat16)`): every tensor the model makes is made on
its parameters' device. In low precision it computes as `transformers` does: RMSNorm in fp32 (then cast),
RoPE tables in fp32 cast to the activations' dtype, softmax inside SDPA.

The KV cache holds one row per batch slot, each with its own length, so rows at different positions
decode together (continuous batching). Its storage is allocated once for the engine's largest batch and
never moves while the capacity stays: `decode` works on a prefix of rows and a prefix of positions, writes
K/V with `scatter_` and advances lengths in place, so a decode step at a fixed (rows, width) has static
shapes and no host synchronisation — what a CUDA graph captures (rlctl.engines.graphs). Grouped-query
attention attends per KV group (the query heads of a group against their one K/V head) instead of
repeating K/V for every query head.

The rollout engine's model is fused (`fuse_projections`): q/k/v and gate/up each one matmul, their parameters
views into the fused tensors, so a decode step launches fewer kernels and everything that acts on parameters
(loading in place, state_dict, saving, `.to`) works as on an unfused model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, cast, overload

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from rlctl.models import hf, rope, tinyload
from rlctl.models.hf import CONFIG_FILE, TinyGPTConfig
from rlctl.models.tensors import copy_into
from rlctl.models.weightfiles import INDEX_FILE, SAFETENSORS_FILE, TORCH_FILE, load_state_dict

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
    """Per-layer K/V storage [rows, kv_heads, capacity, head_dim] and each row's filled length (int64, on the
    cache's device). `decode` uses a prefix of the rows; `keep` moves rows to the front in place."""

    def __init__(self, k: list[torch.Tensor], v: list[torch.Tensor], lengths: torch.Tensor) -> None:
        self.k, self.v, self.lengths = k, v, lengths

    @property
    def rows(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def capacity(self) -> int:
        return int(self.k[0].shape[2])

    def grow(self, capacity: int) -> None:
        """Make room for `capacity` positions (new storage, a copy: rare, when a longer request arrives)."""
        extra = capacity - self.capacity
        if extra > 0:
            self.k = [F.pad(t, (0, 0, 0, extra)) for t in self.k]
            self.v = [F.pad(t, (0, 0, 0, extra)) for t in self.v]

    def keep(self, rows: torch.Tensor, width: int | None = None) -> None:
        """Move `rows` (a device index, in that order) to the front; the storage stays where it is. `width`: the
        positions to move (≥ every such row's length; default all): what lies past a row's length is never read."""
        n = int(rows.shape[0])
        w = self.capacity if width is None else min(width, self.capacity)
        for t in (*self.k, *self.v):
            t[:n, :, :w] = t[:, :, :w].index_select(0, rows)
        self.lengths[:n] = self.lengths.index_select(0, rows)


def _scaled(inv_freq: torch.Tensor, s: hf.RopeScaling | None, theta: float) -> torch.Tensor:
    """RoPE's frequencies θ^(-2i/d) scaled for a longer context (`hf.RopeScaling`; as transformers' rope init
    functions)."""
    if s is None:
        return inv_freq
    factor = s.factor
    assert factor is not None and s.kind != "longrope"  # (longrope: `TinyGPT._rope_tables`)
    if s.kind == "linear":
        return inv_freq / factor
    if s.kind == "yarn":  # the weight of the kept frequency falls linearly from 1 to 0 over the index band
        low, high = s.yarn_band(2 * inv_freq.numel(), theta)
        i = torch.arange(inv_freq.numel(), dtype=inv_freq.dtype, device=inv_freq.device)
        kept = 1 - ((i - low) / (high - low)).clamp(0, 1)
        return inv_freq / factor * (1 - kept) + inv_freq * kept
    assert s.low_freq_factor is not None and s.high_freq_factor is not None and s.original_max_position_embeddings
    # turns over the pretraining context (its length ÷ the wavelength 2π/freq): the llama3 bands are [.., low]
    # (÷ factor), [high, ..] (kept), and in between the weight of the kept frequency rises linearly from 0 to 1
    # (written as transformers' context / wavelength, which rounds otherwise than context · freq / 2π in fp32)
    turns = s.original_max_position_embeddings / (2 * math.pi / inv_freq)
    kept = ((turns - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)).clamp(0, 1)
    return (1 - kept) * inv_freq / factor + kept * inv_freq


def _rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotary embedding x·cos + rotate_half(x)·sin, with rotate_half(x) = (−x₂, x₁) written as roll(x) = (x₂, x₁)
    times the signed table (−sin₁, sin₂): the same values (a sign moves between two factors), one kernel fewer. Tables
    narrower than a head (a Phi3's partial_rotary_factor) rotate its first dimensions and pass the rest, as Phi3's
    apply_rotary_pos_emb."""
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return x * cos + x.roll(r // 2, -1) * sin_signed
    turned = x[..., :r]
    return torch.cat([turned * cos + turned.roll(r // 2, -1) * sin_signed, x[..., r:]], dim=-1)


def _fuse(*linears: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for linears that read the same input, their outputs concatenated in order. Each
    linear's parameters become views into it (through `.data`: the Parameter objects stay, so an optimizer or a
    state_dict holding them is unaffected), so weights copied into the parameters in place are the fused ones."""
    biases = [m.bias for m in linears]
    if any(b is None for b in biases) and any(b is not None for b in biases):
        raise ValueError("fused projections have a bias each or none")
    with torch.no_grad():
        weight = torch.cat([m.weight for m in linears])
        bias = torch.cat([b for b in biases if b is not None]) if biases[0] is not None else None
    at = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight.data = weight[at : at + n]
        if bias is not None:
            m.bias.data = bias[at : at + n]
        at += n
    return weight, bias


def _in_place(fused: tuple[torch.Tensor, torch.Tensor | None], *linears: nn.Linear) -> bool:
    """Every parameter of `linears` is still its slice of `fused` (nothing gave one storage of its own since)."""
    weight, bias = fused
    at = 0
    for m in linears:
        if m.weight.data_ptr() != weight[at].data_ptr() or (
            bias is not None and m.bias.data_ptr() != bias[at].data_ptr()
        ):
            return False
        at += m.weight.shape[0]
    return True


def _training(weight: torch.Tensor) -> bool:
    """Gradients are wanted for `weight`: the fused tensors are not parameters, so that pass takes the separate
    projections (a fused model can still be trained)."""
    return torch.is_grad_enabled() and weight.requires_grad


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """In fp32 whatever the input's dtype, cast back before the weight (as transformers computes it).
        `F.rms_norm` is the same arithmetic as transformers' five operations (bit for bit on a CPU) and one fused
        kernel on a GPU."""
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: TinyGPTConfig) -> None:
        super().__init__()
        self.h, self.kvh, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, self.h * self.d, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden_size, self.kvh * self.d, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden_size, self.kvh * self.d, bias=c.qkv_bias)
        self.o_proj = nn.Linear(self.h * self.d, c.hidden_size, bias=c.attention_bias)
        # Qwen3: each head's q and k RMS-normed over head_dim before RoPE (one weight shared by the heads)
        self.q_norm = RMSNorm(self.d, c.rms_norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(self.d, c.rms_norm_eps) if c.qk_norm else None
        self.qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None  # q, k, v as one projection (`fuse`)

    def fuse(self) -> bool:
        """q, k and v as one matmul (and their rotary embedding as one), their parameters views into it; True when
        it (re)made the fused tensors, False when they were in place already."""
        linears = (self.q_proj, self.k_proj, self.v_proj)
        if self.qkv is not None and _in_place(self.qkv, *linears):
            return False
        self.qkv = _fuse(*linears)
        return True

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k, v [b, heads, t, d] with rotary embedding (`sin`: the signed table, `_rope`); the fp32 tables are
        applied in the activations' dtype (a no-op cast when the caller cast them)."""
        b, t, _ = x.shape
        if self.qkv is None or _training(self.q_proj.weight):
            q = self.q_proj(x).view(b, t, self.h, self.d)
            k = self.k_proj(x).view(b, t, self.kvh, self.d)
            if self.q_norm is not None and self.k_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            v = self.v_proj(x).view(b, t, self.kvh, self.d).transpose(1, 2)
            cos, sin = cos.to(q.dtype), sin.to(q.dtype)
            return _rope(q, cos, sin), _rope(k, cos, sin), v
        # rotary in the projection's own layout [b, t, heads, d], where the output is contiguous: a roll of a strided
        # slice would copy it first (on CUDA); v's heads roll along, unused
        m = self.h + self.kvh
        y = F.linear(x, *self.qkv).view(b, t, m + self.kvh, self.d)
        if cos.dim() == 2:  # [t, d] tables (prefill) against [b, t, heads, d]; decode's are [b, 1, 1, d]
            cos, sin = cos[:, None], sin[:, None]
        if self.q_norm is not None and self.k_norm is not None:  # normed q and k are a new contiguous tensor
            x = torch.cat([self.q_norm(y[:, :, : self.h]), self.k_norm(y[:, :, self.h : m])], dim=2)
            qk = _rope(x, cos.to(y.dtype), sin.to(y.dtype))
        elif cos.shape[-1] < self.d:  # RoPE on part of each head (a Phi3's partial_rotary_factor)
            qk = _rope(y[:, :, :m], cos.to(y.dtype), sin.to(y.dtype))
        else:
            qk = y[:, :, :m] * cos.to(y.dtype) + y.roll(self.d // 2, -1)[:, :, :m] * sin.to(y.dtype)
        q, k = qk.transpose(1, 2).split((self.h, self.kvh), dim=1)
        return q, k, y[:, :, m:].transpose(1, 2)

    def _out(self, o: torch.Tensor) -> torch.Tensor:
        """[b, h, t, d] attention output → [b, t, hidden] through o_proj."""
        b, _, t, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.h * self.d))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Full causal attention; also returns this layer's K and V (for prefill)."""
        q, k, v = self._qkv(x, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kvh != self.h)
        return self._out(o), k, v

    def decode(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kc: torch.Tensor,
        vc: torch.Tensor,
        at: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """One token per row: write its K/V at the row's position (`at`: [b, kv_heads, 1, head_dim] index), attend
        over the first mask.shape[-1] positions. The g = heads / kv_heads query heads of a group attend to their
        K/V head as g query rows of one attention ([b, kv_heads, g, d] against [b, kv_heads, t, d]), so the
        cache is read once per group, not once per query head."""
        q, k, v = self._qkv(x, cos, sin)
        b, t = x.shape[0], mask.shape[-1]
        kc.scatter_(2, at, k)
        vc.scatter_(2, at, v)
        g = self.h // self.kvh
        o = F.scaled_dot_product_attention(
            q.reshape(b, self.kvh, g, self.d), kc[:, :, :t], vc[:, :, :t], attn_mask=mask
        )
        return self._out(o.reshape(b, self.h, 1, self.d))


class DecoderLayer(nn.Module):
    def __init__(self, c: TinyGPTConfig, layer: int = 0) -> None:
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp: MLP | SparseMoE = SparseMoE(c) if c.sparse_layer(layer) else MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The layer's output, and a sparse layer's router logits [B·T, num_experts] (None for a dense one)."""
        a, _, _ = self.self_attn(self.input_layernorm(x), cos, sin)
        x = x + a
        h = self.post_attention_layernorm(x)
        if isinstance(self.mlp, SparseMoE):
            y, logits = self.mlp.route(h)
            return x + y, logits
        return x + self.mlp(h), None


class MLP(nn.Module):
    def __init__(self, c: TinyGPTConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        i = c.intermediate_size if intermediate_size is None else intermediate_size
        self.gate_proj = nn.Linear(c.hidden_size, i, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, i, bias=False)
        self.down_proj = nn.Linear(i, c.hidden_size, bias=False)
        self.gate_up: torch.Tensor | None = None  # gate and up as one projection (`fuse`)

    def fuse(self) -> bool:
        """gate and up as one matmul, their weights views into it; True when it (re)made the fused tensor."""
        linears = (self.gate_proj, self.up_proj)
        if self.gate_up is not None and _in_place((self.gate_up, None), *linears):
            return False
        self.gate_up, _ = _fuse(*linears)
        return True

    def unfuse(self) -> None:
        self.gate_up = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is None or _training(self.gate_proj.weight):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class SparseMoE(nn.Module):
    """A Qwen3MoE or Qwen2MoE layer's MLP (`hf.MoeConfig`): router `gate`, then each token through its top-k `experts`
    (SwiGLU MLPs, the file's per-expert names), their outputs summed weighted by the router's softmax over the top k (in
    fp32, renormalised where norm_topk_prob), as Qwen3MoeSparseMoeBlock computes it: expert by expert in index order,
    each adding its tokens' weighted outputs in place (index_add_), so the sums are transformers' own. A Qwen2MoE's
    `shared_expert` (every token's) is added to that sum times sigmoid(`shared_expert_gate`(x)), as
    Qwen2MoeSparseMoeBlock adds it.

    With gradients wanted (of any of its parameters: LoRA's adapters on the experts beside a frozen router too) every
    expert runs, one without tokens on none: each expert's gradient is then a tensor (zeros where no token chose it, as
    transformers' one fused experts tensor has), so that every data-parallel rank (and FSDP2's reduce-scatter) sums the
    same gradients whatever its tokens chose."""

    def __init__(self, c: TinyGPTConfig) -> None:
        super().__init__()
        assert c.moe is not None
        self.top_k, self.norm_topk_prob = c.moe.num_experts_per_tok, c.moe.norm_topk_prob
        self.gate = nn.Linear(c.hidden_size, c.moe.num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(c, c.moe.moe_intermediate_size) for _ in range(c.moe.num_experts))
        shared = c.moe.shared_expert_intermediate_size  # (after the experts: transformers' order of the tensors)
        self.shared_expert = MLP(c, shared) if shared else None
        self.shared_expert_gate = nn.Linear(c.hidden_size, 1, bias=False) if shared else None

    def _mlps(self) -> list[MLP]:
        return [cast(MLP, e) for e in self.experts] + ([self.shared_expert] if self.shared_expert is not None else [])

    def fuse(self) -> bool:
        moved = False
        for e in self._mlps():
            moved |= e.fuse()
        return moved

    def unfuse(self) -> None:
        for e in self._mlps():
            e.unfuse()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.route(x)[0]

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's output, and its router's logits [tokens, num_experts] (with their gradient: the load-balancing
        loss's input, `rlctl.models.moeloss`)."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = self.gate(x)
        top, chosen = torch.topk(F.softmax(logits, dim=-1, dtype=torch.float), self.top_k, dim=-1)
        if self.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        weights = top.to(logits.dtype)
        out = torch.zeros_like(x)
        every = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        with torch.no_grad():  # [experts, k, tokens]: which (rank among the k, token) chose each expert
            mask = F.one_hot(chosen, num_classes=len(self.experts)).permute(2, 1, 0)
            used = range(len(self.experts)) if every else mask.sum(dim=(1, 2)).nonzero()[:, 0].tolist()
        for e in used:
            rank, token = torch.where(mask[e])
            y = self.experts[e](x[token]) * weights[token, rank, None]
            out.index_add_(0, token, y.to(out.dtype))
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            out = out + F.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out.reshape(shape), logits


class _Trunk(nn.Module):  # named `model` in TinyGPT, as in HF
    def __init__(self, c: TinyGPTConfig) -> None:
        super().__init__()
        # the pad token's row gets no gradient from the positions that hold it, as transformers' (padding_idx)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
        self.layers = nn.ModuleList(DecoderLayer(c, n) for n in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class TinyGPT(nn.Module):
    rope_cos: torch.Tensor  # [context, rotary_dim]
    rope_sin_signed: torch.Tensor  # (−sin, sin) over the two halves of the rotated dimensions (`_rope`)
    # longrope's long_factor tables, for a pass over more positions than its pretraining context L (`_tables`); empty
    # where the model holds no more than L (and for the other scalings)
    rope_cos_long: torch.Tensor
    rope_sin_signed_long: torch.Tensor
    # positions the RoPE tables hold, the most a sequence may have: the model's (`TinyGPTConfig.max_positions`:
    # max_position_embeddings, × a linear scaling's factor), or a job's context where that is less
    # (`empty`: 1,024,000 positions of fp32 tables are ≈ 1 GiB a model, for none of them used)
    context: int
    # training on a GPU (rlctl.trainers.native): the full-sequence passes compute in this dtype under autocast,
    # the parameters (master weights) staying as they are; and each layer's activations recomputed in backward
    autocast_dtype: torch.dtype | None = None
    activation_checkpointing: bool = False

    def __init__(self, config: TinyGPTConfig | None = None) -> None:
        super().__init__()
        self.config = c = config if config is not None else TinyGPTConfig()
        self.context = c.max_positions
        self.model = _Trunk(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin_signed", torch.empty(0), persistent=False)
        self.register_buffer("rope_cos_long", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin_signed_long", torch.empty(0), persistent=False)
        if self._weight.device.type == "meta":  # `empty`: nothing to compute (see `tinyload._uninitialised`)
            return
        self._rope_tables()
        self.apply(self._init)
        if c.pad_token_id is not None:  # as transformers' _init_weights zeroes an nn.Embedding's padding_idx row
            # (after every module's init: a tied lm_head's, visited after the embedding, draws the same tensor again)
            nn.init.zeros_(self.model.embed_tokens.weight[c.pad_token_id])

    def _rope_tables(self) -> None:
        """cos and sin of position·θ^(-2i/d) over the `rotary_dim` dimensions RoPE turns (each frequency scaled as
        `config.rope_scaling` says, and both tables multiplied by its attention scaling) for every position below
        `context`, in fp32 on the model's device (cast with it); longrope's short_factor tables, and its long_factor
        ones where `context` passes its pretraining context. ValueError where `context` is longer than a Mistral
        sliding window that binds (`hf.window_refusal`): the model would not compute what MistralModel does."""
        c = self.config
        if (why := hf.window_refusal(c, self.context)) is not None:
            raise ValueError(f"sliding_window {why}")
        angle_dtype = torch.float64 if c.rope_fp64_angles else torch.float32
        device = self._weight.device
        half = torch.arange(0, c.rotary_dim, 2, dtype=angle_dtype, device=device) / c.rotary_dim
        s, positions = c.rope_scaling, torch.arange(self.context, dtype=angle_dtype, device=device)
        # × yarn's and longrope's attention factor (1 otherwise), as transformers' rotary embedding scales cos and sin
        a = 1.0 if s is None else s.attention_scaling(c.max_position_embeddings)

        def tables(inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            ang = torch.outer(positions, inv_freq)
            cos, sin = (torch.cat([ang, ang], dim=-1).cos() * a).float(), torch.cat([-ang.sin(), ang.sin()], dim=-1)
            return cos, (sin * a).float()

        if s is None or s.kind != "longrope":
            self.rope_cos, self.rope_sin_signed = tables(
                _scaled(1.0 / (c.rope_theta**half), rope.resolved(s, c.max_position_embeddings), c.rope_theta)
            )
            return
        assert s.short_factor is not None and s.long_factor is not None and c.longrope_context is not None
        # (as transformers' _compute_longrope_parameters: 1 / (factor · θ^(2i/d)))
        short, long = (torch.tensor(f, dtype=angle_dtype, device=device) for f in (s.short_factor, s.long_factor))
        self.rope_cos, self.rope_sin_signed = tables(1.0 / (short * c.rope_theta**half))
        if self.context > c.longrope_context:
            self.rope_cos_long, self.rope_sin_signed_long = tables(1.0 / (long * c.rope_theta**half))

    @property
    def _weight(self) -> torch.Tensor:
        """A weight whose device and dtype are the model's: the embedding's, which every model holds (its input), versus
        the lm_head's, which PPO's critic trunk holds none of (`rlctl.trainers.critic`)."""
        return self.model.embed_tokens.weight

    def _tables(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and the signed sin for a pass over positions 0 … t − 1: longrope's long_factor tables where t passes its
        pretraining context (transformers chooses by the pass's length, `dynamic_rope_update`), else `rope_cos`."""
        context = self.config.longrope_context
        if context is not None and t > context:
            return self.rope_cos_long[:t], self.rope_sin_signed_long[:t]
        return self.rope_cos[:t], self.rope_sin_signed[:t]

    @property
    def context_name(self) -> str:
        """What bounds `context`, as an error names it."""
        c = self.config
        if self.context < c.max_positions:
            return "the job's context (its task's longest prompt + output)"
        scaled = rope.positions_said(c.max_position_embeddings, c.rope_scaling)
        return "max_position_embeddings" if scaled is None else f"the model's context ({scaled})"

    def _init(self, m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=self.config.initializer_range)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)  # as HF initialises them

    def blocks(self) -> list[DecoderLayer]:
        return cast(list[DecoderLayer], list(self.model.layers))

    # ---- fused projections (inference) ----
    @property
    def fused(self) -> bool:
        return any(layer.self_attn.qkv is not None for layer in self.blocks())

    def fuse_projections(self) -> bool:
        """Compute each layer's q, k, v as one matmul and gate, up as one (the rollout engine's model): in a decode
        step, where every kernel is small, that is 3 kernels fewer per layer, and the rotary embedding of q and k
        one op instead of two. The separate parameters stay (as views into the fused tensors): names, state_dict
        and loading weights in place are unchanged, and a pass that wants gradients takes the separate projections.

        Idempotent: fused tensors still in place are kept, so their storage does not move (a captured CUDA graph
        stays valid). Where a parameter got storage of its own since (`.to` to another device or dtype, a
        deepcopy, `load_state_dict(assign=True)`, `.to` on one layer), the stale fused tensors would compute with
        the old weights: this makes them again, and says so (True: the storage moved)."""
        moved = False
        for layer in self.blocks():
            moved |= layer.self_attn.fuse()
            moved |= layer.mlp.fuse()
        return moved

    def unfuse_projections(self) -> None:
        """Back to one matmul per projection (the parameters keep their storage: the same values)."""
        for layer in self.blocks():
            layer.self_attn.qkv = None
            layer.mlp.unfuse()

    def _apply(self, fn: Any, recurse: bool = True) -> TinyGPT:
        """`.to`, `.cuda`, `.half`, … that give parameters new storage: the fused tensors are made again from it
        (a `.to` that changes nothing keeps them)."""
        super()._apply(fn, recurse)
        if self.fused:
            self.fuse_projections()
        return self

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy (deepcopy, pickle) gives each parameter storage of its own: fused again from them."""
        super().__setstate__(state)
        if self.fused:
            self.fuse_projections()

    # ---- full-sequence (training, scoring) ----
    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """Final normed hidden states [B, T, hidden] (the critic's value head reads these)."""
        return self._trunk(tokens)[0]

    def _trunk(self, tokens: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """`hidden`, and each sparse layer's router logits [B·T, num_experts] in layer order (none: a dense model)."""
        t = tokens.shape[1]
        if t > self.context:
            raise ValueError(f"sequence of {t} tokens > {self.context_name} {self.context}")
        cos, sin = self._tables(t)
        routed: list[torch.Tensor] = []
        with self._autocast(tokens.device):
            x = self.model.embed_tokens(tokens)
            for layer in self.blocks():
                if self.activation_checkpointing and self.training:
                    x, logits = checkpoint(layer, x, cos, sin, use_reentrant=False)
                else:
                    x, logits = layer(x, cos, sin)
                if logits is not None:
                    routed.append(logits)
            out: torch.Tensor = self.model.norm(x)
        return out, tuple(routed)

    @overload
    def forward(self, tokens: torch.Tensor, *, router_logits: Literal[False] = ...) -> torch.Tensor: ...
    @overload
    def forward(
        self, tokens: torch.Tensor, *, router_logits: Literal[True]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]: ...
    def forward(
        self, tokens: torch.Tensor, *, router_logits: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Logits [B, T, vocab]; with `router_logits`, also each sparse layer's router logits [B·T, num_experts] (as
        Qwen3MoeForCausalLM's `output_router_logits`: the load-balancing loss's input, `rlctl.models.moeloss`)."""
        h, routed = self._trunk(tokens)
        with self._autocast(tokens.device):
            logits: torch.Tensor = self.lm_head(h)
        return (logits, routed) if router_logits else logits

    def _autocast(self, device: torch.device) -> torch.autocast:
        return torch.autocast(device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None)

    # ---- incremental decoding ----
    def new_cache(self, rows: int, capacity: int) -> KVCache:
        """Empty K/V storage for `rows` rows of `capacity` positions, on the model's device and in its dtype."""
        c = self.config
        p = self._weight
        shape = (rows, c.num_key_value_heads, capacity, c.head_dim)
        k = [p.new_zeros(shape) for _ in range(c.num_hidden_layers)]
        v = [p.new_zeros(shape) for _ in range(c.num_hidden_layers)]
        return KVCache(k, v, torch.zeros(rows, dtype=torch.long, device=p.device))

    @torch.no_grad()
    def prefill(self, cache: KVCache, rows: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor) -> None:
        """Write K/V of `tokens` [n, P] (right-padded; row i has lengths[i] real tokens) into cache `rows`
        (every tensor on the cache's device). A longrope model's tables are chosen by P, as a forward's (`_tables`)."""
        p = tokens.shape[1]
        cache.lengths[rows] = lengths
        if p == 0:
            return
        dtype = self._weight.dtype
        cos, sin = (table.to(dtype) for table in self._tables(p))  # once, not in every layer
        x = self.model.embed_tokens(tokens)
        for li, layer in enumerate(self.blocks()):
            a, k, v = layer.self_attn(layer.input_layernorm(x), cos, sin)
            cache.k[li][rows, :, :p] = k
            cache.v[li][rows, :, :p] = v
            if li + 1 < len(self.model.layers):  # the last layer's output is not needed
                x = x + a
                x = x + layer.mlp(layer.post_attention_layernorm(x))

    @torch.no_grad()
    def decode(
        self, cache: KVCache, tokens: torch.Tensor, *, rows: int | None = None, width: int | None = None
    ) -> torch.Tensor:
        """Feed one token to each of the cache's first `rows` rows (default: all) at position cache.lengths[row],
        advance those lengths by one (in place) and return next-token logits [rows, V]. Attention reads the first
        `width` positions (≥ every such row's position + 1; default: exactly that, which asks the device for the
        longest row). With both given nothing here waits for the device.

        A longrope model decodes with its short_factor tables at every position: transformers' generate up to its
        pretraining context L. Past it transformers recomputes the whole sequence's K/V with long_factor (Phi3's
        prepare_inputs_for_generation), which a cache of rows cannot: the embedded engine is refused a context past L
        (`rope.longrope_refusal`)."""
        b = cache.rows if rows is None else rows
        pos = cache.lengths[:b]
        t = int(pos.max()) + 1 if width is None else width
        hd = self.config.head_dim
        dtype = self._weight.dtype
        # additive, made once (SDPA would turn a boolean mask into one in every layer): 0 where a row may attend, the
        # dtype's lowest after (as transformers masks: finite for every attention backend; a row always sees itself)
        visible = (torch.arange(t, device=pos.device) <= pos[:, None])[:, None, None, :]
        mask = torch.zeros(visible.shape, dtype=dtype, device=pos.device)
        mask.masked_fill_(~visible, torch.finfo(dtype).min)
        at = pos[:, None, None, None].expand(b, self.config.num_key_value_heads, 1, hd)
        cos = self.rope_cos[pos][:, None, None, :].to(dtype)
        sin = self.rope_sin_signed[pos][:, None, None, :].to(dtype)
        x = self.model.embed_tokens(tokens[:, None])
        for li, layer in enumerate(self.blocks()):
            kc, vc = cache.k[li][:b], cache.v[li][:b]
            x = x + layer.self_attn.decode(layer.input_layernorm(x), cos, sin, kc, vc, at, mask)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        pos += 1
        logits: torch.Tensor = self.lm_head(self.model.norm(x[:, 0]))
        return logits

    # ---- made from or saved to an HF directory, made empty or on the meta device (tinyload.py) ----
    from_pretrained = classmethod(tinyload.from_pretrained)
    empty = classmethod(tinyload.empty)
    on_meta = classmethod(tinyload.on_meta)
    materialise = tinyload.materialise
    save_pretrained = tinyload.save_pretrained

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy HF-layout tensors into the parameters in place (any device or dtype: each is converted); with
        tied embeddings `lm_head.weight` may be left out. Storage does not move (a captured CUDA graph stays
        valid). Each tensor is read as it is copied (`copy_into`): a lazy mapping (`ModelTensors` of a checkpoint's
        `CheckpointTensors`) costs one tensor beyond the model, versus torch's `load_state_dict`, which makes a dict
        of the whole mapping first."""
        # checked before anything is copied: a refused version leaves the weights whole (the engine keeps
        # generating with them, under their own version)
        copy_into(self, state_dict, optional={"lm_head.weight"} if self.config.tie_word_embeddings else ())

    def hf_weights(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """The HF checkpoint's tensors (no `lm_head.weight` when tied: the embedding is the one copy), detached,
        cast to `dtype` if given: what the weight plane sends and a rollout engine's `load_weights` takes."""
        sd = self.state_dict()
        if self.config.tie_word_embeddings:
            sd.pop("lm_head.weight")
        return {
            k: v.detach() if dtype is None or not v.is_floating_point() else v.detach().to(dtype) for k, v in sd.items()
        }


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
