"""HF Llama/Qwen2/Qwen3/Mistral/Phi3 checkpoints in the embedded model: transformers is the parity oracle (fp32,
≤ 1e-5)."""

import json
from pathlib import Path

import pytest
import torch

from rlctl.engines import EmbeddedEngine, GenRequest
from rlctl.errors import ConfigError
from rlctl.models.catalog import BUILTIN_MODELS
from rlctl.models.hf import TinyGPTConfig, read_config, read_config_json, torch_dtype
from rlctl.models.hfdir import check_hf_dir
from rlctl.models.hfnames import expected_shapes, file_shapes, match_weights
from rlctl.models.tensors import ModelTensors
from rlctl.models.tinygpt import TinyGPT, load_state_dict
from rlctl.models.weightfiles import INDEX_FILE, SAFETENSORS_FILE, safetensors_header
from rlctl.rl.samples import token_logprobs
from rlctl.rl.schedule import policy_optimizer
from tests.unit.fake_vllm import fake_vllm
from tests.unit.hf_checkpoints import (
    MOE,
    VARIANTS,
    WINDOWED,
    as_transformers_holds,
    refused_in_one_line,
    write_checkpoint,
)

transformers = pytest.importorskip("transformers")

ATOL = 1e-5


@pytest.fixture(params=[*VARIANTS, *MOE])
def variant(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def tokens(batch: int, length: int, *, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 96, (batch, length), generator=torch.Generator().manual_seed(seed))


def hf_logits(model, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model(input_ids=x).logits
    return out


def test_logits_equal_transformers(variant: str, tmp_path: Path) -> None:
    ref = write_checkpoint(variant, tmp_path)
    model = TinyGPT.from_pretrained(tmp_path).eval()
    x = tokens(3, 100)
    with torch.no_grad():
        got = model(x)
    torch.testing.assert_close(got, hf_logits(ref, x), atol=ATOL, rtol=0)


def test_trainer_gradients_equal_transformers(variant: str, tmp_path: Path) -> None:
    """The trainer's loss path (token log-probs → backward) gives transformers' gradients, tied lm_head included."""
    ref = write_checkpoint(variant, tmp_path)
    model = TinyGPT.from_pretrained(tmp_path)
    x = tokens(2, 24, seed=1)
    token_logprobs(model, x).sum().backward()
    logits = ref(input_ids=x).logits[:, :-1]
    torch.log_softmax(logits, -1).gather(-1, x[:, 1:, None]).sum().backward()
    ref_grads = dict(ref.named_parameters())
    grads = {name: p.grad for name, p in model.named_parameters()}  # tied: one parameter, under the embedding's name
    assert all(g is not None for g in grads.values())
    for name, g in as_transformers_holds(grads, model.config).items():  # (a Phi3's qkv_proj, a MoE's 3-D experts)
        assert ref_grads[name].grad is not None
        torch.testing.assert_close(g, ref_grads[name].grad, atol=ATOL, rtol=1e-4)


PAD = 4


def test_the_pad_row_gets_no_gradient_from_pad_tokens_as_in_transformers(variant: str, tmp_path: Path) -> None:
    """With pad tokens inside the sequences (their log-probs and those after them flow through their embedding),
    transformers' embedding (`padding_idx` pad_token_id) gives the pad row no gradient from them, and so does the
    trainer's model: an untied pad row is as it was after the learners' optimizer steps, a tied one moves by its
    lm_head gradient alone, as transformers'. Every other row's gradient is transformers'."""
    ref = write_checkpoint(variant, tmp_path, pad_token_id=PAD)
    model = TinyGPT.from_pretrained(tmp_path)
    assert model.config.pad_token_id == PAD
    x = tokens(2, 24, seed=1)
    x[:, 3::4] = PAD
    assert x[0, 0] != PAD
    token_logprobs(model, x).sum().backward()
    logits = ref(input_ids=x).logits[:, :-1]
    torch.log_softmax(logits, -1).gather(-1, x[:, 1:, None]).sum().backward()
    embedding = model.model.embed_tokens.weight
    got, want = embedding.grad, ref.model.embed_tokens.weight.grad
    assert got is not None and want is not None
    # (bit for bit but for a Phi3's: its fused q/k/v round apart, measured ≤ 7.7e-7 of the largest)
    assert (got - want).abs().max() <= 1e-6 * want.abs().max()
    before = embedding.detach().clone()
    policy_optimizer(model, 1e-2).step()
    if model.config.tie_word_embeddings:  # the lm_head's gradient reaches the row, in transformers too
        assert want[PAD].abs().min() > 0 and not torch.equal(embedding[PAD], before[PAD])
    else:
        assert torch.equal(want[PAD], torch.zeros_like(want[PAD])) and torch.equal(got[PAD], want[PAD])
        other = int(x[0, 0])  # (a token of the input, not the pad)
        assert torch.equal(embedding[PAD], before[PAD]) and not torch.equal(embedding[other], before[other])


def test_a_pad_token_id_outside_the_vocabulary_is_refused_in_one_line(tmp_path: Path) -> None:
    """transformers' model of such a config is not built (its padding_idx is no row of the embedding); nor is rlctl's,
    in one line, where Phi3Config's default 32000 is the id of a config without one too."""
    write_checkpoint("llama-hd64-eos3", tmp_path, pad_token_id=95)
    cfg = json.loads((tmp_path / "config.json").read_text())
    with pytest.raises(AssertionError, match="Padding_idx"):
        transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**cfg, "pad_token_id": 96}))
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "pad_token_id": 96}))
    refused_in_one_line(tmp_path, "pad_token_id", "96 is not a row of the embedding (vocab_size 96); give an id below")
    phi3 = {**cfg, "architectures": ["Phi3ForCausalLM"], "model_type": "phi3"}
    del phi3["pad_token_id"]
    (tmp_path / "config.json").write_text(json.dumps(phi3))
    refused_in_one_line(tmp_path, "pad_token_id", "32000 (Phi3Config's default where it has none) is not a row")


