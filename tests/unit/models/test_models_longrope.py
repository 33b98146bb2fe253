"""RoPE 'longrope' (Phi-3-mini-128k, Phi-3.5-mini, Phi-4-mini) and RoPE on part of each head (Phi-4-mini's
partial_rotary_factor 0.75) in the embedded model, the torch trainer's and the embedded engine: transformers'
Phi3ForCausalLM is the oracle (fp32, ≤ 1e-5), short_factor for a pass of at most the pretraining context (32 here),
long_factor for a longer one; config.json read in both of its forms and written back as transformers reads it; bad
values refused in one line; a context past the pretraining one refused to the engines and by `rlctl check` (there
transformers' generate and vLLM each compute otherwise)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from rlctl.config.job import load_job
from rlctl.engines.base import GenRequest
from rlctl.engines.embedded import EmbeddedEngine
from rlctl.models.hf import TinyGPTConfig, read_config
from rlctl.models.tinygpt import TinyGPT
from rlctl.ops import preflight
from tests.conftest import run_cli
from tests.unit.hf_checkpoints import refused_in_one_line
from tests.unit.ops.test_preflight import only_line
from tests.unit.rope_checkpoints import LONGROPE_CONTEXT, phi3

transformers = pytest.importorskip("transformers")

ATOL = 1e-5
ROOT = Path(__file__).resolve().parents[3]


def tokens(batch: int, length: int, *, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 96, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("legacy", [False, True], ids=["rope_parameters", "rope_scaling"])
@pytest.mark.parametrize(
    ("partial", "extra"),
    [(1.0, {}), (0.75, {}), (0.75, {"factor": 8.0}), (1.0, {"attention_factor": 1.3})],
    ids=["phi3.5-mini", "phi4-mini-partial", "factor", "attention-factor"],
)
def test_logits_equal_transformers_short_and_long(
    partial: float, extra: dict[str, Any], legacy: bool, tmp_path: Path
) -> None:
    """A pass of at most 32 positions takes short_factor, a longer one long_factor (transformers chooses per pass, by
    its length): the first 20 positions compute otherwise in a pass of 33 than in one of 20, in both."""
    ref = phi3(tmp_path, partial=partial, legacy=legacy, **extra)
    model = TinyGPT.from_pretrained(tmp_path).eval()
    c = model.config
    assert (c.partial_rotary_factor, c.rotary_dim, c.longrope_context) == (partial, int(32 * partial), 32)
    assert c.max_positions == 128  # vLLM's derived max_model_len: max_position_embeddings, no factor
    logits = {}
    with torch.no_grad():
        for length in (20, LONGROPE_CONTEXT, LONGROPE_CONTEXT + 1, 100):
            x = tokens(2, 100)[:, :length]
            logits[length] = model(x)
            torch.testing.assert_close(logits[length], ref(input_ids=x).logits, atol=ATOL, rtol=0)
    assert (logits[33][:, :20] - logits[20]).abs().max() > 100 * ATOL  # long_factor's pass is what 33 checks
    torch.testing.assert_close(logits[32][:, :20], logits[20], atol=ATOL, rtol=0)


@pytest.mark.parametrize("static", [False, True], ids=["exact-shapes", "bucketed-shapes"])
@pytest.mark.parametrize("partial", [1.0, 0.75], ids=["phi3.5-mini", "phi4-mini-partial"])
def test_engine_greedy_equals_transformers_generate(partial: float, static: bool, tmp_path: Path) -> None:
    """The engine's model (fused q/k/v, prefill then decode; at the bucketed shapes a CUDA graph captures, too) within
    the pretraining context: transformers' generate."""
    ref = phi3(tmp_path, partial=partial, legacy=True, seed=1)
    engine = EmbeddedEngine.from_pretrained(
        tmp_path, max_batch_size=3, temperature=0.0, context=LONGROPE_CONTEXT, static_shapes=static
    )
    prompts = [[1, 40, 41, 42], [1, 7], [1, 90, 12, 13, 14, 15, 16, 17, 18, 19, 20], [1, 60, 61]]
    engine.add([GenRequest(f"p{i}", p, 20, ignore_eos=True) for i, p in enumerate(prompts)])
    got = {r.request_id: r.output_tokens for r in engine.run_until_done()}
    for i, p in enumerate(prompts):
        out = ref.generate(torch.tensor([p]), max_new_tokens=20, do_sample=False, pad_token_id=0, eos_token_id=None)
        assert got[f"p{i}"] == out[0, len(p) :].tolist(), f"prompt {i}"


