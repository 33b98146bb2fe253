import copy
import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch

from bench.opcount import ops_of
from rlctl.engines.base import GenRequest
from rlctl.engines.embedded import EmbeddedEngine
from rlctl.errors import ConfigError
from rlctl.models.catalog import BUILTIN_MODELS
from rlctl.models.hf import MISTRAL, QWEN2, QWEN3
from rlctl.models.hfnames import expected_shapes
from rlctl.models.tinygpt import SAFETENSORS_FILE, TORCH_FILE, TinyGPT, TinyGPTConfig, load_state_dict, param_count
from rlctl.models.weightfiles import INDEX_FILE, save_state_dict
from tests.unit.tiny_models import small_config

SMALL = small_config(layers=2, heads=4, positions=64)


@pytest.fixture
def model() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(SMALL).eval()


def test_kv_cache_decode_matches_full_forward(model: TinyGPT) -> None:
    tokens = torch.randint(3, 66, (3, 24))
    full = model(tokens)
    cache = model.new_cache(3, 40)
    prompt_lens = torch.tensor([5, 9, 1])
    model.prefill(cache, torch.arange(3), tokens[:, :9], prompt_lens)
    for _ in range(12):  # rows sit at different positions and advance together
        pos = cache.lengths.clone()
        logits = model.decode(cache, tokens[torch.arange(3), pos])
        torch.testing.assert_close(logits, full[torch.arange(3), pos], atol=1e-5, rtol=1e-4)


def test_cache_keep_moves_rows_to_the_front(model: TinyGPT) -> None:
    tokens = torch.randint(3, 66, (3, 10))
    full = model(tokens)
    cache = model.new_cache(3, 16)
    storage = cache.k[0].data_ptr()
    model.prefill(cache, torch.arange(3), tokens[:, :4], torch.tensor([4, 2, 3]))
    cache.keep(torch.tensor([2, 0]))
    assert cache.lengths[:2].tolist() == [3, 4] and cache.k[0].data_ptr() == storage  # in place
    logits = model.decode(cache, tokens[[2, 0], [3, 4]], rows=2)  # a prefix of the rows
    torch.testing.assert_close(logits, full[[2, 0], [3, 4]], atol=1e-5, rtol=1e-4)
    assert cache.lengths.tolist()[:2] == [4, 5]


def test_decode_at_a_fixed_width_equals_the_exact_width(model: TinyGPT) -> None:
    """A step at a bucketed width (what a CUDA graph replays) gives the logits of the exact width: the positions
    beyond a row's length are masked."""
    tokens = torch.randint(3, 66, (3, 12))
    exact, wide = model.new_cache(3, 32), model.new_cache(3, 32)
    for cache in (exact, wide):
        model.prefill(cache, torch.arange(3), tokens[:, :6], torch.tensor([6, 2, 4]))
    for _ in range(5):
        pos = exact.lengths.clone()
        a = model.decode(exact, tokens[torch.arange(3), pos])
        b = model.decode(wide, tokens[torch.arange(3), pos], rows=3, width=32)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert torch.equal(exact.lengths, wide.lengths)