def test_prefill_then_decode_equals_full_forward(variant: str, tmp_path: Path) -> None:
    write_checkpoint(variant, tmp_path)
    model = TinyGPT.from_pretrained(tmp_path).eval()
    x = tokens(3, 40, seed=2)
    with torch.no_grad():
        full = model(x)
    cache = model.new_cache(3, 48)
    model.prefill(cache, torch.arange(3), x[:, :17], torch.tensor([5, 17, 1]))
    for _ in range(20):  # rows at different positions advance together
        pos = cache.lengths.clone()
        logits = model.decode(cache, x[torch.arange(3), pos])  # another summation order: ~20 ulp at |logit| ≈ 7
        torch.testing.assert_close(logits, full[torch.arange(3), pos], atol=ATOL, rtol=1e-5)


def test_engine_greedy_equals_transformers_generate(variant: str, tmp_path: Path) -> None:
    ref = write_checkpoint(variant, tmp_path)
    engine = EmbeddedEngine.from_pretrained(tmp_path, max_batch_size=3, temperature=0.0)
    prompts = [[1, 40, 41, 42], [1, 7], [1, 90, 12, 13, 14, 15, 16], [1, 60, 61]]
    engine.add([GenRequest(f"p{i}", p, 16) for i, p in enumerate(prompts)])
    got = {r.request_id: r.output_tokens for r in engine.run_until_done()}
    for i, p in enumerate(prompts):
        out = ref.generate(torch.tensor([p]), max_new_tokens=16, do_sample=False, pad_token_id=0)
        assert got[f"p{i}"] == out[0, len(p) :].tolist(), f"prompt {i}"


def test_a_row_ends_on_any_of_several_eos_ids(tmp_path: Path) -> None:
    write_checkpoint("llama-hd64-eos3", tmp_path)
    model = TinyGPT.from_pretrained(tmp_path)
    assert model.config.eos_token_ids == (2, 5, 7)
    free = EmbeddedEngine(model, temperature=0.0)
    free.add([GenRequest("a", [1, 40, 41], 12, ignore_eos=True)])
    (run,) = free.run_until_done()
    stop = run.output_tokens[4]
    others = [t for t in range(96) if t not in run.output_tokens[:5]][:2]
    model.config.eos_token_id = [*others, stop]  # the row's 5th token is the last of three EOS ids
    engine = EmbeddedEngine(model, temperature=0.0)
    engine.add([GenRequest("a", [1, 40, 41], 12)])
    (res,) = engine.run_until_done()
    assert (res.output_tokens, res.finish_reason) == (run.output_tokens[: run.output_tokens.index(stop) + 1], "eos")
    model.config.eos_token_id = others
    given = EmbeddedEngine(model, temperature=0.0, eos_token_ids=[stop])  # e.g. the tokenizer's EOS ids
    given.add([GenRequest("a", [1, 40, 41], 12)])
    assert given.run_until_done()[0].output_tokens == res.output_tokens


def test_sharded_checkpoint_loads(tmp_path: Path) -> None:
    ref = write_checkpoint("llama-hd64-eos3", tmp_path, max_shard_size="40KB")
    assert (tmp_path / INDEX_FILE).exists() and not (tmp_path / SAFETENSORS_FILE).exists()
    info = check_hf_dir(tmp_path)
    assert len(info.weight_files) > 3
    x = tokens(2, 30)
    with torch.no_grad():
        torch.testing.assert_close(TinyGPT.from_pretrained(tmp_path)(x), hf_logits(ref, x), atol=ATOL, rtol=0)


@pytest.mark.parametrize("max_shard_bytes", [None, 50_000])
def test_load_save_load_is_bit_exact_and_transformers_reads_it(
    variant: str, tmp_path: Path, max_shard_bytes: int | None
) -> None:
    ref = write_checkpoint(variant, tmp_path / "src")
    first = TinyGPT.from_pretrained(tmp_path / "src")
    first.save_pretrained(tmp_path / "out", max_shard_bytes=max_shard_bytes, tokenizer_from=tmp_path / "src")
    assert ((tmp_path / "out" / INDEX_FILE).exists()) == (max_shard_bytes is not None)
    assert (tmp_path / "out" / "tokenizer.json").read_text() == (tmp_path / "src" / "tokenizer.json").read_text()
    again = TinyGPT.from_pretrained(tmp_path / "out")
    assert again.config == first.config
    a, b = first.state_dict(), again.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    reread = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    x = tokens(2, 50)
    torch.testing.assert_close(hf_logits(reread, x), hf_logits(ref, x), atol=0, rtol=0)


def test_bf16_checkpoint_loads_into_fp32(tmp_path: Path) -> None:
    write_checkpoint("qwen2-tied-hd32", tmp_path, dtype=torch.bfloat16)
    model = TinyGPT.from_pretrained(tmp_path)
    assert model.config.torch_dtype == "bfloat16" and check_hf_dir(tmp_path).arch.bytes_per_param == 2
    assert all(p.dtype == torch.float32 for p in model.parameters())
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    x = tokens(2, 30)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf_logits(ref, x), atol=ATOL, rtol=0)
    model.save_pretrained(tmp_path / "fp32")  # the fp32 copy holds the same (bf16-representable) values
    assert json.loads((tmp_path / "fp32" / "config.json").read_text())["torch_dtype"] == "float32"
    assert all(
        torch.equal(p, q)
        for p, q in zip(model.parameters(), TinyGPT.from_pretrained(tmp_path / "fp32").parameters(), strict=True)
    )