def test_an_engine_past_the_pretraining_context_is_refused_in_one_line(tmp_path: Path) -> None:
    """transformers' generate, crossing 32 mid-sequence, computes neither its own forward's logits nor the cache's
    (5.19: Phi3's cache dropped, the last token run alone), vLLM long_factor for every sequence: refused."""
    phi3(tmp_path)
    with pytest.raises(ValueError) as e:
        EmbeddedEngine.from_pretrained(tmp_path)  # (its context: max_position_embeddings 128)
    msg = str(e.value)
    assert msg.startswith("a model built for 128 tokens would pass original_max_position_embeddings 32 of RoPE ")
    assert "\n" not in msg and msg.endswith("build it for the job's context")


def test_the_export_is_what_transformers_loads(tmp_path: Path) -> None:
    """A Phi-4-mini-shaped file (rope_scaling `type`, θ, original_max_position_embeddings and partial_rotary_factor at
    the top): rlctl's export reads back the same, and transformers (as vLLM) loads it as the model it came from."""
    ref = phi3(tmp_path / "in", partial=0.75, legacy=True, factor=4.0)
    model = TinyGPT.from_pretrained(tmp_path / "in").eval()
    model.save_pretrained(tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    said = json.loads((tmp_path / "in" / "config.json").read_text())["rope_scaling"]
    assert written["rope_scaling"] == {
        "rope_type": "longrope",
        "factor": 4.0,
        "original_max_position_embeddings": 32,
        "short_factor": said["short_factor"],
        "long_factor": said["long_factor"],
    }
    assert (written["original_max_position_embeddings"], written["partial_rotary_factor"]) == (32, 0.75)
    assert read_config(tmp_path / "out") == read_config(tmp_path / "in") == model.config
    assert TinyGPTConfig.from_hf(model.config.to_hf()) == model.config
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(again) is type(ref)
    assert _said(again.config.rope_parameters) == _said(ref.config.rope_parameters)  # (a `type` beside rope_type)
    for length in (20, 100):
        x = tokens(2, length)
        with torch.no_grad():
            torch.testing.assert_close(again(input_ids=x).logits, ref(input_ids=x).logits, atol=ATOL, rtol=0)


def _said(rope: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rope.items() if k != "type"}


@pytest.mark.parametrize(
    ("key", "change", "complaint"),
    [
        ("rope_scaling.short_factor", {"short_factor": [1.0] * 15},
         "has 15 numbers; RoPE 'longrope' needs one per frequency: 16 (head_dim × partial_rotary_factor / 2)"),
        ("rope_scaling.long_factor", {"long_factor": [1.0] * 17}, "has 17 numbers"),
        ("rope_scaling.short_factor", {"top": {"partial_rotary_factor": 0.75}},
         "has 16 numbers; RoPE 'longrope' needs one per frequency: 12"),
        ("rope_scaling.long_factor[3]", {"long_factor": [1.0, 2.0, 3.0, "4", *[1.0] * 12]},
         "'4' is not a positive number"),
        ("rope_scaling.short_factor[0]", {"short_factor": [0.0] * 16}, "0.0 is not a positive number"),
        ("rope_scaling.long_factor", {"long_factor": 4.0}, "4.0 is not a list of positive numbers"),
        ("rope_scaling.long_factor", {"long_factor": None}, "missing; RoPE 'longrope' needs short_factor, long_factor"),
        ("rope_scaling.factor", {"factor": "2"}, "'2' is not a positive number"),
        ("rope_scaling.attention_factor", {"attention_factor": -1.0}, "-1.0 is not a positive number"),
        ("rope_scaling.original_max_position_embeddings", {"original_max_position_embeddings": 64},
         "64 is not the top-level original_max_position_embeddings 32 (transformers reads that one)"),
        ("rope_scaling", {"beta_fast": 32.0}, "['beta_fast'] with RoPE 'longrope' is not supported"),
        ("rope_scaling", {"type": "linear", "factor": 2.0},
         "RoPE 'linear' is not supported; supported for Phi3: default RoPE (rope_theta) and 'longrope' scaling"),
        ("partial_rotary_factor", {"top": {"partial_rotary_factor": 1.5}},
         "1.5 is not a fraction of a head's dimensions (a number above 0, at most 1)"),
        ("partial_rotary_factor", {"top": {"partial_rotary_factor": 0.3}},
         "0.3 of head_dim 32 is 9 dimensions; give a fraction whose dimensions are even and not 0"),
        ("head_dim", {"top": {"head_dim": 32, "num_attention_heads": 4, "num_key_value_heads": 2}},
         "32 is not hidden_size / num_attention_heads 16: transformers checks RoPE 'longrope''s factors against the "
         "one and computes with the other"),
    ],
)  # fmt: skip
def test_bad_values_are_refused_in_one_line(key: str, change: dict[str, Any], complaint: str, tmp_path: Path) -> None:
    phi3(tmp_path, legacy=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    top = change.pop("top", {})
    cfg["rope_scaling"] = {k: v for k, v in ({**cfg["rope_scaling"], **change}).items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **top}))
    refused_in_one_line(tmp_path, key, complaint)


