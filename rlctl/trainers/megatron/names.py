"""rlctl's own HF ⇄ Megatron-core name and layout table for Llama/Qwen2/Qwen3/Mistral/Phi3 decoders (the local
layer spec; Mistral's names are Llama's, and Phi3's: its file's fused qkv_proj and gate_up_proj are split into them on
reading and fused back on writing, `rlctl.models.hfnames.fusions`, so the table sees q/k/v and gate/up apart).

    HF checkpoint (layer n: model.layers.n.)   Megatron-core GPTModel (decoder.layers.n−o.)    split over tp
    model.embed_tokens.weight      [V, h]   ⇄  embedding.word_embeddings.weight                rows
    input_layernorm.weight         [h]      ⇄  input_layernorm.weight                          replicated
    self_attn.{q,k,v}_proj.weight  [·, h]   ⇄  self_attention.linear_qkv.weight               query groups
    self_attn.{q,k,v}_proj.bias    [·]      ⇄  self_attention.linear_qkv.bias                 query groups
    self_attn.o_proj.weight        [h, q]   ⇄  self_attention.linear_proj.weight              columns
    self_attn.o_proj.bias          [h]      ⇄  self_attention.linear_proj.bias (Llama attention_bias) replicated
    self_attn.q_norm.weight        [d]      ⇄  self_attention.q_layernorm.weight (Qwen3)      replicated
    self_attn.k_norm.weight        [d]      ⇄  self_attention.k_layernorm.weight (Qwen3)      replicated
    post_attention_layernorm.weight         ⇄  pre_mlp_layernorm.weight                        replicated
    mlp.gate_proj / up_proj.weight [i, h]   ⇄  mlp.linear_fc1.weight = cat(gate, up)           rows of each
    mlp.down_proj.weight           [h, i]   ⇄  mlp.linear_fc2.weight                           columns
    model.norm.weight                       ⇄  decoder.final_layernorm.weight                  replicated
    lm_head.weight                 [V, h]   ⇄  output_layer.weight (absent when tied)          rows

Pipeline parallel (pp stages, `Stage`): stage s holds the HF layers [s·L/pp, (s+1)·L/pp) under megatron's
local numbers (o = s·L/pp above: megatron numbers each stage's layers from 0), the embedding on the first
stage, the final norm and lm_head on the last. With tied embeddings and pp > 1 the last stage holds a copy of
the embedding as `output_layer.weight` (megatron's shared embedding): it is loaded from embed_tokens and not
exported, the first stage's copy is. Each HF name has one owning stage (`stage_of`).

Fused QKV, per query group g (G = num_key_value_heads groups of H/G query heads each, head_dim d):

    linear_qkv rows = [ q heads of g=0 (H/G·d) ‖ k of g=0 (d) ‖ v of g=0 (d) ‖ q heads of g=1 ‖ … ]

Tensor parallel rank r of tp holds groups [r·G/tp, (r+1)·G/tp) of that layout, i.e. the rows of its own
query heads and their k/v; `linear_fc1` on rank r is cat(gate rows of r, up rows of r) (megatron's
SwiGLU chunks the local output in two). So every rank exports an HF-layout *shard* with the HF names
(`to_hf`): q/k/v/gate/up/embedding/lm_head rows, o_proj/down_proj columns, the rest whole. The full HF
tensors are the shards concatenated in rank order along `shard_dim(name)` (`gather_hf`): no
re-interleaving is needed after the export, which is why each rank can export (and delta-encode) its
own shard. Only slicing and concatenation happen here, so HF → Megatron → HF is bit-exact.

Qwen3's q/k norms are one [head_dim] weight each, shared by every head: every tp rank holds all of it and
applies it to its own heads only, so its gradient on a rank is that rank's heads' part (the backend sums the
parts over the tp group before clipping: `MegatronBackend.clip_grad_norm_`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import torch

from rlctl.models.hf import TinyGPTConfig
from rlctl.models.hfnames import expected_shapes

_ROWS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head")
_COLUMNS = ("o_proj.weight", "down_proj.weight")


@dataclass(frozen=True)
class Stage:
    """Pipeline stage `index` of `count` (the whole model when count = 1)."""

    index: int = 0
    count: int = 1

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.count - 1

    def layers(self, c: TinyGPTConfig) -> range:
        """The HF (global) layer indices this stage holds, in megatron's local order."""
        per = c.num_hidden_layers // self.count
        return range(self.index * per, (self.index + 1) * per)