def _whole_then_filled(directory: Path, dtype: torch.dtype | None, context: int) -> TinyGPT:
    """The load `from_pretrained` did before it read one tensor at a time: a state dict of the whole checkpoint (in
    fp32), then the model filled from it by torch's `load_state_dict`."""
    config = read_config(directory)
    sd = load_state_dict(directory)
    names = match_weights({k: tuple(v.shape) for k, v in sd.items()}, config, where=str(directory))
    model = TinyGPT.empty(config, dtype=dtype or torch_dtype(config), device="cpu", context=context)
    model.load_state_dict(dict(ModelTensors({k: sd[k] for k in names}, config)), strict=False)
    return model


@pytest.mark.parametrize("variant", [*VARIANTS, *WINDOWED, *MOE])
@pytest.mark.parametrize(
    ("saved", "loaded"),
    [(torch.float32, torch.float32), (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32),
     (torch.bfloat16, None), (torch.float16, torch.bfloat16)],
)  # fmt: skip
def test_a_load_one_tensor_at_a_time_is_the_whole_state_dicts_bit_for_bit(
    tmp_path: Path, variant: str, saved: torch.dtype, loaded: torch.dtype | None
) -> None:
    """`from_pretrained` reads each tensor as it fills its parameter: every weight (a Phi3's fused q/k/v and gate/up
    split, a tied lm_head one tensor with the embedding) and RoPE table as the load of the whole state dict gave it,
    bit for bit, the checkpoint's dtype cast to the model's (None: the checkpoint's own)."""
    write_checkpoint(variant, tmp_path, dtype=saved)
    model = TinyGPT.from_pretrained(tmp_path, dtype=loaded, context=16)
    want = _whole_then_filled(tmp_path, loaded, 16)
    assert all(p.dtype == (loaded or saved) for p in model.parameters())
    a, b = model.state_dict(), want.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in b)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == model.config.tie_word_embeddings
    for table in ("rope_cos", "rope_sin_signed"):
        got, wanted = getattr(model, table), getattr(want, table)
        assert got.shape[0] == 16 and got.dtype == wanted.dtype and torch.equal(got, wanted)


def test_check_hf_dir_gives_the_planner_figures(variant: str, tmp_path: Path) -> None:
    ref = write_checkpoint(variant, tmp_path)
    info = check_hf_dir(tmp_path, name="tiny")
    c, a = ref.config, info.arch
    head_dim = getattr(c, "head_dim", c.hidden_size // c.num_attention_heads)  # (Phi3Config's where it has none)
    assert (a.name, a.layers, a.hidden, a.heads, a.kv_heads, a.vocab, a.intermediate) == (
        "tiny",
        c.num_hidden_layers,
        c.hidden_size,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.vocab_size,
        c.intermediate_size,
    )
    assert a.params == sum(p.numel() for p in ref.parameters())  # tied embeddings counted once, biases in
    assert (
        a.head_dim == head_dim
        and a.kv_bytes_per_token == 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * 4
    )
    assert info.weight_files == [tmp_path / SAFETENSORS_FILE] and "tokenizer.json" in info.tokenizer_files
    # the tensors transformers writes (a MoE's experts one by one, where its model holds them as one 3-D tensor)
    header = safetensors_header(tmp_path / SAFETENSORS_FILE)
    assert dict(file_shapes(info.config)) == {k: shape for k, (_, shape) in header.items()}


@pytest.mark.parametrize(
    ("key", "value", "complaint"),
    [
        ("architectures", ["Gemma2ForCausalLM"], "supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "),
        ("rope_scaling", {"rope_type": "dynamic", "factor": 8.0}, "supported: default RoPE"),
        ("rope_parameters", {"rope_type": "longrope", "rope_theta": 1e6, "factor": 4.0}, "supported: default RoPE"),
        ("use_sliding_window", True, "supported: false"),
        ("hidden_act", "gelu", "supported: silu"),
        ("mlp_bias", True, "supported: false"),
        ("model_type", "mistral", "does not match"),
        ("torch_dtype", "float8_e4m3fn", "supported: float32, bfloat16, float16"),
        ("num_key_value_heads", 3, "does not divide"),
        # values of the wrong type: a TypeError with a traceback, before
        ("architectures", [["Qwen2ForCausalLM"]], "is not supported"),
        ("rope_scaling", 5, "is not a mapping"),
        ("layer_types", 5, "is not a list"),
        ("torch_dtype", ["float32"], "supported: float32"),
    ],
)
def test_unsupported_configs_are_refused_in_one_line(tmp_path: Path, key: str, value: object, complaint: str) -> None:
    write_checkpoint("llama-hd64-eos3", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.pop("dtype", None)  # so that torch_dtype is the key read
    cfg[key] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    refused_in_one_line(tmp_path, key, complaint)


def test_a_qwen3_config_without_head_dim_reads_it_as_transformers_does() -> None:
    """Qwen3Config's head_dim defaults to 128, not hidden / heads (64 here): the weights' shapes follow it."""
    d = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16,
         "num_key_value_heads": 8, "intermediate_size": 3072, "num_hidden_layers": 2, "vocab_size": 96}  # fmt: skip
    c = TinyGPTConfig.from_hf(d)
    assert c.head_dim == transformers.Qwen3Config(**d).head_dim == 128
    assert expected_shapes(c)["model.layers.0.self_attn.q_proj.weight"] == (16 * 128, 1024)
    assert expected_shapes(c)["model.layers.0.self_attn.k_norm.weight"] == (128,)


ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
                 "MistralForCausalLM": "mistral", "Phi3ForCausalLM": "phi3",
                 "Qwen2MoeForCausalLM": "qwen2_moe"}  # fmt: skip
