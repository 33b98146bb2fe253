"""`rlctl plan` refuses a job whose longest prompt plus output exceeds its model's context, in the line `rlctl check`
says (`rlctl.planner.context`): a built-in's by its config.json's max_position_embeddings, a `kind: arch` model's by
its max_positions (unchecked without), an HF checkpoint's by its config.json (tests/unit/ops/test_preflight.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rlctl.config import load_job
from rlctl.models.catalog import BUILTIN_MODELS
from rlctl.models.hf import TinyGPTConfig
from rlctl.ops.preflight import problems
from tests.conftest import ROOT, run_cli
from tests.unit.ops.test_preflight import hf_dataset_job
from tests.unit.planner.test_planner_tp_rules import PHI4_LIKE


def _job(tmp: Path, model: dict[str, Any], **task: Any) -> Path:
    job = yaml.safe_load((ROOT / "jobs/cross-dc-7b.yaml").read_text())
    job["inventory"] = [str(ROOT / "jobs" / p) for p in job["inventory"]]
    job["model"] = model
    job["task"] = {**job["task"], **task}
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _refused(res: Any) -> str:
    assert res.exit_code == 2, (res.exit_code, res.stdout[-500:], res.stderr)
    (line,) = res.stderr.splitlines()
    return str(line)


def test_a_lengths_task_past_phi4s_context_is_refused_in_one_line(tmp_path: Path) -> None:
    path = _job(tmp_path, {"kind": "builtin", "name": "phi4-14b"}, prompt_tokens=512, max_output_tokens=20000)
    assert _refused(run_cli("plan", str(path))) == (
        f"rlctl: error: {path}: task.max_output_tokens: 512 prompt + 20000 output tokens exceed model "
        "max_position_embeddings 16384 (built-in 'phi4-14b'); use prompt_tokens + max_output_tokens ≤ 16384"
    )
    # check says the same, once (its own line and the planner's are one)
    said = [p for p in problems(load_job(path)) if p.field == "task.max_output_tokens"]
    assert [f"rlctl: error: {path}: {p.field}: {p.message}" for p in said] == [_refused(run_cli("plan", str(path)))]
    at_the_limit = _job(tmp_path, {"kind": "builtin", "name": "phi4-14b"}, prompt_tokens=512, max_output_tokens=15872)
    assert run_cli("plan", str(at_the_limit)).exit_code == 0


def test_an_arch_models_max_positions_is_checked_where_given(tmp_path: Path) -> None:
    path = _job(tmp_path, {**PHI4_LIKE, "max_positions": 16384}, max_output_tokens=20000)
    assert _refused(run_cli("plan", str(path))).endswith(
        "task.max_output_tokens: 512 prompt + 20000 output tokens exceed model max_position_embeddings 16384 (the "
        "job's model.max_positions); use prompt_tokens + max_output_tokens ≤ 16384"
    )
    unknown = _job(tmp_path, PHI4_LIKE, max_output_tokens=20000)  # no max_positions: not checked
    assert run_cli("plan", str(unknown)).exit_code == 0


def test_an_arch_models_max_positions_is_a_positive_count(tmp_path: Path) -> None:
    path = _job(tmp_path, {**PHI4_LIKE, "max_positions": 0})
    assert _refused(run_cli("plan", str(path))).endswith(": model.max_positions: Input should be greater than 0")


@pytest.mark.parametrize("name", sorted(BUILTIN_MODELS))
def test_every_built_in_knows_its_context(name: str) -> None:
    assert BUILTIN_MODELS[name].max_positions is not None


def test_the_demo_models_context_is_the_one_its_engine_holds() -> None:
    assert BUILTIN_MODELS["tiny-demo"].max_positions == TinyGPTConfig().max_position_embeddings


def test_an_hf_checkpoints_context_is_its_config_files(tmp_path: Path) -> None:
    """The reviewer's case: config.json's 4096 positions, a job asking 1024 + 4096 tokens, which check refused."""
    job = hf_dataset_job(tmp_path, positions=4096, task={"max_prompt_tokens": 1024, "max_output_tokens": 4096})
    line = _refused(run_cli("plan", str(job.path)))
    assert line == (
        f"rlctl: error: {job.path}: task.max_output_tokens: max_prompt_tokens 1024 + max_output_tokens 4096 = 5120 "
        f"tokens exceed model max_position_embeddings 4096 ({tmp_path / 'model'}/config.json); use max_prompt_tokens "
        "+ max_output_tokens ≤ 4096"
    )
    assert _refused(run_cli("check", str(job.path))) == line
