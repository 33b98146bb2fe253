"""`trainer.lora` in a job file: bad values refused at load in one line naming the field, and `rlctl check`
refusing the choices its adapters do not run with (the megatron backend, PPO), one line each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rlctl.config import load_job
from rlctl.errors import ConfigError
from rlctl.ops.preflight import problems
from tests.conftest import run_cli
from tests.unit.ops.test_preflight import job_dict, load, only_line


def test_a_lora_job_passes_and_its_targets_are_read(tmp_path: Path) -> None:
    job = load(tmp_path, trainer={"lora": {"rank": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}})
    assert problems(job) == []
    lora = job.spec.trainer.lora
    assert lora is not None and lora.targets == ("q_proj", "v_proj") and lora.dropout == 0
    every = load(tmp_path, trainer={"lora": {"rank": 8, "alpha": 16}}).spec.trainer.lora
    assert every is not None and every.target_modules == "all-linear" and len(every.targets) == 7


@pytest.mark.parametrize(
    ("lora", "said"),
    [
        ({"rank": 8, "alpha": 16, "target_modules": ["q_prj"]}, "unknown projection 'q_prj'; valid: q_proj, k_proj, "
         "v_proj, o_proj, gate_proj, up_proj, down_proj, or 'all-linear' (did you mean 'q_proj'?)"),
        ({"rank": 8, "alpha": 16, "target_modules": "all"}, "'all': valid: 'all-linear', or a list of q_proj"),
        ({"rank": 8, "alpha": 16, "target_modules": []}, "empty; give some of q_proj"),
        ({"rank": 8, "alpha": 16, "target_modules": ["experts"]}, "unknown projection 'experts'"),
        ({"rank": 8, "alpha": 16, "dropout": 0.05}, "0.05: adapter dropout is not implemented; valid: 0"),
        ({"rank": 0, "alpha": 16}, "greater than 0"),
        ({"rank": 8}, "trainer.lora.alpha: required field is missing"),
        ({"rank": 8, "alpha": 16, "bias": "all"}, "trainer.lora.bias: unknown key; valid keys: alpha, dropout, rank"),
    ],
)  # fmt: skip
def test_bad_lora_values_are_one_line_naming_the_field(tmp_path: Path, lora: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(tmp_path, trainer={"lora": lora})
    line = str(e.value)
    assert "\n" not in line and "trainer.lora" in line and said in line, line


@pytest.mark.parametrize(
    ("over", "said"),
    [
        ({"trainer": {"backend": "megatron"}}, "LoRA is the 'torch' backend's; not built for 'megatron'"),
        ({"algorithm": {"kind": "ppo"}}, "PPO's critic on a LoRA policy is not built"),
    ],
)
def test_check_refuses_what_lora_does_not_run_with(tmp_path: Path, over: dict[str, Any], said: str) -> None:
    trainer = {**over.get("trainer", {}), "lora": {"rank": 4, "alpha": 8}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_dict(**{**over, "trainer": trainer})))
    assert [p.field for p in problems(load_job(path)) if said in p.message] == ["trainer.lora"]
    line = only_line(run_cli("check", str(path)))
    assert "trainer.lora" in line and said in line, line