def _decode_logits(m: TinyGPT, tokens: torch.Tensor) -> torch.Tensor:
    """Prefill 3 rows at different lengths, then 6 decode steps: every step's logits."""
    cache = m.new_cache(3, 32)
    m.prefill(cache, torch.arange(3), tokens[:, :8], torch.tensor([8, 3, 5]))
    out = []
    for _ in range(6):
        pos = cache.lengths.clone()
        out.append(m.decode(cache, tokens[torch.arange(3), pos]))
    return torch.stack(out)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_fused_projections_give_the_separate_ones_logits(arch: str, tmp_path: Path) -> None:
    """The engine's model computes q/k/v and gate/up as one matmul each: the same logits. Its parameters stay
    the same objects (views into the fused tensors), and loading a version in place, training, casting and saving
    act on them as before."""
    # Qwen2: q/k/v bias; Qwen3: per-head q/k norms between the fused projection and its rotary embedding
    archs = {"llama": SMALL.architecture, "qwen2": QWEN2, "qwen3": QWEN3}
    config = dataclasses.replace(SMALL, architecture=archs[arch])
    torch.manual_seed(0)
    separate = TinyGPT(config).eval()
    fused = copy.deepcopy(separate)
    params = dict(fused.named_parameters())
    fused.fuse_projections()
    fused.fuse_projections()  # idempotent
    assert fused.fused and not separate.fused
    assert all(p is params[name] for name, p in fused.named_parameters())
    tokens = torch.randint(3, 66, (3, 16))
    torch.testing.assert_close(_decode_logits(fused, tokens), _decode_logits(separate, tokens), atol=1e-6, rtol=1e-5)

    new = {k: v + 0.05 * torch.randn_like(v) for k, v in separate.hf_weights().items()}  # a version, in place
    for m in (separate, fused):
        m.load_weights(new)
    torch.testing.assert_close(_decode_logits(fused, tokens), _decode_logits(separate, tokens), atol=1e-6, rtol=1e-5)

    for m in (separate, fused):  # trained, a fused model takes the separate projections: every weight gets its grad
        m(tokens).pow(2).mean().backward()
    for (name, a), b in zip(separate.named_parameters(), fused.parameters(), strict=True):
        assert b.grad is not None, name
        torch.testing.assert_close(b.grad, a.grad)

    storage = fused.model.layers[0].self_attn.q_proj.weight.data_ptr()
    fused.to(torch.float32)  # changes nothing: the fused tensors stay where they are (a captured graph reads them)
    assert fused.model.layers[0].self_attn.q_proj.weight.data_ptr() == storage and not fused.fuse_projections()

    for m in (separate, fused):  # new storage for every parameter: fused again from it
        m.to(torch.float64)
    assert fused.fused
    torch.testing.assert_close(_decode_logits(fused, tokens), _decode_logits(separate, tokens))

    # what gives parameters storage of their own, then a version loaded in place: the fused tensors follow
    copied = copy.deepcopy(fused)
    assigned = copy.deepcopy(separate)
    assigned.fuse_projections()
    assigned.load_state_dict({k: v.clone() for k, v in assigned.state_dict().items()}, assign=True)
    one_layer = copy.deepcopy(separate)
    one_layer.fuse_projections()
    one_layer.model.layers[0].to(torch.float32).to(torch.float64)  # past TinyGPT's own `.to`
    assert assigned.fuse_projections() and one_layer.fuse_projections()  # stale, fused again: the storage moved
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in separate.hf_weights().items()}
    for m in (separate, copied, assigned, one_layer):
        m.load_weights(new)
    for m in (copied, assigned, one_layer):
        torch.testing.assert_close(_decode_logits(m, tokens), _decode_logits(separate, tokens))

    loaded = TinyGPT.from_pretrained(copied.save_pretrained(tmp_path / "m"))  # a tensor per name, as ever
    torch.testing.assert_close(loaded(tokens), separate.float()(tokens))


def test_a_fused_decode_step_has_four_matmuls_per_layer(model: TinyGPT) -> None:
    """What fusing saves, counted (the kernels of a decode step are what bounds it on a GPU, docs/gpu.md): 7 → 4
    matmuls per layer, and with the rotary embedding of q and k as one, ≥ 5 operators fewer per layer."""
    layers = model.config.num_hidden_layers
    tokens = torch.randint(3, 66, (3, 16))

    def step_ops(m: TinyGPT) -> dict[str, int]:
        cache = m.new_cache(3, 32)
        m.prefill(cache, torch.arange(3), tokens[:, :8], torch.tensor([8, 3, 5]))
        return ops_of(lambda: m.decode(cache, tokens[:, 8], rows=3, width=32))

    separate = step_ops(model)
    engine = EmbeddedEngine(model)  # the engine fuses its model
    assert engine.model is model and model.fused
    fused = step_ops(model)
    assert separate["mm"] + separate["addmm"] == 7 * layers + 1  # + the LM head
    assert fused["mm"] + fused["addmm"] == 4 * layers + 1
    assert sum(fused.values()) <= sum(separate.values()) - 5 * layers


def test_hf_config_keys() -> None:
    cfg = TinyGPTConfig().to_hf()
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    for key in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "max_position_embeddings",
        "intermediate_size",
        "rope_theta",
        "eos_token_id",
    ):
        assert key in cfg
    assert TinyGPTConfig.from_hf(json.loads(json.dumps(cfg))) == TinyGPTConfig()


