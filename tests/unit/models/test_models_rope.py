"""RoPE scaling (Llama 3.1–3.3's `llama3`, `linear`, and Qwen2.5/Qwen3's `yarn`) in the embedded model and the torch
trainer's: transformers' LlamaForCausalLM and Qwen2ForCausalLM with the same `rope_scaling` are the oracle (fp32,
≤ 1e-5) at positions past the pretraining context; config.json read in both of its forms and written back as read;
bad values and every other scaling refused in one line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from rlctl.models.hf import RopeScaling, TinyGPTConfig, read_config
from rlctl.models.tinygpt import TinyGPT
from tests.unit.hf_checkpoints import refused_in_one_line
from tests.unit.rope_checkpoints import (
    LINEAR,
    LLAMA3,
    LLAMA31,
    THETA,
    YARN,
    YARN_ATTENTION,
    YARN_TUNED,
    bands,
    llama,
)

transformers = pytest.importorskip("transformers")

ATOL = 1e-5


def tokens(batch: int, length: int, *, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 96, (batch, length), generator=torch.Generator().manual_seed(seed))


def assert_scaled_logits_equal(model: TinyGPT, ref: Any, x: torch.Tensor) -> torch.Tensor:
    """`model`'s logits of `x` equal transformers' (`ref`) within ATOL, and the same weights without the RoPE scaling
    give logits more than 100 × ATOL apart: the scaling is what the comparison checks. Returns transformers'."""
    with torch.no_grad():
        got, want = model(x), ref(input_ids=x).logits
        unscaled = TinyGPT(dataclasses.replace(model.config, rope_scaling=None))
        unscaled.load_state_dict(model.state_dict())
        apart = (unscaled(x) - want).abs().max()
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    assert apart > 100 * ATOL
    return want


@pytest.mark.parametrize("rope", [LLAMA3, LLAMA31], ids=["context-32", "llama-3.1"])
def test_the_llama3_test_configs_have_every_band(rope: dict[str, Any]) -> None:
    """What makes the parity tests (here and test_megatron_rope.py) check all three of llama3's cases."""
    assert bands(rope) == {"kept", "divided", "between"}


@pytest.mark.parametrize("legacy", [False, True], ids=["rope_parameters", "rope_scaling"])
@pytest.mark.parametrize(
    ("rope", "qwen2"),
    [(LLAMA3, False), (LINEAR, False), (YARN, False), (YARN, True), (YARN_TUNED, True), (YARN_ATTENTION, True)],
    ids=["llama3", "linear", "yarn", "yarn-qwen2", "yarn-tuned-qwen2", "yarn-attention-factor-qwen2"],
)
def test_logits_equal_transformers_past_the_pretraining_context(
    rope: dict[str, Any], qwen2: bool, legacy: bool, tmp_path: Path
) -> None:
    ref = llama(rope, tmp_path, legacy=legacy, qwen2=qwen2)
    model = TinyGPT.from_pretrained(tmp_path).eval()
    assert model.config.rope_scaling == RopeScaling(
        kind=rope["rope_type"], **{k: v for k, v in rope.items() if k != "rope_type"}
    )
    # positions to 99, past the 32 of llama3's and yarn's pretraining context
    assert_scaled_logits_equal(model, ref, tokens(3, 100))


@pytest.mark.parametrize("rope", [LLAMA3, YARN], ids=["llama3", "yarn"])
def test_decode_runs_the_scaled_tables(rope: dict[str, Any], tmp_path: Path) -> None:
    """The rollout path (prefill, then one token at a time at its own position) against the full-sequence pass."""
    llama(rope, tmp_path)
    model = TinyGPT.from_pretrained(tmp_path).eval()
    x = tokens(2, 80, seed=1)
    cache = model.new_cache(2, 80)
    with torch.no_grad():
        full = model(x)
        model.prefill(cache, torch.arange(2), x[:, :40], torch.tensor([40, 40]))
        for t in range(40, 79):
            model.decode(cache, x[:, t], rows=2, width=80)
        last = model.decode(cache, x[:, 79], rows=2, width=80)
    torch.testing.assert_close(last, full[:, 79], atol=ATOL, rtol=0)


