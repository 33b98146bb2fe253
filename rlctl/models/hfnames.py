"""The tensors of an HF checkpoint of a `TinyGPTConfig`: each one's name and shape in HF order (`expected_shapes`),
a Phi3 file's fused tensors (`fusions`, `file_shapes`, `fused_for_file`), and the check of a file's tensors against
them (`match_weights`). Torch is imported only where tensors are fused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from rlctl.errors import ConfigError
from rlctl.models.hf import PHI3, TinyGPTConfig

if TYPE_CHECKING:
    import torch


def expected_shapes(c: TinyGPTConfig) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape of a checkpoint of `c`, in HF order (no lm_head when embeddings are tied)."""
    h, i = c.hidden_size, c.intermediate_size
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, h)}
    for n in range(c.num_hidden_layers):
        p = f"model.layers.{n}."
        for proj, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            out[f"{p}self_attn.{proj}.weight"] = (rows, h)
            if c.qkv_bias:
                out[f"{p}self_attn.{proj}.bias"] = (rows,)
        out[f"{p}self_attn.o_proj.weight"] = (h, q)
        if c.attention_bias:
            out[f"{p}self_attn.o_proj.bias"] = (h,)
        if c.qk_norm:
            out |= {f"{p}self_attn.q_norm.weight": (c.head_dim,), f"{p}self_attn.k_norm.weight": (c.head_dim,)}
        if c.moe is not None and c.moe.sparse(n):  # (a file's per-expert names: what transformers 5 writes and reads)
            m = c.moe.moe_intermediate_size
            out[f"{p}mlp.gate.weight"] = (c.moe.num_experts, h)
            for e in range(c.moe.num_experts):
                x = f"{p}mlp.experts.{e}."
                out |= {f"{x}gate_proj.weight": (m, h), f"{x}up_proj.weight": (m, h), f"{x}down_proj.weight": (h, m)}
            if s := c.moe.shared_expert_intermediate_size:  # a Qwen2MoE's
                x = f"{p}mlp.shared_expert."
                out |= {f"{x}gate_proj.weight": (s, h), f"{x}up_proj.weight": (s, h), f"{x}down_proj.weight": (h, s)}
                out[f"{p}mlp.shared_expert_gate.weight"] = (1, h)
        else:
            out |= {
                f"{p}mlp.gate_proj.weight": (i, h),
                f"{p}mlp.up_proj.weight": (i, h),
                f"{p}mlp.down_proj.weight": (h, i),
            }
        out |= {f"{p}input_layernorm.weight": (h,), f"{p}post_attention_layernorm.weight": (h,)}
    out["model.norm.weight"] = (h,)
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = (c.vocab_size, h)
    return out


def fusions(c: TinyGPTConfig) -> dict[str, tuple[str, ...]]:
    """A Phi3 checkpoint file's fused tensors → the model's tensors stacked in them along dim 0, in order:
    `qkv_proj` [q; k; v] and `gate_up_proj` [gate; up]. {} for the other architectures, whose files hold the model's
    names. The model, the trainers and the engines' weight pushes use the parts (Llama's names: vLLM's Phi3 is its
    Llama, which stacks q/k/v and gate/up into its fused weights itself); only the files hold the fused tensors
    (written by `write_pretrained`, read through `rlctl.models.tensors.ModelTensors`)."""
    if c.architecture != PHI3:
        return {}
    out: dict[str, tuple[str, ...]] = {}
    for n in range(c.num_hidden_layers):
        attn, mlp = f"model.layers.{n}.self_attn.", f"model.layers.{n}.mlp."
        out[f"{attn}qkv_proj.weight"] = tuple(f"{attn}{p}_proj.weight" for p in "qkv")
        out[f"{mlp}gate_up_proj.weight"] = (f"{mlp}gate_proj.weight", f"{mlp}up_proj.weight")
    return out


def file_shapes(c: TinyGPTConfig) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape in a checkpoint file of `c`, in HF order: `expected_shapes`, with Phi3's fused tensors
    in place of their parts (`fusions`)."""
    shapes, fused = expected_shapes(c), fusions(c)
    first = {parts[0]: name for name, parts in fused.items()}
    inside = {p for parts in fused.values() for p in parts}
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        if name in first:
            out[first[name]] = (sum(shapes[p][0] for p in fused[first[name]]), *shape[1:])
        elif name not in inside:
            out[name] = shape
    return out


def fused_for_file(sd: Mapping[str, torch.Tensor], c: TinyGPTConfig) -> dict[str, torch.Tensor]:
    """The model's tensors `sd` (all of them) as a checkpoint file of `c` holds them (`fusions`), in order."""
    fused = fusions(c)
    if not fused:
        return dict(sd)
    import torch

    first = {parts[0]: name for name, parts in fused.items()}
    inside = {p for parts in fused.values() for p in parts}
    out: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        if name in first:
            out[first[name]] = torch.cat([sd[p] for p in fused[first[name]]])
        elif name not in inside:
            out[name] = t
    return out


def match_weights(shapes: Mapping[str, tuple[int, ...]], c: TinyGPTConfig, *, where: str) -> list[str]:
    """The names to load from a checkpoint file holding `shapes` (`file_shapes`, and a tied lm_head where the file
    holds one: the load refuses it unless it is the embedding, `rlctl.models.tensors.check_tied`); ConfigError on a
    missing, extra or misshapen tensor. Ignored: `rotary_emb.inv_freq` buffers (older Llama files)."""
    want = file_shapes(c)
    for name, shape in want.items():
        if name not in shapes:
            raise ConfigError(where, None, f"tensor {name} is missing ({len(shapes)} tensors in the checkpoint)")
        if tuple(shapes[name]) != shape:
            raise ConfigError(
                where, None, f"tensor {name} has shape {list(shapes[name])}; config.json implies {list(shape)}"
            )
    ignorable = {"lm_head.weight"} if c.tie_word_embeddings else set()
    extra = [k for k in shapes if k not in want and k not in ignorable and not k.endswith("rotary_emb.inv_freq")]
    if extra:
        raise ConfigError(where, None, f"tensor {extra[0]} is not part of a {c.architecture} of this config.json")
    return [*want, *(k for k in ignorable if k in shapes)]