DEFAULTED = [
    "num_key_value_heads", "bos_token_id", "eos_token_id", "pad_token_id", "max_position_embeddings", "rms_norm_eps",
    "rope_theta", "initializer_range", "tie_word_embeddings", "attention_bias", "head_dim", "sliding_window",
]  # fmt: skip


@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
@pytest.mark.parametrize("key", DEFAULTED)
def test_a_key_config_json_leaves_out_reads_as_its_config_class_reads_it(architecture: str, key: str) -> None:
    """Each key `_parse_config` gives a default where config.json has none reads as transformers' config class for the
    architecture reads it (vLLM reads it so too): MistralConfig's 8 K/V heads, Qwen's 32, LlamaConfig's and
    MistralConfig's BOS 1 and EOS 2, versus num_attention_heads and no ids for every architecture."""
    # (a vocabulary of Phi-3's 32064: Phi3Config's default pad_token_id 32000 is a row of it)
    d = {"architectures": [architecture], "model_type": ARCHITECTURES[architecture], "hidden_size": 1024,
         "num_attention_heads": 64, "intermediate_size": 96, "num_hidden_layers": 2, "vocab_size": 32064}  # fmt: skip
    theirs = transformers.CONFIG_MAPPING[ARCHITECTURES[architecture]].from_dict(d)
    ours = TinyGPTConfig.from_hf(d)
    if key == "rope_theta":
        want = theirs.rope_parameters["rope_theta"]
    elif key == "attention_bias":  # (Qwen2's and Mistral's have no such key: never a bias on o)
        want = getattr(theirs, key, False)
    elif key == "sliding_window" and architecture == "Qwen2MoeForCausalLM":  # (its 0 without use_sliding_window)
        assert theirs.sliding_window == 0 and not theirs.use_sliding_window
        want = None  # no window either way, as Qwen2's
    else:
        want = getattr(theirs, key, ours.head_dim if key == "head_dim" else None)
    assert getattr(ours, key) == want


def test_both_engines_stop_at_the_eos_llamaconfig_reads_where_config_json_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded engine's EOS ids are its config's, vLLM's (where the job names none) config.json's: both 2."""
    from rlctl.engines.vllm import VllmEngine

    write_checkpoint("llama-hd64-eos3", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["eos_token_id"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    embedded = EmbeddedEngine(TinyGPT.from_pretrained(tmp_path), max_batch_size=1)
    fake_vllm(monkeypatch)  # (the vLLM engine's reading of config.json is under test, not vLLM)
    vllm = VllmEngine(tmp_path, max_batch_size=1, weights_via_file=False, weight_transfer=False)
    assert vllm.eos_ids == tuple(embedded.eos_ids) == (transformers.LlamaConfig().eos_token_id,)


@pytest.mark.parametrize(("architecture", "kv_heads"), [("Qwen2ForCausalLM", 32), ("MistralForCausalLM", 8)])
def test_a_default_number_of_kv_heads_that_does_not_divide_the_heads_is_refused_naming_it(
    tmp_path: Path, architecture: str, kv_heads: int
) -> None:
    """Qwen2.5-0.5B's 14 heads and no num_key_value_heads key: Qwen2Config's 32, which no model of 14 heads has."""
    d = {"architectures": [architecture], "model_type": ARCHITECTURES[architecture], "hidden_size": 896,
         "num_attention_heads": 14, "intermediate_size": 96, "num_hidden_layers": 2, "vocab_size": 96}  # fmt: skip
    cls = architecture.removesuffix("ForCausalLM")
    with pytest.raises(ConfigError) as e:
        TinyGPTConfig.from_hf(d, file=str(tmp_path / "config.json"))
    assert str(e.value) == (
        f"{tmp_path / 'config.json'}: num_key_value_heads: {kv_heads} ({cls}Config's default where config.json has "
        "none) does not divide num_attention_heads 14"
    )


@pytest.mark.parametrize("variant", ["mistral-v01-window16", "phi3-mini-window16"])
def test_a_window_that_binds_equals_transformers_within_it(tmp_path: Path, variant: str) -> None:
    """Mistral v0.1's sliding window (4096 of 32768 positions; 16 of 64 here) binds, and Phi-3-mini-4k's (2047 of 4096)
    as well: MistralModel (Phi3Model) attends to a position's last 16 tokens only. On a sequence of at most 16 tokens it
    cuts nothing off (transformers' logits with and without it are the same, and differ at 17), so a model built for
    16 tokens computes transformers' logits."""
    ref = write_checkpoint(variant, tmp_path)
    config = check_hf_dir(tmp_path).config
    assert (config.sliding_window, config.binding_window, config.max_position_embeddings) == (16, 16, 64)
    model = TinyGPT.from_pretrained(tmp_path, context=16).eval()
    x = tokens(3, 17)
    windowless = type(ref.config)(**{**ref.config.to_dict(), "sliding_window": None})
    full = type(ref)(windowless).eval()
    full.load_state_dict(ref.state_dict())
    torch.testing.assert_close(hf_logits(full, x[:, :16]), hf_logits(ref, x[:, :16]), atol=0, rtol=0)
    assert not torch.allclose(hf_logits(full, x)[:, 16], hf_logits(ref, x)[:, 16], atol=1e-3)  # 17 tokens: it cuts
    with torch.no_grad():
        got = model(x[:, :16])
    torch.testing.assert_close(got, hf_logits(ref, x[:, :16]), atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("variant", "model"), [("mistral-v01-window16", "MistralModel"), ("phi3-mini-window16", "Phi3Model")]
)
@pytest.mark.parametrize("context", [None, 17, 1000])
def test_a_model_for_more_tokens_than_a_binding_window_is_refused_in_one_line(
    tmp_path: Path, context: int | None, variant: str, model: str
) -> None:
    """The runtime's own refusal (the engines, the trainer and the held-out evaluation build their models for the
    job's context, None: max_position_embeddings, behind `rlctl check`'s): one line naming config.json and
    sliding_window, before the weights are read; a model of the config made in memory refuses it as well."""
    write_checkpoint(variant, tmp_path)
    held = 64 if context is None else min(context, 64)
    with pytest.raises(ConfigError) as e:
        TinyGPT.from_pretrained(tmp_path, context=context)
    assert str(e.value) == (
        f"{tmp_path / 'config.json'}: sliding_window: 16 binds (below max_position_embeddings 64: {model} attends "
        f"to a position's last 16 tokens only, rlctl's models to all before it), and the model is asked to hold "
        f"sequences of {held} tokens; hold the job's context (its longest prompt + max_output_tokens) to ≤ 16"
    )
    config = check_hf_dir(tmp_path).config  # (`rlctl check` reads the config: the job's context is judged there)
    with pytest.raises(ValueError, match=rf"^sliding_window 16 binds .* sequences of {held} tokens; hold"):
        TinyGPT.empty(config, dtype=torch.float32, device="cpu", context=context)
    with pytest.raises(ValueError, match=r"^sliding_window 16 binds .* sequences of 64 tokens; hold"):
        TinyGPT(config)


def test_a_mistral_config_without_sliding_window_has_mistralconfigs_4096(tmp_path: Path) -> None:
    """Absent, the window is MistralConfig's 4096 (v0.1's), which binds below 8192 positions."""
    write_checkpoint("mistral-window-unbinding", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["sliding_window"]
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 8192}))
    config = check_hf_dir(tmp_path).config
    assert config.sliding_window == transformers.MistralConfig().sliding_window == config.binding_window == 4096
    refused_in_one_line_at(tmp_path, context=4097)
    assert TinyGPT.from_pretrained(tmp_path, context=4096).context == 4096


