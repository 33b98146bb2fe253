"""`rlctl check` of the hf-demo job on the hf-demo builder's windowed Mistral (`--shape tiny-mistral-window`: a
sliding_window that binds, as Mistral v0.1's 4096 of 32768 positions does): the window is the shipped job's context
exactly, which check passes, and a max_output_tokens one past it is refused in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from bench.gpu_check import hf_demo_builder
from rlctl.agents.common import job_context
from rlctl.config import load_job
from rlctl.models.hf import read_config
from tests.conftest import ROOT, run_cli

from .test_preflight import only_line


def hf_demo_job(out: Path, **task: Any) -> Path:
    """`out`/job.yaml: the shipped hf-demo job on this machine's local site, on the inputs built into `out`, its task's
    fields `task` replaced."""
    job = yaml.safe_load((ROOT / "jobs/hf-demo.yaml").read_text())
    job.update(inventory=[str(ROOT / "clusters/local.yaml")], model={"kind": "hf", "path": "model"}, tracking=[])
    reward = f"{ROOT / 'jobs/hf-demo/reward.py'}:compute_score"
    job["task"] = {**job["task"], "path": "data.jsonl", "reward": reward, **task}
    path = out / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_the_hf_demo_job_on_the_windowed_mistral_passes_check_at_its_window_and_not_a_token_past_it(
    tmp_path: Path,
) -> None:
    hf_demo_builder().build(tmp_path, rows=8, sft_steps=0, shape="tiny-mistral-window")
    config = read_config(tmp_path / "model")
    job = hf_demo_job(tmp_path)
    assert config.architecture == "MistralForCausalLM"
    assert config.binding_window == config.sliding_window == job_context(load_job(job).spec) == 32 + 64
    passed = run_cli("check", str(job))
    assert passed.exit_code == 0, passed.stderr
    longer = hf_demo_job(tmp_path, max_output_tokens=65)
    assert only_line(run_cli("check", str(longer))) == (
        f"rlctl: error: {longer}: task.max_output_tokens: {tmp_path / 'model'}/config.json: sliding_window 96 binds "
        "(below its max_position_embeddings 256: MistralModel attends to a position's last 96 tokens only, rlctl's "
        "models to all before it), and the job's context is max_prompt_tokens 32 + max_output_tokens 65 = 97 tokens; "
        "use max_prompt_tokens "
        "+ max_output_tokens ≤ 96, or a model whose sliding_window is null or at least its max_position_embeddings "
        "(Mistral v0.3 and later)"
    )
