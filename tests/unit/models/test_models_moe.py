"""Qwen3MoE checkpoints (Qwen3-30B-A3B, Qwen3-235B-A22B) and Qwen2MoE ones (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B):
config.json read as transformers 5's Qwen3MoeConfig and Qwen2MoeConfig read it, which layers have experts, the files
rlctl writes read back by transformers. Logits, gradients, decoding and export against transformers run with the
other architectures' (test_models_hf, its `MOE` variants)."""

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from rlctl.models.hf import MoeConfig, TinyGPTConfig
from rlctl.models.hfdir import check_hf_dir
from rlctl.models.tinygpt import SparseMoE, TinyGPT
from rlctl.models.weightfiles import safetensors_header
from tests.unit.hf_checkpoints import MOE, as_transformers_holds, refused_in_one_line, write_checkpoint

transformers = pytest.importorskip("transformers")

BASE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 64,
        "num_attention_heads": 4, "intermediate_size": 96, "num_hidden_layers": 6, "vocab_size": 96}  # fmt: skip


@pytest.mark.parametrize(
    "keys",
    [{}, {"decoder_sparse_step": 2}, {"decoder_sparse_step": 3, "mlp_only_layers": [2]},
     {"mlp_only_layers": [0, 5]}, {"num_experts": 0}, {"mlp_only_layers": None}],
)  # fmt: skip
def test_the_layers_with_experts_are_transformers_own(keys: dict[str, Any]) -> None:
    """Qwen3MoeDecoderLayer's rule: experts unless the layer is in mlp_only_layers, or (its number + 1) is not a
    multiple of decoder_sparse_step, or num_experts is 0; a dense layer's MLP has intermediate_size."""
    d = {**BASE, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, **keys}
    with torch.device("meta"):
        theirs = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**d))
        ours = TinyGPT(TinyGPTConfig.from_hf(d))
    want = [type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock" for layer in theirs.model.layers]
    assert [isinstance(layer.mlp, SparseMoE) for layer in ours.blocks()] == want
    assert 0 < sum(want) < 6 or keys in ({}, {"num_experts": 0}, {"mlp_only_layers": None})
    shapes = {k: tuple(v.shape) for k, v in as_transformers_holds(ours.state_dict(), ours.config).items()}
    assert shapes == {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert ours.config.num_params() == sum(p.numel() for p in theirs.parameters())


MOE_KEYS = ["num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
            "mlp_only_layers", "router_aux_loss_coef", "output_router_logits"]  # fmt: skip


@pytest.mark.parametrize(
    "key", [*MOE_KEYS, "num_key_value_heads", "max_position_embeddings", "head_dim", "rms_norm_eps", "eos_token_id"]
)
def test_a_key_config_json_leaves_out_reads_as_qwen3moeconfig_reads_it(key: str) -> None:
    """Qwen3MoeConfig's defaults (128 experts, top 8 of them not renormalised, 768 wide, 4 K/V heads, 32768 positions,
    head_dim hidden / heads where Qwen3Config's is 128), versus Qwen3MoeForCausalLM refused."""
    theirs = transformers.Qwen3MoeConfig.from_dict(BASE)
    ours = TinyGPTConfig.from_hf(BASE)
    assert ours.moe is not None
    if key in MOE_KEYS:
        got = getattr(ours.moe, key)
        assert (list(got) if key == "mlp_only_layers" else got) == getattr(theirs, key)
    elif key == "head_dim":
        assert ours.head_dim == 16 == theirs.hidden_size // theirs.num_attention_heads and "head_dim" not in theirs
    else:
        assert getattr(ours, key) == getattr(theirs, key)


def test_transformers_5s_num_local_experts_reads_as_num_experts(tmp_path: Path) -> None:
    """transformers 5 writes a Qwen3MoE's num_experts as num_local_experts (Qwen3MoeConfig's attribute_map), a
    published config.json says num_experts: both are read; both saying different numbers is refused."""
    write_checkpoint("qwen3moe-dense1-hd32", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["num_local_experts"] == 8 and "num_experts" not in cfg
    assert check_hf_dir(tmp_path).config.moe == MoeConfig(8, 2, 32, mlp_only_layers=(1,))
    cfg["num_experts"] = 4
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    refused_in_one_line(tmp_path, "num_local_experts", "8 is not num_experts 4; keep one")


@pytest.mark.parametrize("variant", list(MOE))
def test_an_export_is_the_file_and_config_transformers_reads(tmp_path: Path, variant: str) -> None:
    """rlctl's save: each expert's gate/up/down, the router (and a Qwen2MoE's shared expert and its gate) under the
    names transformers 5 writes (its file, not its model's 3-D tensors), loaded by transformers into the same tensors,
    and a config.json its config class reads as the checkpoint's own (num_experts under the name published checkpoints
    and transformers 4 use)."""
    ref = write_checkpoint(variant, tmp_path / "src")
    TinyGPT.from_pretrained(tmp_path / "src").save_pretrained(tmp_path / "out")
    assert safetensors_header(tmp_path / "out/model.safetensors") == safetensors_header(
        tmp_path / "src/model.safetensors"
    )
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    want, got = ref.state_dict(), back.state_dict()
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
    out = json.loads((tmp_path / "out/config.json").read_text())
    assert (out["architectures"], out["model_type"]) == (ref.config.architectures, ref.config.model_type)
    read = type(ref.config).from_pretrained(tmp_path / "out")
    qwen2 = ref.config.model_type == "qwen2_moe"
    keys = [*MOE_KEYS, "tie_word_embeddings", *(["shared_expert_intermediate_size", "qkv_bias"] if qwen2 else [])]
    assert all(getattr(read, k) == getattr(ref.config, k) for k in [*keys, "qkv_bias" if qwen2 else "attention_bias"])
    assert qwen2 == ("shared_expert_intermediate_size" in out)
    hidden_per_head = ref.config.hidden_size // ref.config.num_attention_heads  # (Qwen3MoeAttention's without one)
    assert read.head_dim == getattr(ref.config, "head_dim", hidden_per_head)


def test_the_router_weighs_each_tokens_top_k_experts_as_qwen3moe_does() -> None:
    """One layer on its own against Qwen3MoeSparseMoeBlock, in fp32 and bf16 (its router's softmax in fp32 and
    the weights cast back), renormalised and not."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    for norm in (False, True):
        d = {**BASE, "num_experts": 6, "num_experts_per_tok": 3, "moe_intermediate_size": 16, "norm_topk_prob": norm}
        torch.manual_seed(0)
        theirs = Qwen3MoeSparseMoeBlock(transformers.Qwen3MoeConfig(**d))
        for p in theirs.parameters():
            torch.nn.init.normal_(p, std=0.2)
        ours = SparseMoE(TinyGPTConfig.from_hf(d))
        ours.load_state_dict(_file_names(theirs))
        x = torch.randn(2, 9, 64)
        for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):  # (its grouped_mm: another order)
            with torch.no_grad():
                got, want = ours.to(dtype)(x.to(dtype)), theirs.to(dtype)(x.to(dtype))
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def _file_names(block: Any) -> dict[str, torch.Tensor]:
    """A Qwen3MoeSparseMoeBlock's (or Qwen2MoeSparseMoeBlock's) tensors under a file's names (each expert apart)."""
    out = {"gate.weight": block.gate.weight.detach()}
    if (shared := getattr(block, "shared_expert", None)) is not None:  # a Qwen2MoeSparseMoeBlock's
        out |= {f"shared_expert.{k}": v.detach() for k, v in shared.state_dict().items()}
        out["shared_expert_gate.weight"] = block.shared_expert_gate.weight.detach()
    m = block.experts.intermediate_dim
    for e in range(block.experts.num_experts):
        gate, up = block.experts.gate_up_proj[e].detach().split(m)
        out |= {f"experts.{e}.gate_proj.weight": gate, f"experts.{e}.up_proj.weight": up,
                f"experts.{e}.down_proj.weight": block.experts.down_proj[e].detach()}  # fmt: skip
    return out


@pytest.mark.parametrize(
    ("key", "value", "complaint"),
    [
        ("num_experts_per_tok", 9, "9 is more than num_experts 8"),
        ("num_local_experts", -1, "-1 is not a number of experts"),
        ("norm_topk_prob", "yes", "is not true or false"),
        ("output_router_logits", 1, "is not true or false"),
        ("mlp_only_layers", "1", "is not a list of layer numbers"),
        ("mlp_only_layers", [-1], "is not a list of layer numbers"),
        ("router_aux_loss_coef", -0.1, "is not a number ≥ 0"),
        ("moe_intermediate_size", 0, "is not a positive integer"),
        ("decoder_sparse_step", 0, "is not a positive integer"),
    ],
)
def test_a_moe_key_that_is_not_valid_is_refused_in_one_line(
    tmp_path: Path, key: str, value: object, complaint: str
) -> None:
    write_checkpoint("qwen3moe-dense1-hd32", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg[key] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    refused_in_one_line(tmp_path, key, complaint)


BASE2 = {**BASE, "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "num_attention_heads": 16}


@pytest.mark.parametrize(
    "keys",
    [{}, {"decoder_sparse_step": 2}, {"mlp_only_layers": [0, 5]}, {"num_experts": 0}, {"tie_word_embeddings": True}],
)
def test_a_qwen2_moes_layers_and_tensors_are_transformers_own(keys: dict[str, Any]) -> None:
    """Qwen2MoeDecoderLayer's rule for which layers have experts (Qwen3MoE's), each such layer's shared expert and its
    gate beside them, the q/k/v bias: the same tensors and shapes as Qwen2MoeForCausalLM, and its parameter count."""
    d = {**BASE2, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
         "shared_expert_intermediate_size": 24, **keys}  # fmt: skip
    with torch.device("meta"):
        theirs = transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(**d))
        ours = TinyGPT(TinyGPTConfig.from_hf(d))
    want = [type(layer.mlp).__name__ == "Qwen2MoeSparseMoeBlock" for layer in theirs.model.layers]
    assert [isinstance(layer.mlp, SparseMoE) for layer in ours.blocks()] == want
    shapes = {k: tuple(v.shape) for k, v in as_transformers_holds(ours.state_dict(), ours.config).items()}
    assert shapes == {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert ours.config.num_params() == sum(p.numel() for p in theirs.parameters())
    assert any("mlp.shared_expert_gate" in k for k in shapes) == any(want)


@pytest.mark.parametrize(
    "key",
    [*MOE_KEYS, "shared_expert_intermediate_size", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps",
     "eos_token_id", "qkv_bias"],
)  # fmt: skip
def test_a_key_config_json_leaves_out_reads_as_qwen2moeconfig_reads_it(key: str) -> None:
    """Qwen2MoeConfig's defaults (Qwen1.5-MoE-A2.7B's 60 experts, top 4 not renormalised, 1408 wide, a shared expert
    5632 wide; 16 K/V heads, 32768 positions, q/k/v bias), not Qwen3MoeConfig's."""
    theirs = transformers.Qwen2MoeConfig.from_dict(BASE2)
    ours = TinyGPTConfig.from_hf(BASE2)
    assert ours.moe is not None
    if key in (*MOE_KEYS, "shared_expert_intermediate_size"):
        got = getattr(ours.moe, key)
        assert (list(got) if key == "mlp_only_layers" else got) == getattr(theirs, key)
    else:
        assert getattr(ours, key) == getattr(theirs, key)


def test_the_shared_expert_is_added_gated_as_qwen2moe_adds_it() -> None:
    """One Qwen2MoE layer on its own against Qwen2MoeSparseMoeBlock, in fp32 and bf16: the routed experts' sum plus
    sigmoid(shared_expert_gate · x) × the shared expert's output, renormalised and not; and the shared expert counts
    (the same block without it is further off than the tolerance)."""
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    for norm in (False, True):
        d = {**BASE2, "num_experts": 6, "num_experts_per_tok": 3, "moe_intermediate_size": 16,
             "shared_expert_intermediate_size": 40, "norm_topk_prob": norm}  # fmt: skip
        torch.manual_seed(0)
        theirs = Qwen2MoeSparseMoeBlock(transformers.Qwen2MoeConfig(**d))
        for p in theirs.parameters():
            torch.nn.init.normal_(p, std=0.2)
        ours = SparseMoE(TinyGPTConfig.from_hf(d))
        ours.load_state_dict(_file_names(theirs))
        x = torch.randn(2, 9, 64)
        for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):  # (its grouped_mm: another order)
            with torch.no_grad():
                got, want = ours.to(dtype)(x.to(dtype)), theirs.to(dtype)(x.to(dtype))
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)
        ours.float().shared_expert = None
        with torch.no_grad():
            assert (ours(x) - theirs.float()(x)).abs().max() > 1e-2


@pytest.mark.parametrize(
    ("key", "value", "complaint"),
    [
        ("shared_expert_intermediate_size", 0, "0 is not a positive integer"),
        ("qkv_bias", False, "False is not supported; supported: true"),
        ("num_local_experts", 8, "is not a Qwen2MoeConfig key (it reads num_experts); give num_experts"),
        ("num_experts_per_tok", 9, "9 is more than num_experts 8"),
    ],
)
def test_what_a_qwen2_moe_would_compute_otherwise_is_refused_in_one_line(
    tmp_path: Path, key: str, value: object, complaint: str
) -> None:
    """A Qwen2MoE without a shared expert (vLLM's builds none of width 0, transformers' one), without q/k/v bias
    (vLLM's Qwen2MoeAttention has one whatever config.json says), or with its experts counted under transformers 5's
    Qwen3MoE name, which Qwen2MoeConfig does not read (its 60 experts): refused naming the key."""
    write_checkpoint("qwen2moe-dense1", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg[key] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    refused_in_one_line(tmp_path, key, complaint)


def test_a_qwen3_moe_with_a_shared_expert_size_is_refused_in_one_line(tmp_path: Path) -> None:
    """`shared_expert_intermediate_size` in a Qwen3MoE's config.json: transformers' Qwen3MoE builds no shared expert
    from it (nor does rlctl), vLLM's adds one of that size (its Qwen3MoeSparseMoeBlock, where it is > 0), so the
    engines would sample from another model than the trainer trains: refused naming the key; 0 is what both run."""
    write_checkpoint("qwen3moe-dense1-hd32", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"shared_expert_intermediate_size": 0}))
    assert check_hf_dir(tmp_path).config.moe == MoeConfig(8, 2, 32, mlp_only_layers=(1,))
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"shared_expert_intermediate_size": 64}))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)  # (loads it, computing without one)
    assert not any("shared_expert" in name for name in theirs.state_dict())
    refused_in_one_line(tmp_path, "shared_expert_intermediate_size", "64 is not supported: vLLM's Qwen3MoE adds a")
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"shared_expert_intermediate_size": "64"}))
    refused_in_one_line(tmp_path, "shared_expert_intermediate_size", "'64' is not supported; supported: 0 (no shared")