def refused_in_one_line_at(directory: Path, *, context: int) -> None:
    with pytest.raises(ConfigError) as e:
        TinyGPT.from_pretrained(directory, context=context)
    assert str(e.value).startswith(f"{directory / 'config.json'}: sliding_window: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("window", [0, -1, "4096", 4096.0, True])
def test_a_mistral_sliding_window_that_is_not_a_positive_integer_is_refused(tmp_path: Path, window: object) -> None:
    write_checkpoint("mistral-window-unbinding", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "sliding_window": window}))
    refused_in_one_line(tmp_path, "sliding_window", "is not null or a positive integer")


@pytest.mark.parametrize(("variant", "window"), [("mistral-window-unbinding", None), ("mistral-v01-window16", 16)])
def test_a_mistral_export_keeps_its_sliding_window(tmp_path: Path, variant: str, window: int | None) -> None:
    """An export writes the window as transformers read it (absent: MistralConfig's 4096; v0.1's 4096 of 32768 kept,
    not made null, which would let a longer sequence attend past it), and transformers reads the export with the same
    logits."""
    ref = write_checkpoint(variant, tmp_path / "src")
    cfg = json.loads((tmp_path / "src" / "config.json").read_text())
    if window is None:
        del cfg["sliding_window"]  # MistralConfig's 4096 ≥ 128 positions
    (tmp_path / "src" / "config.json").write_text(json.dumps(cfg))
    length = ref.config.max_position_embeddings if window is None else window
    TinyGPT.from_pretrained(tmp_path / "src", context=length).save_pretrained(tmp_path / "out")
    out = json.loads((tmp_path / "out" / "config.json").read_text())
    want = 4096 if window is None else window
    assert (out["architectures"], out["model_type"], out["sliding_window"]) == (["MistralForCausalLM"], "mistral", want)
    assert "attention_bias" not in out and check_hf_dir(tmp_path / "out").arch.params == ref.num_parameters()
    reread = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(reread) is transformers.MistralForCausalLM and reread.config.sliding_window == want
    x = tokens(2, min(length, 120))
    torch.testing.assert_close(hf_logits(reread, x), hf_logits(ref, x), atol=0, rtol=0)


@pytest.mark.parametrize("variant", ["phi3-gqa", "phi3-tied-window-unbinding", "phi3-mini-window16"])
def test_a_phi3_export_is_the_file_transformers_writes(tmp_path: Path, variant: str) -> None:
    """The model holds a Phi3's q/k/v and gate/up apart (Llama's names, which the trainers and the weight plane use);
    its export fuses them back: the tensors transformers' save_pretrained writes, by name, shape and value, and a
    config.json Phi3Config reads as the checkpoint's own (its window kept, no attention_bias key)."""
    ref = write_checkpoint(variant, tmp_path / "src")
    model = TinyGPT.from_pretrained(tmp_path / "src", context=16)
    assert "model.layers.0.self_attn.q_proj.weight" in model.state_dict()
    assert "model.layers.0.self_attn.qkv_proj.weight" not in model.state_dict()
    model.save_pretrained(tmp_path / "out")
    want, got = load_state_dict(tmp_path / "src"), load_state_dict(tmp_path / "out")
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
    out = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (out["architectures"], out["model_type"]) == (["Phi3ForCausalLM"], "phi3") and "attention_bias" not in out
    theirs = transformers.AutoConfig.from_pretrained(tmp_path / "out").to_dict()
    own = ref.config.to_dict()
    # (longrope's pretraining context: Phi3Config's 4096 where it is given none, as read; no longrope here)
    keys = ["sliding_window", "rope_parameters", "resid_pdrop", "embd_pdrop", "attention_dropout", "rms_norm_eps",
            "bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings", "num_key_value_heads",
            "max_position_embeddings", "original_max_position_embeddings"]  # fmt: skip
    assert {k: theirs[k] for k in keys} == {k: own[k] for k in keys}
    reread = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    x = tokens(2, 16)
    torch.testing.assert_close(hf_logits(reread, x), hf_logits(ref, x), atol=0, rtol=0)


