"""A model's context is the longest sequence vLLM would run it on (vllm/config/model.py `_get_and_verify_max_len`):
max_position_embeddings, times the factor of a linear RoPE scaling; llama3's, longrope's and yarn's not multiplied
(vLLM 0.32: their max_position_embeddings is the scaled context) (`TinyGPTConfig.max_positions`). `rlctl check` and
`rlctl plan` allow a job that much, and the embedded model, the torch and megatron trainers and vLLM's max_model_len
hold sequences to it; a linear model's positions past max_position_embeddings compute transformers' logits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from rlctl.models.hf import TinyGPTConfig, read_config
from rlctl.models.rope import RopeScaling
from rlctl.models.tinygpt import TinyGPT
from rlctl.ops.preflight import problems
from rlctl.planner.context import context_refusal, model_positions
from tests.conftest import run_cli
from tests.unit.hf_checkpoints import config_reads
from tests.unit.ops.test_preflight import hf_dataset_job, only_line, refused
from tests.unit.rope_checkpoints import LINEAR, YARN, llama

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(
    ("positions", "scaling", "context"),
    [
        # yarn: vLLM 0.32 takes max_position_embeddings ("YaRN variants leave max_position_embeddings already
        # scaled"), and refuses to start with a max_model_len of original_max_position_embeddings × factor above it
        (40960, RopeScaling("yarn", 4.0, original_max_position_embeddings=32768), 40960),  # Qwen3's config.json
        (131072, RopeScaling("yarn", 4.0, original_max_position_embeddings=32768), 131072),  # Qwen3's, as Qwen says
        (256, RopeScaling("yarn", 2.5, original_max_position_embeddings=32), 256),
        (128, RopeScaling("linear", 4.0), 512),
        (131072, RopeScaling("llama3", 8.0, 1.0, 4.0, 8192), 131072),  # Llama 3.1's 131072 is the scaled context
        (4096, None, 4096),
        # without original_max_position_embeddings: max_position_embeddings, as with it
        (64, RopeScaling("yarn", 4.0), 64),
        (64, RopeScaling("llama3", 8.0, 1.0, 4.0), 64),
    ],
    ids=["qwen3-yarn", "qwen3-yarn-131072", "yarn-256", "linear", "llama3", "none", "yarn-unsaid", "llama3-unsaid"],
)
def test_the_context_is_vllms_max_model_len(positions: int, scaling: RopeScaling | None, context: int) -> None:
    c = TinyGPTConfig(max_position_embeddings=positions, rope_scaling=scaling)
    assert c.max_positions == c.arch("m").max_positions == context


def _scaled(model: Path, rope: dict[str, Any]) -> None:
    config = model / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "rope_scaling": rope}))


def test_check_and_plan_allow_the_scaled_context_and_refuse_past_it_in_one_line(tmp_path: Path) -> None:
    """72 tokens of a 64-position model with a linear scaling (64 × 4 = 256): refused before, as past
    max_position_embeddings; with yarn (32 × 4) still refused, as vLLM 0.32 would refuse max_model_len 72."""
    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 24, "max_output_tokens": 48})
    assert [p.field for p in problems(job)] == ["task.max_output_tokens"]  # unscaled: 64 positions
    _scaled(tmp_path / "model", YARN)
    assert [p.field for p in problems(job)] == ["task.max_output_tokens"]
    _scaled(tmp_path / "model", LINEAR)
    assert problems(job) == []
    assert run_cli("plan", str(job.path)).exit_code == 0
    past = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 200, "max_output_tokens": 100})
    _scaled(tmp_path / "model", LINEAR)
    (p,) = refused(past, "task.max_output_tokens")
    assert p.message == (
        "max_prompt_tokens 200 + max_output_tokens 100 = 300 tokens exceed model context 256 "
        f"({tmp_path / 'model'}/config.json: max_position_embeddings 64 × 'linear' factor 4, as vLLM derives it); use "
        "max_prompt_tokens + max_output_tokens ≤ 256"
    )
    line = only_line(run_cli("check", str(past.path)))
    assert line == f"rlctl: error: {past.path}: task.max_output_tokens: {p.message}"
    assert only_line(run_cli("plan", str(past.path))) == line


def test_the_context_refusal_reads_config_json_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its context, the line saying it and the RoPE scaling come from one read of config.json, versus three (the
    architecture's, the context's line's and the scaling's), for a job that fits and one refused alike."""
    fits = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 24, "max_output_tokens": 48})
    _scaled(tmp_path / "model", LINEAR)
    past = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 200, "max_output_tokens": 100})
    _scaled(tmp_path / "model", LINEAR)
    config = tmp_path / "model" / "config.json"
    reads = config_reads(monkeypatch)
    assert context_refusal(fits) is None
    assert reads == [config]
    refusal = context_refusal(past)
    assert refusal is not None and "exceed model context 256" in refusal[1]
    assert reads == [config] * 2
    assert model_positions(past) == (
        256,
        f"context 256 ({config}: max_position_embeddings 64 × 'linear' factor 4, as vLLM derives it)",
    )
    assert reads == [config] * 3


def test_positions_past_max_position_embeddings_equal_transformers(tmp_path: Path) -> None:
    """The embedded model (the torch trainer's) holds a linear scaling's context, where it held max_position_embeddings
    (a ValueError: sequence of 300 tokens > max_position_embeddings 128), and computes transformers' logits there; a
    yarn model holds its max_position_embeddings."""
    ref = llama(LINEAR, tmp_path / "linear", positions=128)
    model = TinyGPT.from_pretrained(tmp_path / "linear").eval()
    assert model.context == read_config(tmp_path / "linear").max_positions == 4 * 128
    x = torch.randint(0, 96, (2, 300), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(input_ids=x).logits, atol=1e-5, rtol=0)
    with pytest.raises(
        ValueError, match=r"^sequence of \d+ tokens > the model's context \(.* × 'linear' factor 4\) \d+$"
    ):
        model(torch.zeros(1, model.context + 1, dtype=torch.long))
    llama(YARN, tmp_path / "yarn", positions=128)
    assert TinyGPT.from_pretrained(tmp_path / "yarn").context == read_config(tmp_path / "yarn").max_positions == 128
