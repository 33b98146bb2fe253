"""RoPE scaling on the `megatron` trainer backend (one gloo rank on CPU): Llama 3.1's llama3 scaling (megatron-core's
`rope_scaling`, its bands fixed at 1, 4, 8192), linear (`seq_len_interpolation_factor`) and yarn (YarnRotaryEmbedding)
give the torch backend's logits; llama3 with other bands, and yarn with an attention factor megatron-core does not
compute, are refused, by the backend and by `rlctl check`, in one line. A Phi3's RoPE on 0.75 of each head
(`rotary_percent`) gives transformers' logits and the torch backend's gradients, and passes `rlctl check`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from rlctl.config.job import load_job
from rlctl.models.hf import read_config
from rlctl.models.tinygpt import TinyGPT
from rlctl.ops import preflight
from rlctl.rl.samples import token_logprobs
from rlctl.trainers.base import load_backend
from rlctl.trainers.megatron import names
from tests.unit.rope_checkpoints import LINEAR, LLAMA3, LLAMA31, YARN, YARN_ATTENTION, YARN_TUNED, llama, phi3

pytest.importorskip("transformers")
YARN_UNSAID = {"rope_type": "yarn", "factor": 4.0}
pytestmark = pytest.mark.usefixtures("megatron_rank")

ROOT = Path(__file__).resolve().parents[3]
ATOL = 1e-5


def tokens(batch: int, length: int, *, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 96, (batch, length), generator=torch.Generator().manual_seed(seed))


def megatron_job(model: Path) -> dict[str, Any]:
    """A GRPO job of the HF model at `model` on the megatron backend, on the local CPU site."""
    return {
        "apiVersion": "rlctl/v1",
        "kind": "Job",
        "name": "rope",
        "inventory": [str(ROOT / "clusters" / "local.yaml")],
        "model": {"kind": "hf", "path": str(model)},
        "algorithm": {"kind": "grpo"},
        "task": {"kind": "digits", "median_output_tokens": 6, "max_output_tokens": 16},
        "iterations": 2,
        "batch": {"prompts_per_iteration": 3, "samples_per_prompt": 2, "train_micro_batch_samples": 2},
        "placement": {"trainer": {"site": "local", "gpus": 1}, "rollout": [{"site": "local", "gpus": 2}]},
        "trainer": {"backend": "megatron"},
    }


@pytest.mark.parametrize(
    ("rope", "qwen2"),
    [(LLAMA31, False), (LINEAR, False), (YARN, False), (YARN, True), (YARN_TUNED, True), (YARN_UNSAID, True)],
    ids=["llama3", "linear", "yarn", "yarn-qwen2", "yarn-tuned-qwen2", "yarn-unsaid-qwen2"],
)
def test_logits_equal_the_torch_backend(rope: dict[str, Any], qwen2: bool, tmp_path: Path) -> None:
    """(yarn-unsaid: no original_max_position_embeddings, so max_position_embeddings 128, as transformers takes it)"""
    ref = llama(rope, tmp_path / "in", qwen2=qwen2)
    if rope is YARN_UNSAID:  # (transformers writes its 128 in)
        cfg = json.loads((tmp_path / "in" / "config.json").read_text())
        del cfg["rope_parameters"]["original_max_position_embeddings"]
        (tmp_path / "in" / "config.json").write_text(json.dumps(cfg))
    backend = load_backend("megatron", tmp_path / "in")
    model, torch_model = backend.model.eval(), TinyGPT.from_pretrained(tmp_path / "in").eval()
    backend.save_pretrained(tmp_path / "out")  # its exports carry the scaling, as read
    assert read_config(tmp_path / "out") == read_config(tmp_path / "in") == torch_model.config
    x = tokens(3, 100)
    with torch.no_grad():
        got, want = model(x), torch_model(x)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        torch.testing.assert_close(got, ref(input_ids=x).logits, atol=ATOL, rtol=0)
        unscaled = TinyGPT(dataclasses.replace(torch_model.config, rope_scaling=None))
        unscaled.load_state_dict(torch_model.state_dict())
        assert (unscaled(x) - want).abs().max() > 100 * ATOL  # the scaling is what the comparison checks


def test_llama3_bands_megatron_fixes_otherwise_are_refused_in_one_line(tmp_path: Path) -> None:
    llama(LLAMA3, tmp_path / "model")  # a pretraining context of 32, not 8192
    said = (
        "RoPE 'llama3' with low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 32: megatron-core "
        "fixes these at Llama 3.1's (1, 4, 8192); use trainer.backend 'torch' for this model"
    )
    with pytest.raises(ValueError) as e:
        load_backend("megatron", tmp_path / "model")
    assert str(e.value) == said
    job = megatron_job(tmp_path / "model")
    refused = {}
    for backend in ("megatron", "torch"):
        (tmp_path / "job.yaml").write_text(yaml.safe_dump({**job, "trainer": {"backend": backend}}))
        problems = preflight.problems(load_job(tmp_path / "job.yaml"))
        refused[backend] = [p.message for p in problems if p.field == "trainer.backend"]
    assert refused == {"megatron": [f"'megatron' cannot run the model of {tmp_path / 'model'}/config.json: {said}"],
                       "torch": []}  # fmt: skip
    llama(YARN_ATTENTION, tmp_path / "model")  # an attention factor of its own: megatron-core computes one
    said = (
        "RoPE 'yarn' with attention_factor 1.3: megatron-core computes it from factor, mscale and mscale_all_dim "
        "(1.13863 here); use trainer.backend 'torch' for this model"
    )
    with pytest.raises(ValueError) as e:
        load_backend("megatron", tmp_path / "model")
    assert str(e.value) == said
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    assert [p.message for p in preflight.problems(load_job(tmp_path / "job.yaml")) if p.field == "trainer.backend"] == [
        f"'megatron' cannot run the model of {tmp_path / 'model'}/config.json: {said}"
    ]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    for runs in (LLAMA31, YARN_TUNED):  # Llama 3.1's bands, yarn's attention factor as megatron-core computes it
        llama(runs, tmp_path / "model")
        assert [p for p in preflight.problems(load_job(tmp_path / "job.yaml")) if p.field == "trainer.backend"] == []


def test_the_scaled_context_past_max_position_embeddings_runs(tmp_path: Path) -> None:
    """linear × 4 of 128 positions: 512 (vLLM's max_model_len, `TinyGPTConfig.max_positions`), which the backend
    holds as the torch backend does, versus a ValueError past 128 (sequence of 300 tokens > max_position_embeddings)."""
    ref = llama(LINEAR, tmp_path)
    model = load_backend("megatron", tmp_path).model.eval()
    x = tokens(2, 300)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(input_ids=x).logits, atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match=r"^sequence of 513 tokens > the model's max_positions 512$"):
        model(tokens(1, 513))


def test_rope_on_part_of_each_head_equals_transformers_phi3(tmp_path: Path) -> None:
    """Phi-4-mini's partial_rotary_factor 0.75 (24 of a head's 32 dimensions, default RoPE): megatron-core's
    `rotary_percent` rotates the same dimensions the same way as transformers' Phi3 (its first 24, rotate_half within
    them; the last 8 passed), so the logits are transformers' and the torch backend's, and the gradients the torch
    backend's (the tolerances of test_megatron_backend.py); `rlctl check` passes the job, versus refusing it."""
    ref = phi3(tmp_path / "model", partial=0.75, scaled=False)
    backend = load_backend("megatron", tmp_path / "model")
    model, torch_model = backend.model.eval(), TinyGPT.from_pretrained(tmp_path / "model").eval()
    assert backend.model.gpt.rotary_pos_emb.inv_freq.numel() == 12  # frequencies for 24 dimensions
    backend.save_pretrained(tmp_path / "out")  # its exports carry the fraction, as read
    assert read_config(tmp_path / "out") == read_config(tmp_path / "model") == torch_model.config
    x = tokens(3, 100)
    with torch.no_grad():
        got = model(x)
        torch.testing.assert_close(got, ref(input_ids=x).logits, atol=ATOL, rtol=0)
        torch.testing.assert_close(got, torch_model(x), atol=ATOL, rtol=0)
        whole = TinyGPT(dataclasses.replace(torch_model.config, partial_rotary_factor=1.0))
        whole.load_state_dict(torch_model.state_dict())
        assert (whole(x) - got).abs().max() > 100 * ATOL  # the fraction is what the comparison checks
    model.train(), torch_model.train()
    x = tokens(2, 24, seed=1)
    token_logprobs(model, x).sum().backward()
    token_logprobs(torch_model, x).sum().backward()
    grads = names.to_hf({k: p.grad for k, p in model.gpt.named_parameters() if p.grad is not None}, model.config)
    for name, p in torch_model.named_parameters():
        assert p.grad is not None
        assert (grads[name] - p.grad).abs().max() <= 2e-5 * p.grad.abs().max(), name
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(megatron_job(tmp_path / "model")))
    assert [p for p in preflight.problems(load_job(tmp_path / "job.yaml")) if p.field == "trainer.backend"] == []