@pytest.mark.parametrize(("rope", "qwen2"), [(LLAMA3, False), (YARN_TUNED, True)], ids=["llama3", "yarn-qwen2"])
def test_the_scaling_is_written_back_as_read(rope: dict[str, Any], qwen2: bool, tmp_path: Path) -> None:
    """A checkpoint's export (save_pretrained: the trainer's, `rlctl pull`'s) carries its scaling: rlctl reads it
    back the same, and transformers (as vLLM, which reads config.json itself) computes the same logits from it."""
    ref = llama(rope, tmp_path / "in", legacy=True, qwen2=qwen2)
    model = TinyGPT.from_pretrained(tmp_path / "in").eval()
    model.save_pretrained(tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["rope_scaling"] == rope and written["rope_theta"] == THETA
    assert read_config(tmp_path / "out") == read_config(tmp_path / "in") == model.config
    assert TinyGPTConfig.from_hf(model.config.to_hf()) == model.config
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(again) is type(ref) and again.config.rope_parameters == {**rope, "rope_theta": THETA}
    x = tokens(2, 100)
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=x).logits, ref(input_ids=x).logits, atol=ATOL, rtol=0)


def test_the_default_form_of_rope_parameters_is_no_scaling(tmp_path: Path) -> None:
    llama(None, tmp_path)
    c = read_config(tmp_path)
    assert (c.rope_theta, c.rope_scaling) == (THETA, None) and "rope_scaling" not in c.to_hf()