def test_the_engines_bucketed_steps_decode_a_moe_as_its_exact_ones(tmp_path: Path) -> None:
    """The embedded engine's static shapes (a CUDA device's default: there without graphs for a MoE, whose routing
    reads the chosen experts on the host) decode a Qwen3MoE's free rows (past the live ones) without changing the
    live rows' tokens: the same greedy tokens as at the exact shapes."""
    from rlctl.engines import EmbeddedEngine, GenRequest

    write_checkpoint("qwen3moe-step2-norm-tied", tmp_path)
    prompts = [[1, 40, 41, 42], [1, 7], [1, 90, 12, 13, 14, 15, 16]]
    got = []
    for static in (False, True):
        engine = EmbeddedEngine(TinyGPT.from_pretrained(tmp_path), max_batch_size=4, temperature=0.0,
                                static_shapes=static)  # fmt: skip
        assert engine._graphs is None
        engine.add([GenRequest(f"p{i}", p, 12, ignore_eos=True) for i, p in enumerate(prompts)])
        got.append({r.request_id: r.output_tokens for r in engine.run_until_done()})
    assert got[0] == got[1] and len(got[0]) == 3


def test_lora_adapters_on_the_experts_get_a_gradient_each_where_no_token_chose_the_expert() -> None:
    """LoRA (its adapters on each expert's gate/up/down, the router frozen): every expert runs under autograd, so each
    adapter has a gradient — zeros for the experts no token chose — and data-parallel ranks and FSDP2 shards sum the
    same tensors whatever their tokens chose, versus the router's frozen weight read as 'no gradients wanted' (the
    unchosen experts' adapters without one: a collective mismatch across ranks)."""
    from rlctl.models import lora
    from rlctl.rl.samples import token_logprobs

    d = {**BASE, "num_experts": 16, "num_experts_per_tok": 1, "moe_intermediate_size": 16, "num_hidden_layers": 2}
    torch.manual_seed(0)
    model = TinyGPT(TinyGPTConfig.from_hf(d))
    lora.add_adapters(model, rank=2, alpha=4.0, targets=("gate_proj", "up_proj", "down_proj"))
    x = torch.randint(0, 96, (1, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # the experts the 5 tokens chose in layer 0: fewer than 16
        h = model.model.layers[0].post_attention_layernorm(model.model.embed_tokens(x))
        chosen = set(model.model.layers[0].mlp.gate(h).argmax(-1).flatten().tolist())
    assert len(chosen) < 16
    token_logprobs(model, x).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert grads and all(g is not None for g in grads.values())
    unchosen = next(e for e in range(16) if e not in chosen)
    assert all(g.abs().sum() == 0 for n, g in grads.items() if f"layers.0.mlp.experts.{unchosen}." in n)


def test_lora_on_a_qwen2_moe_adapts_its_shared_expert_and_merges_into_the_file_transformers_reads(
    tmp_path: Path,
) -> None:
    """Adapters on gate/up/down reach the shared expert beside the routed ones (its gate, a [1, hidden] linear named
    otherwise, not); the merged weights (W + scale·B·A), exported, are the file transformers loads and computes the
    adapted model's logits from."""
    from rlctl.models import lora

    write_checkpoint("qwen2moe-dense1", tmp_path / "m")
    model = TinyGPT.from_pretrained(tmp_path / "m")
    names = lora.add_adapters(model, rank=2, alpha=4.0, targets=("gate_proj", "up_proj", "down_proj"))
    assert {f"model.layers.0.mlp.shared_expert.{p}_proj" for p in ("gate", "up", "down")} <= set(names)
    assert not any("shared_expert_gate" in n for n in names)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for lin in lora.adapters(model).values():
            lin.lora_B.copy_(0.2 * torch.randn(lin.lora_B.shape, generator=g))
    out = TinyGPT.from_pretrained(tmp_path / "m")
    out.load_weights(lora.merged_weights(model))
    out.save_pretrained(tmp_path / "out")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    x = torch.randint(0, 96, (2, 20), generator=g)
    with torch.no_grad():
        adapted, base = model(x), TinyGPT.from_pretrained(tmp_path / "m")(x)
        torch.testing.assert_close(theirs(input_ids=x).logits, adapted, atol=1e-5, rtol=0)
    assert (adapted - base).abs().max() > 1e-2  # (the adapters count)