def check_split(c: TinyGPTConfig, tp: int, pp: int = 1) -> None:
    """ValueError unless `tp` divides what megatron-core splits (query groups, MLP width, vocabulary) and `pp`
    the layers."""
    if c.num_hidden_layers % pp:
        raise ValueError(
            f"pipeline parallel {pp} does not divide num_hidden_layers {c.num_hidden_layers}; "
            "use a divisor (every stage holds as many layers)"
        )
    for what, n in (
        ("num_key_value_heads", c.num_key_value_heads),
        ("intermediate_size", c.intermediate_size),
        ("vocab_size", c.vocab_size),
    ):
        if n % tp:
            raise ValueError(f"tensor parallel {tp} does not divide {what} {n}")


def shard_dim(name: str) -> int | None:
    """The dimension along which tp ranks hold parts of HF tensor `name` (None: every rank holds all of it)."""
    if name.endswith(_COLUMNS):
        return 1
    return 0 if any(f"{part}." in name for part in _ROWS) else None


def stage_of(name: str, c: TinyGPTConfig, pp: int) -> int:
    """The pipeline stage that holds (and exports) HF tensor `name`."""
    if name.startswith("model.layers."):
        return int(name.split(".")[2]) // (c.num_hidden_layers // pp)
    return 0 if name == "model.embed_tokens.weight" else pp - 1


def _prefixes(c: TinyGPTConfig, stage: Stage) -> list[tuple[int, str, str]]:
    """(HF layer index, HF prefix, Megatron prefix) of each layer of `stage`."""
    return [(n, f"model.layers.{n}.", f"decoder.layers.{i}.") for i, n in enumerate(stage.layers(c))]


def _stage_names(c: TinyGPTConfig, stage: Stage) -> dict[str, tuple[int, ...]]:
    """The HF names (and shapes) `stage` exports, in HF order."""
    return {k: v for k, v in expected_shapes(c).items() if stage_of(k, c, stage.count) == stage.index}


def _layer_names(hf: str, mg: str) -> list[tuple[str, str]]:
    """(HF, Megatron) names of one layer's tensors that map one to one, under the layer prefixes `hf`, `mg`."""
    return [
        (hf + "input_layernorm.weight", mg + "input_layernorm.weight"),
        (hf + "post_attention_layernorm.weight", mg + "pre_mlp_layernorm.weight"),
        (hf + "self_attn.o_proj.weight", mg + "self_attention.linear_proj.weight"),
        (hf + "self_attn.o_proj.bias", mg + "self_attention.linear_proj.bias"),
        (hf + "self_attn.q_norm.weight", mg + "self_attention.q_layernorm.weight"),
        (hf + "self_attn.k_norm.weight", mg + "self_attention.k_layernorm.weight"),
        (hf + "mlp.down_proj.weight", mg + "mlp.linear_fc2.weight"),
    ]


def _one_to_one(c: TinyGPTConfig, stage: Stage) -> list[tuple[str, str]]:
    pairs = [("model.embed_tokens.weight", "embedding.word_embeddings.weight")] if stage.first else []
    for _, hf, mg in _prefixes(c, stage):
        pairs += _layer_names(hf, mg)
    if stage.last:
        pairs.append(("model.norm.weight", "decoder.final_layernorm.weight"))
        if not c.tie_word_embeddings:
            pairs.append(("lm_head.weight", "output_layer.weight"))
    return pairs


def _split(t: torch.Tensor, dim: int | None, *, tp: int, rank: int) -> torch.Tensor:
    return t if dim is None or tp == 1 else t.chunk(tp, dim=dim)[rank].contiguous()