def test_param_count_matches_catalog_entry() -> None:
    m = TinyGPT()
    n = sum(p.numel() for p in m.parameters())
    arch = BUILTIN_MODELS["tiny-demo"]
    assert n == m.config.num_params() == int(arch.params)
    assert (arch.layers, arch.hidden, arch.heads, arch.kv_heads, arch.vocab, arch.intermediate) == (
        3,
        96,
        3,
        3,
        m.config.vocab_size,
        m.config.intermediate_size,
    )
    assert "model.layers.0.self_attn.q_proj.weight" in m.state_dict()  # HF Llama weight names


def test_save_load_round_trip_safetensors(model: TinyGPT, tmp_path) -> None:
    pytest.importorskip("safetensors")
    model.save_pretrained(tmp_path)
    assert (tmp_path / SAFETENSORS_FILE).exists()
    loaded = TinyGPT.from_pretrained(tmp_path)
    tokens = torch.randint(3, 66, (2, 7))
    torch.testing.assert_close(loaded(tokens), model(tokens), atol=0, rtol=0)
    assert loaded.config == SMALL


def test_save_load_without_safetensors(model: TinyGPT, tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)  # import fails → torch.save fallback
    model.save_pretrained(tmp_path)
    assert (tmp_path / TORCH_FILE).exists() and not (tmp_path / SAFETENSORS_FILE).exists()
    sd = load_state_dict(tmp_path)
    assert all(torch.equal(sd[k], v) for k, v in model.state_dict().items())


def test_from_pretrained_rejects_other_architectures(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(
        ConfigError, match=r"config.json: architectures: .* supported: LlamaForCausalLM, Qwen2ForCausalLM"
    ):
        TinyGPT.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "cfg",
    [
        SMALL,
        TinyGPTConfig(
            architecture="Qwen2ForCausalLM",
            explicit_head_dim=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
        ),
        TinyGPTConfig(attention_bias=True, explicit_head_dim=16, eos_token_id=[2, 3]),
        TinyGPTConfig(
            architecture=QWEN3,
            explicit_head_dim=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            attention_bias=True,
        ),
        TinyGPTConfig(architecture=MISTRAL, explicit_head_dim=32, num_attention_heads=4, num_key_value_heads=2),
    ],
)
def test_expected_shapes_and_param_count_follow_the_model(cfg: TinyGPTConfig) -> None:
    m = TinyGPT(cfg)
    sd = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    if cfg.tie_word_embeddings:
        del sd["lm_head.weight"]
    assert expected_shapes(cfg) == sd
    assert cfg.num_params() == param_count(m) == cfg.arch("x").params
    assert all(torch.count_nonzero(p) == 0 for n, p in m.named_parameters() if n.endswith("bias"))  # as HF inits them


def test_sharded_save_round_trip_and_stale_files(model: TinyGPT, tmp_path) -> None:
    files = save_state_dict(model.state_dict(), tmp_path, max_shard_bytes=20_000)
    assert len(files) > 2 and (tmp_path / INDEX_FILE).exists()
    model.save_pretrained(tmp_path)  # one file now: the shards and the index are gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", SAFETENSORS_FILE]
    sd = load_state_dict(tmp_path)
    assert all(torch.equal(sd[k], v) for k, v in model.state_dict().items())


def test_demo_config_figures_and_eos_ids() -> None:
    c = TinyGPTConfig()
    assert c.arch("tiny-demo") == BUILTIN_MODELS["tiny-demo"]
    assert c.eos_token_ids == (2,) and TinyGPTConfig(eos_token_id=[4, 2]).eos_token_ids == (4, 2)
    assert TinyGPTConfig(eos_token_id=None).eos_token_ids == ()


def test_a_model_given_a_context_holds_tables_of_it_and_computes_the_same_logits(tmp_path: Path) -> None:
    """A job's context (its longest prompt + output) bounds the RoPE tables, where the checkpoint says more (Mistral
    Nemo: 1,024,000 positions, ≈ 1 GiB of tables a model): the same logits and decode steps for sequences within it,
    versus tables of every max_position_embeddings position."""
    torch.manual_seed(0)
    TinyGPT(SMALL).save_pretrained(tmp_path)
    full = TinyGPT.from_pretrained(tmp_path).eval()
    limited = TinyGPT.from_pretrained(tmp_path, context=16).eval()
    assert (full.context, limited.context) == (64, 16)
    assert full.rope_cos.shape[0] == 64
    assert limited.rope_cos.shape[0] == limited.rope_sin_signed.shape[0] == 16
    assert TinyGPT.from_pretrained(tmp_path, context=1000).rope_cos.shape[0] == 64  # never more than the model's
    tokens = torch.randint(3, 66, (3, 16))
    torch.testing.assert_close(limited(tokens), full(tokens), atol=0, rtol=0)
    torch.testing.assert_close(_decode_logits(limited, tokens), _decode_logits(full, tokens), atol=0, rtol=0)