def test_a_phi3_export_writes_back_the_keys_rlctl_does_not_compute_with_as_read(tmp_path: Path) -> None:
    """A Phi3's dropout (rlctl trains without it) and longrope's pretraining context (no longrope here) are written
    back as its config.json said them, versus 0.0 and max_position_embeddings whatever it said; transformers reads
    the export as the checkpoint's own."""
    write_checkpoint("phi3-gqa", tmp_path / "src")
    said = {"resid_pdrop": 0.1, "embd_pdrop": 0.05, "attention_dropout": 0.2, "original_max_position_embeddings": 64}
    theirs = transformers.Phi3Config.from_pretrained(tmp_path / "src")
    for key, value in said.items():
        setattr(theirs, key, value)
    theirs.save_pretrained(tmp_path / "src")  # (a config.json transformers writes)
    TinyGPT.from_pretrained(tmp_path / "src").save_pretrained(tmp_path / "out")
    out = json.loads((tmp_path / "out" / "config.json").read_text())
    assert {k: out[k] for k in said} == said
    reread = transformers.AutoConfig.from_pretrained(tmp_path / "out")
    assert {k: getattr(reread, k) for k in said} == said
    assert TinyGPT.from_pretrained(tmp_path / "out").config == TinyGPT.from_pretrained(tmp_path / "src").config
    own = TinyGPTConfig(architecture="Phi3ForCausalLM")  # rlctl's own: its context, no dropout, read back equal
    assert TinyGPTConfig.from_hf(own.to_hf()) == own and own.to_hf()["original_max_position_embeddings"] == 320
    cfg = json.loads((tmp_path / "src" / "config.json").read_text())
    for key, value, complaint in (
        ("resid_pdrop", 1.5, "1.5 is not a dropout probability (a number from 0 to 1)"),
        ("original_max_position_embeddings", "4096", "'4096' is not a positive integer"),
    ):
        (tmp_path / "src" / "config.json").write_text(json.dumps({**cfg, key: value}))
        refused_in_one_line(tmp_path / "src", key, complaint)


def test_a_phi3_config_reads_as_phi3config_where_a_key_is_left_out() -> None:
    """Phi-4's config.json as published (`rope_scaling` null, dropout 0, original_max_position_embeddings) is read; a
    Phi3 config leaving sliding_window out has no window (Phi3Config's none, where MistralConfig's is 4096)."""
    phi4 = {"architectures": ["Phi3ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 100257, "embd_pdrop": 0.0,
            "eos_token_id": 100265, "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
            "intermediate_size": 17920, "max_position_embeddings": 16384, "model_type": "phi3",
            "num_attention_heads": 40, "num_hidden_layers": 40, "num_key_value_heads": 10,
            "original_max_position_embeddings": 16384, "pad_token_id": 100349, "resid_pdrop": 0.0,
            "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 250000, "sliding_window": None,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
            "vocab_size": 100352}  # fmt: skip
    c = TinyGPTConfig.from_hf(phi4)
    assert (c.architecture, c.head_dim, c.rope_theta, c.sliding_window, c.eos_token_ids) == (
        "Phi3ForCausalLM",
        128,
        250000.0,
        None,
        (100265,),
    )
    with torch.device("meta"):  # the architecture's own count of Phi-4's parameters, the built-in phi4-14b's
        own = sum(p.numel() for p in transformers.Phi3ForCausalLM(transformers.Phi3Config(**phi4)).parameters())
    assert c.num_params() == own == 14_659_507_200 == pytest.approx(BUILTIN_MODELS["phi4-14b"].params, rel=2e-3)
    mini = {k: v for k, v in phi4.items() if k != "sliding_window"} | {"max_position_embeddings": 8192}
    assert TinyGPTConfig.from_hf(mini).binding_window is None


@pytest.mark.parametrize(
    ("key", "value", "complaint"),
    [
        ("partial_rotary_factor", 0, "0 is not a fraction of a head's dimensions (a number above 0, at most 1)"),
        ("head_dim", {"type": "longrope", "short_factor": [1.0] * 16, "long_factor": [1.0] * 16},
         "32 is not hidden_size / num_attention_heads 16: transformers checks RoPE 'longrope''s factors"),
        ("rope_scaling", {"type": "dynamic", "factor": 2.0}, "RoPE 'dynamic' is not"),
        ("rope_scaling", {"rope_type": "linear", "factor": 2.0},
         "RoPE 'linear' is not supported; supported for Phi3: default RoPE (rope_theta) and 'longrope' scaling"),
    ],
)  # fmt: skip
def test_what_a_phi3_computes_otherwise_is_refused_in_one_line(
    tmp_path: Path, key: str, value: object, complaint: str
) -> None:
    """The RoPE a Phi3 may have said as a Phi3's (default and longrope, on a fraction of each head: the test_models_
    longrope.py cases), versus Llama's list ('linear' and 'llama3', refused); longrope where Phi3Config would not load
    it (this checkpoint's head_dim 32 of hidden 64 and 4 heads)."""
    write_checkpoint("phi3-gqa", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    if key in ("rope_scaling", "head_dim", "partial_rotary_factor"):  # (rope_parameters' 1.0 is read over the top)
        cfg.pop("rope_parameters")
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "rope_scaling" if key == "head_dim" else key: value}))
    refused_in_one_line(tmp_path, key, complaint)


