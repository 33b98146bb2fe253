"""rlctl's HF ⇄ Megatron name and layout table, on tensors alone (no megatron-core needed): the fused QKV
interleave per query group, fc1 = gate ‖ up per tp rank, pipeline stages' local layer numbers, and
HF → Megatron → HF bit for bit; Qwen3's per-head q/k norms whole on every tp rank."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlctl.models.hf import TinyGPTConfig
from rlctl.models.hfnames import expected_shapes, fused_for_file
from rlctl.models.tensors import ModelTensors
from rlctl.trainers.megatron.names import Stage, check_split, gather_hf, shard_dim, stage_of, to_hf, to_megatron

GQA = TinyGPTConfig(
    vocab_size=16,
    hidden_size=8,
    intermediate_size=12,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    explicit_head_dim=3,
    architecture="Qwen2ForCausalLM",
    tie_word_embeddings=True,
)
LLAMA_BIAS = TinyGPTConfig(
    vocab_size=16,
    hidden_size=8,
    intermediate_size=12,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    attention_bias=True,
)


QWEN3 = dataclasses.replace(GQA, architecture="Qwen3ForCausalLM", tie_word_embeddings=False, attention_bias=True)
MISTRAL = dataclasses.replace(GQA, architecture="MistralForCausalLM", tie_word_embeddings=False)  # Llama's names


def checkpoint(c: TinyGPTConfig, *, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(shape, generator=g) for k, shape in expected_shapes(c).items()}


LLAMA = TinyGPTConfig(vocab_size=16, hidden_size=8, intermediate_size=12, num_attention_heads=2, num_key_value_heads=2)


@pytest.mark.parametrize(
    "c", [GQA, LLAMA_BIAS, LLAMA, QWEN3, MISTRAL], ids=["qwen2-gqa-tied", "llama-bias", "llama", "qwen3", "mistral"]
)
@pytest.mark.parametrize("tp", [1, 2])
def test_hf_to_megatron_to_hf_is_bit_exact_per_rank_and_gathered(c: TinyGPTConfig, tp: int) -> None:
    hf = checkpoint(c)
    shards = [to_hf(to_megatron(hf, c, tp=tp, rank=r), c, tp=tp) for r in range(tp)]
    full = gather_hf(shards)
    assert list(full) == list(hf)  # HF names, HF order, no lm_head when tied
    assert all(torch.equal(full[k], hf[k]) for k in hf)
    for name, t in shards[-1].items():  # each rank's shard is its slice of the HF tensor
        dim = shard_dim(name)
        want = hf[name] if dim is None else hf[name].chunk(tp, dim=dim)[-1]
        assert torch.equal(t, want), name


@pytest.mark.parametrize("tp", [1, 2])
def test_a_phi3_files_fused_tensors_are_megatrons_per_query_group_and_back(tp: int) -> None:
    """A Phi3 file's qkv_proj [q; k; v] and gate_up_proj [gate; up] (transformers' layout) reach megatron's linear_qkv
    (per query group: a group's q heads, its k, its v) and linear_fc1 (each rank's gate rows, then its up rows) through
    the model's names (`ModelTensors`), and an export fuses them back bit for bit."""
    c = dataclasses.replace(GQA, architecture="Phi3ForCausalLM", tie_word_embeddings=False)
    file = fused_for_file(checkpoint(c), c)
    d, p = c.head_dim, "model.layers.0."
    qkv, gate_up = file[f"{p}self_attn.qkv_proj.weight"], file[f"{p}mlp.gate_up_proj.weight"]
    q, k, v = qkv.split([4 * d, 2 * d, 2 * d])
    gate, up = gate_up.chunk(2)
    for r in range(tp):
        mg = to_megatron(ModelTensors(file, c), c, tp=tp, rank=r)
        groups = range(r * 2 // tp, (r + 1) * 2 // tp)
        want = torch.cat([torch.cat([q[2 * g * d : (2 * g + 2) * d], k[g * d : (g + 1) * d], v[g * d : (g + 1) * d]])
                          for g in groups])  # fmt: skip
        assert torch.equal(mg["decoder.layers.0.self_attention.linear_qkv.weight"], want)
        fc1 = torch.cat([gate.chunk(tp)[r], up.chunk(tp)[r]])
        assert torch.equal(mg["decoder.layers.0.mlp.linear_fc1.weight"], fc1)
    back = fused_for_file(gather_hf([to_hf(to_megatron(ModelTensors(file, c), c, tp=tp, rank=r), c, tp=tp)
                                     for r in range(tp)]), c)  # fmt: skip
    assert list(back) == list(file) and all(torch.equal(back[k], file[k]) for k in file)


def test_fused_qkv_is_q_heads_then_k_then_v_per_query_group_and_tp_ranks_take_whole_groups() -> None:
    c, d = GQA, GQA.head_dim  # 4 query heads in 2 groups, head_dim 3
    hf = checkpoint(c)
    p = "model.layers.0.self_attn."
    # label every row with (projection, head): q heads 0..3, k/v groups 0..1
    for proj, heads in (("q", 4), ("k", 2), ("v", 2)):
        hf[f"{p}{proj}_proj.bias"] = torch.tensor(
            [float(f"{'qkv'.index(proj) + 1}{h}") for h in range(heads) for _ in range(d)]
        )
    rows = lambda t: [int(x) for x in t[::d].tolist()]  # noqa: E731  one label per head
    whole = to_megatron(hf, c)["decoder.layers.0.self_attention.linear_qkv.bias"]
    assert rows(whole) == [10, 11, 20, 30, 12, 13, 21, 31]  # [q0 q1 k0 v0 | q2 q3 k1 v1]
    ranks = [to_megatron(hf, c, tp=2, rank=r)["decoder.layers.0.self_attention.linear_qkv.bias"] for r in (0, 1)]
    assert [rows(t) for t in ranks] == [[10, 11, 20, 30], [12, 13, 21, 31]]


def test_fc1_is_gate_then_up_on_every_rank() -> None:
    c = GQA
    hf = checkpoint(c)
    gate, up = hf["model.layers.1.mlp.gate_proj.weight"], hf["model.layers.1.mlp.up_proj.weight"]
    assert torch.equal(to_megatron(hf, c)["decoder.layers.1.mlp.linear_fc1.weight"], torch.cat([gate, up]))
    r1 = to_megatron(hf, c, tp=2, rank=1)["decoder.layers.1.mlp.linear_fc1.weight"]
    assert torch.equal(r1, torch.cat([gate[6:], up[6:]]))


def test_names_cover_megatron_and_tied_embeddings_have_no_output_layer() -> None:
    mg = to_megatron(checkpoint(GQA), GQA)
    assert "output_layer.weight" not in mg and "embedding.word_embeddings.weight" in mg
    layer = sorted(k.removeprefix("decoder.layers.0.") for k in mg if k.startswith("decoder.layers.0."))
    assert layer == [
        "input_layernorm.weight",
        "mlp.linear_fc1.weight",
        "mlp.linear_fc2.weight",
        "pre_mlp_layernorm.weight",
        "self_attention.linear_proj.weight",
        "self_attention.linear_qkv.bias",
        "self_attention.linear_qkv.weight",
    ]
    untied = to_megatron(checkpoint(LLAMA_BIAS), LLAMA_BIAS)
    assert "output_layer.weight" in untied and "decoder.layers.0.self_attention.linear_proj.bias" in untied


def test_qwen3_q_and_k_norms_are_megatrons_qk_layernorms_whole_on_every_tp_rank() -> None:
    hf = checkpoint(QWEN3)
    for r in (0, 1):
        mg = to_megatron(hf, QWEN3, tp=2, rank=r, stage=Stage(1, 2))  # HF layer 1 is the stage's layer 0
        for hf_name, mg_name in (("q_norm", "q_layernorm"), ("k_norm", "k_layernorm")):
            whole = hf[f"model.layers.1.self_attn.{hf_name}.weight"]
            assert whole.shape == (QWEN3.head_dim,)
            assert torch.equal(mg[f"decoder.layers.0.self_attention.{mg_name}.weight"], whole)
            assert shard_dim(f"model.layers.1.self_attn.{hf_name}.weight") is None
    layer = sorted(k.removeprefix("decoder.layers.0.") for k in to_megatron(hf, QWEN3) if "layers.0." in k)
    assert [k for k in layer if "layernorm" in k] == [
        "input_layernorm.weight",
        "pre_mlp_layernorm.weight",
        "self_attention.k_layernorm.weight",
        "self_attention.q_layernorm.weight",
    ]


def test_a_tp_that_does_not_split_the_query_groups_is_refused() -> None:
    with pytest.raises(ValueError, match="does not divide num_key_value_heads 2"):
        check_split(GQA, 4)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_pipeline_stages_hold_their_layers_under_local_numbers_and_export_each_tensor_once(tied: bool) -> None:
    c = dataclasses.replace(GQA, num_hidden_layers=4, tie_word_embeddings=tied)
    hf = checkpoint(c)
    stages = [Stage(s, 2) for s in range(2)]
    mg = [to_megatron(hf, c, tp=2, rank=1, stage=s) for s in stages]
    # stage 1 numbers HF layers 2-3 as its 0-1; the embedding is first-stage, the final norm last-stage
    assert torch.equal(
        mg[1]["decoder.layers.1.mlp.linear_fc2.weight"], hf["model.layers.3.mlp.down_proj.weight"][:, 6:]
    )
    assert not any(k.startswith("decoder.layers.2.") for m in mg for k in m)
    assert "embedding.word_embeddings.weight" in mg[0] and "embedding.word_embeddings.weight" not in mg[1]
    assert "decoder.final_layernorm.weight" in mg[1] and "decoder.final_layernorm.weight" not in mg[0]
    # the last stage's output layer: lm_head, or the tied embedding's copy
    want = hf["model.embed_tokens.weight" if tied else "lm_head.weight"].chunk(2)[1]
    assert torch.equal(mg[1]["output_layer.weight"], want) and "output_layer.weight" not in mg[0]
    exported = [
        gather_hf([to_hf(to_megatron(hf, c, tp=2, rank=r, stage=s), c, tp=2, stage=s) for r in range(2)])
        for s in stages
    ]
    assert not set(exported[0]) & set(exported[1])  # each tensor once (the tied copy is not exported)
    assert [stage_of(k, c, 2) for k in exported[0]] == [0] * len(exported[0])
    full = exported[0] | exported[1]
    assert sorted(full) == sorted(hf) and all(torch.equal(full[k], hf[k]) for k in hf)


def test_a_pp_that_splits_the_layers_unevenly_is_refused() -> None:
    with pytest.raises(ValueError, match="pipeline parallel 2 does not divide num_hidden_layers 1"):
        check_split(LLAMA_BIAS, 1, 2)


class Reads(dict):
    """A state dict that records the names read from it."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.read: set[str] = set()

    def __getitem__(self, name: str) -> torch.Tensor:
        self.read.add(name)
        return super().__getitem__(name)


@pytest.mark.parametrize("c", [GQA, LLAMA_BIAS, QWEN3], ids=["qwen2-gqa-tied", "llama-bias", "qwen3"])
def test_only_one_name_is_that_tensor_of_the_whole_conversion_reading_just_its_sources(c: TinyGPTConfig) -> None:
    hf = checkpoint(c)
    stage = Stage(1, 2) if c.num_hidden_layers == 2 else Stage()
    sources = {"self_attention.linear_qkv": ("q_proj", "k_proj", "v_proj"), "mlp.linear_fc1": ("gate_proj", "up_proj")}
    mg = to_megatron(hf, c, tp=2, rank=1, stage=stage)
    for name, whole in mg.items():
        reads = Reads(hf)
        assert to_megatron(reads, c, tp=2, rank=1, stage=stage, only={name}).keys() == {name}
        assert torch.equal(to_megatron(hf, c, tp=2, rank=1, stage=stage, only={name})[name], whole)
        fused = next((v for k, v in sources.items() if k in name), None)
        assert len(reads.read) == (len(fused) if fused else 1), (name, reads.read)
    exported = to_hf(mg, c, tp=2, stage=stage)
    for name, part in exported.items():
        reads = Reads(mg)
        assert torch.equal(to_hf(reads, c, tp=2, stage=stage, only={name})[name], part)
        assert len(reads.read) == 1, (name, reads.read)