def test_partial_rope_without_scaling_equals_transformers(tmp_path: Path) -> None:
    """RoPE on 0.75 of each head, unscaled (`rope_scaling` null): Phi3's default rotary embedding over 24 of 32."""
    phi3(tmp_path, partial=0.75, legacy=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "rope_scaling": None}))
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    model = TinyGPT.from_pretrained(tmp_path).eval()
    assert (model.config.rope_scaling, model.config.rotary_dim, model.rope_cos.shape[-1]) == (None, 24, 24)
    x = tokens(2, 100)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(input_ids=x).logits, atol=ATOL, rtol=0)


def test_the_older_su_form_is_longrope(tmp_path: Path) -> None:
    """Phi-3-mini-128k's first files say `su` (Phi3Config and vLLM read it as longrope): read so, written so."""
    ref = phi3(tmp_path, legacy=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["rope_scaling"]["type"] = "su"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = TinyGPT.from_pretrained(tmp_path).eval()
    assert model.config.to_hf()["rope_scaling"]["rope_type"] == "longrope"
    x = tokens(2, 50)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(input_ids=x).logits, atol=ATOL, rtol=0)


def test_longrope_and_partial_rope_are_a_phi3s_alone(tmp_path: Path) -> None:
    """LlamaConfig reads neither (its rotary embedding turns every dimension)."""
    phi3(tmp_path, legacy=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    llama = {**cfg, "architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    (tmp_path / "config.json").write_text(json.dumps(llama))
    refused_in_one_line(tmp_path, "rope_scaling", "RoPE 'longrope' is not supported; supported: default RoPE")
    del llama["rope_scaling"]
    (tmp_path / "config.json").write_text(json.dumps({**llama, "partial_rotary_factor": 0.75}))
    refused_in_one_line(tmp_path, "partial_rotary_factor", "0.75 is not supported (RoPE on part of each head)")


def _job(tmp_path: Path, *, max_output_tokens: int, backend: str = "torch", engine: str = "embedded") -> Path:
    job = {
        "apiVersion": "rlctl/v1",
        "kind": "Job",
        "name": "longrope",
        "inventory": [str(ROOT / "clusters" / "local.yaml")],
        "model": {"kind": "hf", "path": str(tmp_path / "model")},
        "algorithm": {"kind": "grpo"},
        "task": {"kind": "digits", "median_output_tokens": 6, "max_output_tokens": max_output_tokens},
        "iterations": 2,
        "batch": {"prompts_per_iteration": 3, "samples_per_prompt": 2, "train_micro_batch_samples": 2},
        "placement": {"trainer": {"site": "local", "gpus": 1}, "rollout": [{"site": "local", "gpus": 2}]},
        "trainer": {"backend": backend},
        "rollout": {"engine": engine},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    return tmp_path / "job.yaml"


def test_check_refuses_a_context_past_the_pretraining_one_in_one_line(tmp_path: Path) -> None:
    """Within 32 tokens the job passes (both engines, the torch trainer); past it `rlctl check` says why, naming
    task.max_output_tokens, though the model holds 128."""
    phi3(tmp_path / "model")
    fits = load_job(_job(tmp_path, max_output_tokens=16))
    assert [p for p in preflight.problems(fits) if p.field in ("task.max_output_tokens", "rollout.engine")] == []
    past = load_job(_job(tmp_path, max_output_tokens=40))
    (p,) = [p for p in preflight.problems(past) if p.field == "task.max_output_tokens"]
    prompt = int(re.match(r"(\d+) prompt \+ 40 output tokens pass ", p.message).group(1))  # type: ignore[union-attr]
    assert p.message == (
        f"{prompt} prompt + 40 output tokens pass original_max_position_embeddings 32 of RoPE 'longrope', past which "
        "transformers switches from short_factor to long_factor by each pass's length (re-encoding a sequence that "
        "crosses it mid-generation) and vLLM by max_model_len for every sequence: engine and trainer would disagree; "
        f"use max_output_tokens ≤ {32 - prompt}"
    )
    line = only_line(run_cli("check", str(tmp_path / "job.yaml")))
    assert line == f"rlctl: error: {tmp_path / 'job.yaml'}: task.max_output_tokens: {p.message}"


def test_megatron_is_refused_in_one_line(tmp_path: Path) -> None:
    """megatron-core 0.16.1 has no longrope; the torch backend runs it."""
    phi3(tmp_path / "model", partial=0.75)
    said = (
        f"'megatron' cannot run the model of {tmp_path / 'model'}/config.json: RoPE 'longrope' (short_factor and "
        "long_factor per frequency) is not in megatron-core 0.16.1; use trainer.backend 'torch' for this model"
    )
    for backend, want in (("megatron", [said]), ("torch", [])):
        job = load_job(_job(tmp_path, max_output_tokens=16, backend=backend))
        assert [p.message for p in preflight.problems(job) if p.field == "trainer.backend"] == want


def test_vllm_is_refused_where_it_would_scale_cos_and_sin_otherwise(tmp_path: Path) -> None:
    """vLLM's longrope reads neither factor nor attention_factor (its √(1 + ln(128 / 32) / ln 32) = 1.18322): a model
    that says either and makes transformers' another is refused to engine 'vllm'; one that says neither is not."""
    for extra, said in (({"factor": 8.0}, "1.26491"), ({"attention_factor": 1.3}, "1.3"), ({}, None)):
        phi3(tmp_path / "model", **extra)
        job = load_job(_job(tmp_path, max_output_tokens=16, engine="vllm"))
        got = [p.message for p in preflight.problems(job) if p.field == "rollout.engine" and "cannot run" in p.message]
        assert got == ([] if said is None else [
            f"'vllm' cannot run the model of {tmp_path / 'model'}/config.json: RoPE 'longrope' with factor or "
            f"attention_factor: transformers scales cos and sin by {said} from them, vLLM by 1.18322 from "
            "max_position_embeddings / original_max_position_embeddings; use engine 'embedded' for this model"
        ])  # fmt: skip