def test_weights_that_do_not_match_the_config_are_refused(tmp_path: Path) -> None:
    write_checkpoint("qwen2-tied-hd32", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 128}))
    with pytest.raises(
        ConfigError, match=r"mlp.gate_proj.weight has shape \[96, 64\]; config.json implies \[128, 64\]"
    ):
        check_hf_dir(tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps({**cfg, "architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    )
    with pytest.raises(ConfigError, match=r"self_attn\.[qkv]_proj\.bias is not part of a LlamaForCausalLM"):
        TinyGPT.from_pretrained(tmp_path)
    (tmp_path / SAFETENSORS_FILE).unlink()
    with pytest.raises(ConfigError, match="no weights"):
        check_hf_dir(tmp_path)


def test_a_directory_that_cannot_be_read_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`check_hf_dir` (check, plan, launch) and `rlctl profile --model DIR` on a path this user may not read (faked:
    the tests run as root)."""
    from rlctl.errors import UsageError
    from rlctl.profiler.build import request_from_options

    real = Path.is_dir

    def denied(self: Path) -> bool:
        if self == tmp_path / "locked":
            raise PermissionError(13, "Permission denied")
        return real(self)

    monkeypatch.setattr(Path, "is_dir", denied)
    with pytest.raises(ConfigError, match=r"locked: cannot read: Permission denied$"):
        check_hf_dir(tmp_path / "locked")
    with pytest.raises(UsageError, match=r"--model .*locked: cannot read: Permission denied$"):
        request_from_options([], model=str(tmp_path / "locked"), algorithm="grpo", sites=None, engines=None)


def test_a_config_json_that_is_not_utf8_is_refused_in_one_line(tmp_path: Path) -> None:
    write_checkpoint("llama-hd64-eos3", tmp_path)
    (tmp_path / "config.json").write_bytes(b'{"architectures": ["\xff\xfe"]}')
    with pytest.raises(ConfigError, match=r"config.json: not UTF-8 text \(byte 0xff at line 1, column 21\); save it"):
        check_hf_dir(tmp_path)
    # its line and column, as an editor counts them (before: 'at byte 27' alone)
    (tmp_path / "config.json").write_bytes(b'{\n  "name": "\xc3\xa9",\n  "\xc3\xa9": "\xff"}')
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 0xff at line 3, column 9\)"):
        check_hf_dir(tmp_path)


def test_a_truncated_or_padded_safetensors_file_is_refused_in_one_line(tmp_path: Path) -> None:
    """The header's data offsets against the file's size: a truncated copy passed `check` before, and
    safetensors refused it in the trainer with a traceback."""
    write_checkpoint("qwen2-tied-hd32", tmp_path)
    f = tmp_path / SAFETENSORS_FILE
    whole = f.read_bytes()
    f.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ConfigError) as e:
        check_hf_dir(tmp_path)
    msg = str(e.value)
    assert msg.startswith(f"{f}: truncated: its header declares ") and "\n" not in msg
    f.write_bytes(whole + b"\0" * 8)
    with pytest.raises(ConfigError, match=r"not a whole safetensors file: .* the file holds \d+; copy"):
        check_hf_dir(tmp_path)
    f.write_bytes(whole)
    check_hf_dir(tmp_path)


def test_a_pytorch_model_bin_is_checked_as_a_safetensors_file_is(tmp_path: Path) -> None:
    """A checkpoint saved as pytorch_model.bin was not read by `check`: a truncated copy passed, and the trainer then
    died on torch's traceback. Its tensors are mapped (not read) and matched against config.json."""
    from safetensors.torch import load_file

    from rlctl.models.weightfiles import TORCH_FILE

    write_checkpoint("qwen2-tied-hd32", tmp_path)
    sd = load_file(tmp_path / SAFETENSORS_FILE)
    (tmp_path / SAFETENSORS_FILE).unlink()
    torch.save(sd, tmp_path / TORCH_FILE)
    assert check_hf_dir(tmp_path).weight_files == [tmp_path / TORCH_FILE]
    whole = (tmp_path / TORCH_FILE).read_bytes()
    (tmp_path / TORCH_FILE).write_bytes(whole[: len(whole) // 2])  # a copy cut short
    with pytest.raises(ConfigError, match=r"pytorch_model.bin: cannot read it as a PyTorch state dict \("):
        check_hf_dir(tmp_path)
    torch.save({k: v for k, v in sd.items() if "layers.0." not in k}, tmp_path / TORCH_FILE)  # a layer short
    with pytest.raises(ConfigError, match=r"layers\.0\."):
        check_hf_dir(tmp_path)


@pytest.mark.parametrize(
    "name",
    ["qwen2-tied-hd32", "llama-hd64-eos3", "qwen3-tied-hd32", "mistral-hd32-nowindow", "phi3-gqa",
     "qwen3moe-dense1-hd32", "qwen2moe-dense1"],
)  # fmt: skip
def test_a_config_without_architectures_is_read_by_its_model_type(tmp_path: Path, name: str) -> None:
    """config.json with no `architectures` (a Qwen2Config() saved as it is): refused as 'None is not supported',
    though its model_type names the architecture as transformers' AutoModelForCausalLM reads it."""
    write_checkpoint(name, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    arch = cfg.pop("architectures")[0]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert check_hf_dir(tmp_path).config.architecture == arch
    assert TinyGPT.from_pretrained(tmp_path).config.architecture == arch


def test_a_config_without_architectures_or_a_known_model_type_says_what_to_add(tmp_path: Path) -> None:
    write_checkpoint("qwen2-tied-hd32", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["architectures"], cfg["model_type"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as e:
        check_hf_dir(tmp_path)
    assert str(e.value) == (
        f"{tmp_path / 'config.json'}: architectures: missing, and no model_type that names one; add "
        '"architectures": ["LlamaForCausalLM"], ["Qwen2ForCausalLM"], ["Qwen3ForCausalLM"], ["MistralForCausalLM"], '
        '["Phi3ForCausalLM"], ["Qwen3MoeForCausalLM"] or ["Qwen2MoeForCausalLM"], as the checkpoint\'s model is'
    )


def test_vllm_is_told_the_architecture_a_config_without_one_has(tmp_path: Path) -> None:
    """vLLM maps a config.json without `architectures` to its model_type's base model (qwen2: Qwen2Model, a pooling
    model there): the rollout engine names the ForCausalLM class rlctl read it as."""
    from rlctl.engines.vllm import architecture_overrides

    write_checkpoint("qwen2-tied-hd32", tmp_path)
    assert architecture_overrides(read_config_json(tmp_path), read_config(tmp_path)) == {}
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["architectures"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    overrides = architecture_overrides(read_config_json(tmp_path), read_config(tmp_path))
    assert overrides == {"hf_overrides": {"architectures": ["Qwen2ForCausalLM"]}}


def test_vllm_s_cpu_kv_cache_is_sized_for_the_head_dim_the_config_reads_as(tmp_path: Path) -> None:
    """A Qwen3 config.json without head_dim has heads of 128 (Qwen3Config's default), not hidden / heads (16 here):
    vLLM's CPU K/V space is sized for those, versus 8 times too small."""
    from rlctl.engines.vllm import cpu_kv_cache_gib

    write_checkpoint("qwen3-tied-hd32", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["head_dim"]
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 1 << 20}))
    # 2 (K, V) × 2 layers × 2 kv heads × 128 × 4 bytes a position, 2^20 positions, 64 rows, +25 %
    assert cpu_kv_cache_gib(read_config(tmp_path), 64) == 320


def test_vllm_s_model_len_and_cpu_kv_cache_follow_the_jobs_context(tmp_path: Path) -> None:
    """vLLM is given the job's context (its longest prompt + output) as max_model_len where the checkpoint allows
    more, and the CPU K/V space holds max_batch_size rows of that, versus the checkpoint's every position (Llama
    3.2 1B: ≈ 640 GiB asked of VLLM_CPU_KVCACHE_SPACE)."""
    from rlctl.engines.vllm import cpu_kv_cache_gib, max_model_len

    write_checkpoint("qwen3-tied-hd32", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "head_dim": 128, "max_position_embeddings": 1 << 20}))
    c = read_config(tmp_path)
    assert max_model_len(c, 65536) == 65536
    assert max_model_len(c, 1 << 21) == max_model_len(c) == 1 << 20  # never more than the model's
    # 2 (K, V) × 2 layers × 2 kv heads × 128 × 4 bytes a position, 2^16 positions, 64 rows, +25 %
    assert cpu_kv_cache_gib(c, 64, context=65536) == 20
    assert cpu_kv_cache_gib(read_config(tmp_path), 64) == 320


def test_vllm_is_told_the_architecture_of_a_config_whose_architectures_is_null(tmp_path: Path) -> None:
    """`"architectures": null` is read by its model_type as a config without the key is (`check_hf_dir`): vLLM,
    which maps it to the base model as well, is told the ForCausalLM class too, versus nothing (the key is there)."""
    from rlctl.engines.vllm import architecture_overrides

    write_checkpoint("qwen2-tied-hd32", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architectures"] = None
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert check_hf_dir(tmp_path).config.architecture == "Qwen2ForCausalLM"
    overrides = architecture_overrides(read_config_json(tmp_path), read_config(tmp_path))
    assert overrides == {"hf_overrides": {"architectures": ["Qwen2ForCausalLM"]}}


@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_a_null_number_of_kv_heads_reads_as_its_config_class_reads_it(tmp_path: Path, architecture: str) -> None:
    """`"num_key_value_heads": null` written out: num_attention_heads for Llama, Qwen2, Qwen3 and Phi3, as their
    config classes read it (versus refused as missing); MistralConfig refuses it, and so does rlctl, in one line, as it
    does a Qwen2MoE's (Qwen2MoeConfig keeps the null, of which Qwen2MoeAttention cannot be built)."""
    # (a vocabulary of Phi-3's 32064: Phi3Config's default pad_token_id 32000 is a row of it)
    d = {"architectures": [architecture], "model_type": ARCHITECTURES[architecture], "hidden_size": 1024,
         "num_attention_heads": 16, "num_key_value_heads": None, "intermediate_size": 96, "num_hidden_layers": 2,
         "vocab_size": 32064}  # fmt: skip
    if architecture in ("MistralForCausalLM", "Qwen2MoeForCausalLM"):
        if architecture == "MistralForCausalLM":
            with pytest.raises(Exception, match="num_key_value_heads"):
                transformers.CONFIG_MAPPING["mistral"].from_dict(d)
        else:
            with torch.device("meta"), pytest.raises(TypeError, match="NoneType"):
                transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig.from_dict(d))
        with pytest.raises(ConfigError, match=r"^.*config\.json: num_key_value_heads: missing"):
            TinyGPTConfig.from_hf(d, file=str(tmp_path / "config.json"))
        return
    theirs = transformers.CONFIG_MAPPING[ARCHITECTURES[architecture]].from_dict(d)
    assert TinyGPTConfig.from_hf(d).num_key_value_heads == theirs.num_key_value_heads == 16