@pytest.mark.parametrize("where", ["rope_parameters", "top"])
def test_a_partial_rotary_factor_of_1_is_whole_rope(tmp_path: Path, where: str) -> None:
    """transformers 5 writes `partial_rotary_factor: 1.0` into a Phi3's rope_parameters (every dimension rotated: the
    RoPE rlctl computes); older files put it beside rope_theta. Read as no key at all, the logits transformers'."""
    ref = llama(None, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (cfg["rope_parameters"] if where == "rope_parameters" else cfg)["partial_rotary_factor"] = 1.0
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = TinyGPT.from_pretrained(tmp_path).eval()
    assert (model.config.rope_theta, model.config.rope_scaling) == (THETA, None)
    x = tokens(2, 60)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(input_ids=x).logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("key", "rope", "complaint"),
    [
        ("rope_parameters", {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
         "RoPE 'dynamic' is not supported; supported: default RoPE (rope_theta), 'linear', 'llama3' and 'yarn' "
         "scaling"),
        ("rope_scaling", {"type": "longrope", "factor": 2.0}, "RoPE 'longrope' is not supported"),
        ("rope_scaling.low_freq_factor", {k: v for k, v in LLAMA3.items() if k[0] != "l"},
         "missing; RoPE 'llama3' needs factor, low_freq_factor, high_freq_factor"),
        ("original_max_position_embeddings", {k: v for k, v in LLAMA3.items() if k[0] != "o"},
         "64 at the top of config.json, which transformers and vLLM put over RoPE 'llama3''s (none: "
         "max_position_embeddings); give it in the RoPE entry alone"),
        ("original_max_position_embeddings", YARN,
         "64 at the top of config.json, which transformers and vLLM put over RoPE 'yarn''s 32; give it"),
        ("rope_scaling.factor", {**LINEAR, "factor": 0}, "0 is not a positive number"),
        ("rope_scaling.original_max_position_embeddings", {**LLAMA3, "original_max_position_embeddings": 32.5},
         "32.5 is not a positive integer"),
        ("rope_scaling.high_freq_factor", {**LLAMA3, "high_freq_factor": 1}, "1 is not above low_freq_factor 1"),
        ("rope_scaling.partial_rotary_factor", {**LLAMA3, "partial_rotary_factor": 0.5},
         "0.5 is not supported (RoPE on part of each head); supported: 1.0, every dimension of a head rotated"),
        ("partial_rotary_factor", 0.75, "0.75 is not supported (RoPE on part of each head); supported: 1.0"),
        ("rope_scaling", {**LINEAR, "low_freq_factor": 1.0}, "['low_freq_factor'] with RoPE 'linear'"),
        ("rope_scaling", {**YARN, "low_freq_factor": 1.0}, "['low_freq_factor'] with RoPE 'yarn' is not supported"),
        ("rope_scaling.factor", {"rope_type": "yarn", "original_max_position_embeddings": 32},
         "missing; RoPE 'yarn' needs factor"),
        ("rope_scaling.factor", {**YARN, "factor": 0.5},
         "0.5 is below 1; YaRN's factor is the context's extension, ≥ 1"),
        ("rope_scaling.beta_fast", {**YARN, "beta_fast": 0.5},
         "0.5 is below beta_slow 1; YaRN keeps the faster-turning dimensions"),
        ("rope_scaling.beta_slow", {**YARN, "beta_slow": "1"}, "'1' is not a positive number"),
        ("rope_scaling.mscale", {**YARN, "mscale": 0, "mscale_all_dim": 1}, "0 is not a positive number"),
        ("rope_scaling.attention_factor", {**YARN, "attention_factor": -1.0}, "-1.0 is not a positive number"),
        ("rope_scaling.truncate", {**YARN, "truncate": 0}, "0 is not true or false"),
        ("rope_parameters", "both", "rope_scaling {'rope_type': 'linear', 'factor': 4.0}; keep one"),
    ],
)  # fmt: skip
def test_other_scalings_are_refused_in_one_line(key: str, rope: Any, complaint: str, tmp_path: Path) -> None:
    llama(None, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    if rope == "both":  # transformers would read rope_scaling alone, and drop θ 1e6
        cfg |= {"rope_scaling": LINEAR, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    elif key == "partial_rotary_factor":  # Phi-4-mini's place for it: beside rope_scaling
        cfg[key] = rope
    elif key == "original_max_position_embeddings":  # beside the entry (a Phi3's place for it)
        cfg |= {"rope_scaling": rope, key: 64}
        cfg.pop("rope_parameters")
    else:
        cfg.pop("rope_parameters")
        cfg[key.split(".")[0]] = rope
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    refused_in_one_line(tmp_path, key, complaint)


@pytest.mark.parametrize("legacy", [False, True], ids=["rope_parameters", "rope_scaling"])
@pytest.mark.parametrize(
    ("rope", "qwen2"),
    [({k: v for k, v in LLAMA3.items() if k[0] != "o"}, False), ({"rope_type": "yarn", "factor": 4.0}, True)],
    ids=["llama3", "yarn-qwen2"],
)
def test_a_scaling_without_its_pretraining_context_takes_max_position_embeddings(
    rope: dict[str, Any], qwen2: bool, legacy: bool, tmp_path: Path
) -> None:
    """llama3 and yarn without original_max_position_embeddings: transformers 5 (standardize_rope_params) and vLLM 0.32
    (which calls it) take max_position_embeddings, 128 here; so rlctl computes, and its context is 128 as vLLM derives
    it (llama3's, and yarn's without the key, not multiplied). Refused before (missing; RoPE 'llama3' needs ...).
    Written back as read: transformers computes the same from the export."""
    ref = llama(rope, tmp_path / "in", legacy=legacy, qwen2=qwen2)
    cfg = json.loads((tmp_path / "in" / "config.json").read_text())
    assert cfg.get("rope_parameters", {}).pop("original_max_position_embeddings", 128) == 128  # (transformers' own)
    (tmp_path / "in" / "config.json").write_text(json.dumps(cfg))
    model = TinyGPT.from_pretrained(tmp_path / "in").eval()
    assert model.config.rope_scaling == RopeScaling(
        kind=rope["rope_type"], **{k: v for k, v in rope.items() if k != "rope_type"}
    )
    assert model.context == model.config.max_positions == 128
    x = tokens(3, 128)
    want = assert_scaled_logits_equal(model, ref, x)
    model.save_pretrained(tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["rope_scaling"] == rope and "original_max_position_embeddings" not in written
    assert read_config(tmp_path / "out") == model.config
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=x).logits, want, atol=ATOL, rtol=0)