def to_megatron(
    hf: Mapping[str, torch.Tensor],
    c: TinyGPTConfig,
    *,
    tp: int = 1,
    rank: int = 0,
    stage: Stage = Stage(),
    only: Collection[str] | None = None,
) -> dict[str, torch.Tensor]:
    """The GPTModel state dict of tensor parallel rank `rank` in pipeline stage `stage` from full HF tensors (a
    checkpoint of `c`); `only`: just those megatron names, reading just the HF tensors they are made of."""
    check_split(c, tp, stage.count)
    want = expected_shapes(c)
    keep = (lambda _: True) if only is None else only.__contains__
    pairs = _one_to_one(c, stage)
    out = {mg: _split(hf[name], shard_dim(name), tp=tp, rank=rank) for name, mg in pairs if name in want and keep(mg)}
    if c.tie_word_embeddings and stage.last and not stage.first and keep("output_layer.weight"):  # the shared copy
        out["output_layer.weight"] = _split(hf["model.embed_tokens.weight"], 0, tp=tp, rank=rank)
    g, per, d = c.num_key_value_heads, c.num_attention_heads // c.num_key_value_heads, c.head_dim
    for _, hp, mp in _prefixes(c, stage):
        for kind in ("weight", "bias") if c.qkv_bias else ("weight",):
            if not keep(f"{mp}self_attention.linear_qkv.{kind}"):
                continue
            q, k, v = (hf[f"{hp}self_attn.{p}_proj.{kind}"] for p in "qkv")
            rest = q.shape[1:]
            fused = torch.cat([q.reshape(g, per * d, *rest), k.reshape(g, d, *rest), v.reshape(g, d, *rest)], dim=1)
            out[f"{mp}self_attention.linear_qkv.{kind}"] = fused.chunk(tp, dim=0)[rank].reshape(-1, *rest)
        if keep(f"{mp}mlp.linear_fc1.weight"):
            gate, up = (_split(hf[f"{hp}mlp.{p}_proj.weight"], 0, tp=tp, rank=rank) for p in ("gate", "up"))
            out[f"{mp}mlp.linear_fc1.weight"] = torch.cat([gate, up], dim=0)
    return out


def to_hf(
    mg: Mapping[str, torch.Tensor],
    c: TinyGPTConfig,
    *,
    tp: int = 1,
    stage: Stage = Stage(),
    only: Collection[str] | None = None,
) -> dict[str, torch.Tensor]:
    """This rank's HF-layout shard (HF names, no lm_head when tied) from its GPTModel state dict `mg`: the
    tensors of its pipeline `stage`, each its tp part; with tp = pp = 1 the full checkpoint. `gather_hf`
    joins the tp shards of one stage. `only`: just those HF names, reading just the megatron tensors they are in."""
    want = {k: v for k, v in _stage_names(c, stage).items() if only is None or k in only}
    out = {name: mg[m] for name, m in _one_to_one(c, stage) if name in want}
    g, per, d = c.num_key_value_heads // tp, c.num_attention_heads // c.num_key_value_heads, c.head_dim
    for _, hp, mp in _prefixes(c, stage):
        for kind in ("weight", "bias") if c.qkv_bias else ("weight",):
            if not any(f"{hp}self_attn.{p}_proj.{kind}" in want for p in "qkv"):
                continue
            fused = mg[f"{mp}self_attention.linear_qkv.{kind}"]
            rest = fused.shape[1:]
            q, k, v = fused.reshape(g, (per + 2) * d, *rest).split([per * d, d, d], dim=1)
            for p, t in zip("qkv", (q, k, v), strict=True):
                out[f"{hp}self_attn.{p}_proj.{kind}"] = t.reshape(-1, *rest)
        if f"{hp}mlp.gate_proj.weight" in want or f"{hp}mlp.up_proj.weight" in want:
            gate, up = mg[f"{mp}mlp.linear_fc1.weight"].chunk(2, dim=0)
            out[f"{hp}mlp.gate_proj.weight"], out[f"{hp}mlp.up_proj.weight"] = gate, up
    return {name: out[name].detach().contiguous() for name in want}  # HF order


def gather_hf(shards: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Full HF tensors from every tp rank's `to_hf` shard (rank order): concatenated along `shard_dim`,
    replicated tensors taken from rank 0."""
    return {
        name: t if (dim := shard_dim(name)) is None else torch.cat([s[name] for s in shards], dim=dim)
        for name, t in shards[0].items()
    }