def test_a_sequence_past_the_jobs_context_is_refused_in_one_line_naming_it(tmp_path: Path) -> None:
    """The model and the embedded engine say the job's context bounds the sequence, versus max_position_embeddings
    (which it is under) or an index error in the tables."""
    torch.manual_seed(0)
    TinyGPT(SMALL).save_pretrained(tmp_path)
    limited = TinyGPT.from_pretrained(tmp_path, context=16)
    with pytest.raises(ValueError) as e:
        limited(torch.randint(3, 66, (1, 17)))
    assert str(e.value) == "sequence of 17 tokens > the job's context (its task's longest prompt + output) 16"
    engine = EmbeddedEngine.from_pretrained(tmp_path, context=16)
    with pytest.raises(ValueError) as e:
        engine.add([GenRequest("r", [5] * 10, 7)])
    assert str(e.value) == (
        "request r: 10 prompt + 7 new tokens > the job's context (its task's longest prompt + output) 16"
    )
    engine.add([GenRequest("s", [5] * 10, 6)])  # fits: prompt + output = 16


@pytest.mark.parametrize("tied", [False, True])
def test_an_empty_model_makes_each_weight_once_in_its_dtype(tied: bool) -> None:
    """`TinyGPT.empty` (every `from_pretrained`) makes each weight in the model's dtype: a bf16 model on a GPU holds
    itself, versus an fp32 twin made first and cast (2 × the model in device memory at its start). Its RoPE tables are
    the constructor's model's (fp32, cast to the model's dtype)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    made: list[tuple[torch.dtype, int]] = []

    class Allocations(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket in (torch.ops.aten.empty, torch.ops.aten.empty_strided) and not out.is_meta:
                made.append((out.dtype, out.numel()))
            return out

    cfg = dataclasses.replace(SMALL, tie_word_embeddings=tied)
    with Allocations():
        model = TinyGPT.empty(cfg, dtype=torch.bfloat16, device="cpu")
    weights = {id(p): p.numel() for p in model.parameters()}
    assert [p.dtype for p in model.parameters()] == [torch.bfloat16] * len(weights)
    floating = [n for dtype, n in made if dtype.is_floating_point]
    assert sum(floating) <= sum(weights.values()) + model.rope_cos.numel() + model.rope_sin_signed.numel(), made
    assert {dtype for dtype, n in made if n > cfg.hidden_size} == {torch.bfloat16}
    torch.manual_seed(0)
    built = TinyGPT(cfg).to(torch.bfloat16)
    assert model.rope_cos.dtype == torch.bfloat16 and torch.equal(model.rope_cos, built.rope_cos)
    assert torch.equal(model.rope_sin_signed, built.rope_sin_signed)


@pytest.mark.parametrize(("pad", "tied"), [(0, False), (5, True), (None, False)])
def test_the_pad_tokens_embedding_row_is_zero_after_init_as_transformers_makes_it(
    pad: int | None, tied: bool, tmp_path: Path
) -> None:
    """transformers' _init_weights zeroes an nn.Embedding's padding_idx row (the pad token's: a tied lm_head's row
    with it); TinyGPT left it drawn, as every other row."""
    transformers = pytest.importorskip("transformers")
    c = dataclasses.replace(small_config(), pad_token_id=pad, tie_word_embeddings=tied)
    (tmp_path / "config.json").write_text(json.dumps(c.to_hf()))
    theirs = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(tmp_path))

    def zero_rows(m: torch.nn.Module) -> list[list[int]]:
        weights = (m.model.embed_tokens.weight, m.lm_head.weight)
        return [(w.detach() == 0).all(dim=1).nonzero().flatten().tolist() for w in weights]

    assert zero_rows(theirs) == [[] if pad is None else [pad], [pad] if tied and pad is not None else []]
    assert zero_rows(TinyGPT(c)) == zero_rows(theirs)
