"""`rlctl check` on a Qwen3MoE checkpoint: the torch trainer, the embedded engine and vLLM run it; what does not (the
megatron backend, the embedded engine's compiled step) is refused in one line each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlctl.config.job import load_job
from rlctl.ops import preflight
from tests.unit.hf_checkpoints import write_checkpoint

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[3]


def problems(tmp_path: Path, variant: str, **spec: Any) -> dict[str, list[str]]:
    """Each field's problems for a GRPO job on checkpoint `variant` (written once) with `spec`'s sections."""
    if not (tmp_path / variant).exists():
        write_checkpoint(variant, tmp_path / variant)
    job = {
        "apiVersion": "rlctl/v1",
        "kind": "Job",
        "name": "moe",
        "inventory": [str(ROOT / "clusters" / "local.yaml")],
        "model": {"kind": "hf", "path": str(tmp_path / variant)},
        "algorithm": {"kind": "grpo"},
        "task": {"kind": "digits", "median_output_tokens": 6, "max_output_tokens": 16},
        "iterations": 2,
        "batch": {"prompts_per_iteration": 3, "samples_per_prompt": 2, "train_micro_batch_samples": 2},
        "placement": {"trainer": {"site": "local", "gpus": 1}, "rollout": [{"site": "local", "gpus": 2}]},
        **spec,
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    out: dict[str, list[str]] = {}
    for p in preflight.problems(load_job(tmp_path / "job.yaml")):
        out.setdefault(p.field, []).append(p.message)
    return out


def test_the_torch_trainer_and_embedded_engine_run_a_moe(tmp_path: Path) -> None:
    assert problems(tmp_path, "qwen3moe-dense1-hd32", trainer={"backend": "torch"}) == {}


def test_the_megatron_backend_is_refused_for_a_moe_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "qwen3moe-dense1-hd32" / "config.json"
    said = [
        f"'megatron' cannot run the model of {config}: a Qwen3MoE's experts (rlctl builds megatron-core's dense "
        "GPTModel only); use trainer.backend 'torch'"
    ]
    assert problems(tmp_path, "qwen3moe-dense1-hd32", trainer={"backend": "megatron"})["trainer.backend"] == said
    assert "trainer.backend" not in problems(tmp_path, "qwen3-tied-hd32", trainer={"backend": "megatron"})


def test_vllm_runs_a_moe_and_a_compiled_embedded_step_is_refused_for_it(tmp_path: Path) -> None:
    config = tmp_path / "qwen3moe-dense1-hd32" / "config.json"
    vllm = problems(tmp_path, "qwen3moe-dense1-hd32", rollout={"engine": "vllm"}).get("rollout.engine", [])
    assert not [p for p in vllm if "cannot run the model" in p]  # (tests/vllm: its pushes decode as transformers)
    compiled = problems(tmp_path, "qwen3moe-dense1-hd32", rollout={"engine": "embedded", "compile": True})
    assert compiled == {
        "rollout.compile": [
            f"true: the model of {config} is a Qwen3MoE, whose expert routing the embedded engine's compiled step "
            "cannot hold; leave it false"
        ]
    }
    assert problems(tmp_path, "qwen3-tied-hd32", rollout={"engine": "embedded", "compile": True}) == {}


def test_the_megatron_model_and_a_compiled_engine_refuse_a_moe_themselves(tmp_path: Path) -> None:
    """What `rlctl check` refuses, the parts refuse too (a job run without it): megatron's model config, and the
    embedded engine asked to compile its step."""
    from rlctl.engines import EmbeddedEngine
    from rlctl.models.tinygpt import TinyGPT
    from rlctl.trainers.megatron.model import transformer_config

    write_checkpoint("qwen3moe-dense1-hd32", tmp_path)
    model = TinyGPT.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"^a Qwen3MoE's experts \(rlctl builds megatron-core's dense GPTModel"):
        transformer_config(model.config)
    with pytest.raises(ValueError, match=r"^compile_step: a Qwen3MoE's expert routing is not one graph"):
        EmbeddedEngine(model, compile_step=True)


def test_a_qwen2_moe_runs_where_a_qwen3_moe_does_and_is_refused_where_it_is(tmp_path: Path) -> None:
    """A Qwen2MoE (a shared expert beside the routed ones): the torch trainer, the embedded engine and vLLM run it; the
    megatron backend and the compiled embedded step are refused naming it, versus the architecture refused outright."""
    config = tmp_path / "qwen2moe-dense1" / "config.json"
    assert problems(tmp_path, "qwen2moe-dense1", trainer={"backend": "torch"}) == {}
    vllm = problems(tmp_path, "qwen2moe-dense1", rollout={"engine": "vllm"}).get("rollout.engine", [])
    assert not [p for p in vllm if "cannot run the model" in p]
    megatron = problems(tmp_path, "qwen2moe-dense1", trainer={"backend": "megatron"})["trainer.backend"]
    assert f"'megatron' cannot run the model of {config}: a Qwen2MoE's experts (rlctl builds" in megatron[0]
    compiled = problems(tmp_path, "qwen2moe-dense1", rollout={"engine": "embedded", "compile": True})
    assert compiled["rollout.compile"][0].startswith(f"true: the model of {config} is a Qwen2MoE, whose expert routing")


def test_vllm_is_refused_a_qwen2_moe_whose_head_dim_it_would_not_read(tmp_path: Path) -> None:
    """vLLM's Qwen2MoeAttention takes hidden_size / num_attention_heads as its head size, whatever head_dim says
    (transformers' reads it): a Qwen2MoE with another head_dim is refused for the vllm engine in one line."""
    from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig

    write_checkpoint("qwen2moe-dense1", tmp_path / "m")
    config = tmp_path / "m" / "config.json"
    TinyGPT(TinyGPTConfig.from_hf(json.loads(config.read_text()) | {"head_dim": 64})).save_pretrained(tmp_path / "m")
    got = problems(tmp_path, "m", rollout={"engine": "vllm"})["rollout.engine"]
    assert [p for p in got if "cannot run the model" in p] == [
        f"'vllm' cannot run the model of {config}: Qwen2MoE with head_dim 64: vLLM's Qwen2MoeForCausalLM reads none "
        "(hidden_size / num_attention_heads, 32), so it would build another attention than the one trained; use engine "
        "'embedded' for this model"
    ]
