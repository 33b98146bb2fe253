"""The job's context (its longest prompt + output) is what the agents build their models and engines for, where the
checkpoint allows more (Mistral Nemo: 1,024,000 positions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rlctl.agents import rollout
from rlctl.agents.common import AgentContext, job_context
from rlctl.agents.rollout import RolloutAgent
from rlctl.agents.trainer import _backend
from rlctl.config.job import JobFile
from rlctl.launch.jobdir import JobDir
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.tasks import MAX_DIGITS
from tests.unit.tiny_models import small_config


def _job(task: dict[str, Any], *, engine: str = "embedded") -> JobFile:
    return JobFile.model_validate(
        {
            "apiVersion": "rlctl/v1",
            "kind": "Job",
            "name": "context",
            "inventory": ["x.yaml"],
            "model": {"kind": "builtin", "name": "tiny-demo"},
            "task": task,
            "batch": {"prompts_per_iteration": 2, "samples_per_prompt": 2, "train_micro_batch_samples": 2},
            "placement": {"trainer": {"site": "local", "gpus": 1}, "rollout": [{"site": "local", "gpus": 1}]},
            "rollout": {"engine": engine},
            "transport": {"kind": "inproc", "timeout_s": 10},
        }
    )


DIGITS = {"kind": "digits", "max_output_tokens": 16}
DIGITS_CONTEXT = (1 + MAX_DIGITS + 1) + 16  # BOS, the most digits, '='; the answer and EOS


def test_the_jobs_context_is_its_tasks_longest_prompt_plus_output() -> None:
    assert job_context(_job({"kind": "dataset", "path": "train.jsonl", "max_prompt_tokens": 300})) == 300 + 1024
    assert job_context(_job(DIGITS)) == DIGITS_CONTEXT
    # the digits task's answers stop at 9 letters a digit: its outputs, at fewer tokens than max_output_tokens
    longest_answer = 9 * MAX_DIGITS + 1
    assert job_context(_job({"kind": "digits", "max_output_tokens": 10**6})) == (1 + MAX_DIGITS + 1) + longest_answer


def test_the_trainers_policy_and_reference_hold_the_jobs_context(tmp_path: Path) -> None:
    """`_backend` builds the policy and the reference: RoPE tables of the job's context, versus every one of the
    checkpoint's 4096 positions."""
    TinyGPT(small_config(positions=4096)).save_pretrained(tmp_path)
    model = _backend(_job(DIGITS), tmp_path, where="job.json").model
    assert isinstance(model, TinyGPT)
    assert model.context == model.rope_cos.shape[0] == DIGITS_CONTEXT


@pytest.mark.parametrize("engine", ["embedded", "vllm"])
def test_the_rollout_units_engine_is_built_for_the_jobs_context(
    engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[dict[str, Any]] = []

    class Built(Exception):
        pass

    def make_engine(kind: str, model_dir: Path, **kw: Any) -> None:
        built.append(kw)
        raise Built

    monkeypatch.setattr(rollout, "make_engine", make_engine)
    job = _job(DIGITS, engine=engine)
    jd = JobDir.create("context", explicit=tmp_path / "job")
    jd.write_job(job, source="test")
    with pytest.raises(Built):
        RolloutAgent(AgentContext(jd, job, None, "inproc://context"), replica=0)  # type: ignore[arg-type]
    assert [kw["context"] for kw in built] == [DIGITS_CONTEXT]


def test_the_embedded_engine_built_for_the_jobs_context_holds_tables_of_it(tmp_path: Path) -> None:
    """(the engine the unit builds, `make_engine`: `context` reaches its model)"""
    from rlctl.engines import make_engine

    torch.manual_seed(0)
    TinyGPT(small_config(positions=4096)).save_pretrained(tmp_path)
    engine = make_engine("embedded", tmp_path, max_batch_size=2, temperature=1.0, seed=0, context=DIGITS_CONTEXT)
    assert engine.model.rope_cos.shape[0] == DIGITS_CONTEXT  # type: ignore[attr-defined]
