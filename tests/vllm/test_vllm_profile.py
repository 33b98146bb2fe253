"""`rlctl profile --source measured --engine vllm` for real: the probe starts vLLM on a tiny Qwen2
checkpoint, measures PTL(BS) and prefill, and the profile names the engine so `rlctl plan` of a vLLM
job takes that curve (and refuses it for an embedded-engine job). Structure and positivity only:
timings on a shared machine are for `tests/vllm/compare_ptl.py`, not for assertions."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import yaml

from rlctl.profiler.measure import LOCAL_BATCHES
from rlctl.profiler.profile import load_profile
from tests.conftest import ROOT, CliResult
from tests.unit.hf_checkpoints import write_checkpoint

Cli = Callable[..., CliResult]
VARIANT = "qwen2-tied-hd32"  # head size 32 (vLLM's CPU attention), 128 positions


def _job(tmp: Path, checkpoint: Path, engine: str) -> Path:
    job = {
        "apiVersion": "rlctl/v1",
        "kind": "Job",
        "name": f"prof-{engine}",
        "inventory": [str(ROOT / "clusters/local.yaml")],
        "model": {"kind": "hf", "path": str(checkpoint)},
        "task": {"kind": "lengths", "prompt_tokens": 32, "median_output_tokens": 20, "max_output_tokens": 60},
        "batch": {"prompts_per_iteration": 8, "samples_per_prompt": 4},
        "placement": {"trainer": {"site": "local", "gpus": 1}, "rollout": [{"site": "local", "gpus": 2}]},
        "rollout": {"engine": engine, "max_batch_size": 32},
    }
    path = tmp / f"{engine}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_measured_profile_of_vllm_and_the_plan_that_uses_it(cli: Cli, tmp_path: Path) -> None:
    checkpoint = tmp_path / VARIANT
    write_checkpoint(VARIANT, checkpoint)
    out = tmp_path / "profile.yaml"
    r = cli(
        "profile", "--cluster", str(ROOT / "clusters/local.yaml"), "--model", str(checkpoint),
        "--engine", "embedded", "--engine", "vllm", "--source", "measured", "-o", str(out),
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    prof = load_profile(out)
    assert prof.source == "measured" and prof.model.name == VARIANT
    site = prof.sites["local"]
    by_engine = {e.engine: e for e in site.generation}
    assert set(by_engine) == {"embedded", "vllm"}
    vllm, embedded = by_engine["vllm"], by_engine["embedded"]
    assert vllm.contexts == [16, 64]  # 160 does not fit the checkpoint's 128 positions
    assert vllm.batch_sizes == LOCAL_BATCHES
    assert all(math.isfinite(t) and t > 0 for row in vllm.ptl_s for t in row)
    assert vllm.padded_attention is False and vllm.compact_fraction is None  # paged, rows freed at once
    assert embedded.padded_attention is True
    assert vllm.kv_capacity_tokens > 0 and vllm.prefill_s_per_token >= 0
    (train,) = site.training
    assert (train.tp, train.pp) == (1, 1) and train.gpu_s_per_token > 0
    print(
        "\nPTL(BS) ms at context 16 "
        + " ".join(
            f"BS {bs}: embedded {e * 1e3:.2f} vLLM {v * 1e3:.2f};"
            for bs, e, v in zip(vllm.batch_sizes, embedded.ptl_s[0], vllm.ptl_s[0], strict=True)
        )
        + f"\ntraining (GRPO, rlctl's learner): {train.gpu_s_per_token * 1e6:.1f} µs per token"
    )

    r = cli("plan", str(_job(tmp_path, checkpoint, "vllm")), "--profile", str(out), "-o", "json")
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["profile_source"] == "measured" and plan["predicted"]["t_gen_s"] > 0

    vllm_only = tmp_path / "vllm-only.yaml"
    data = yaml.safe_load(out.read_text())
    data["sites"]["local"]["generation"] = [g for g in data["sites"]["local"]["generation"] if g["engine"] == "vllm"]
    vllm_only.write_text(yaml.safe_dump(data))
    r = cli("plan", str(_job(tmp_path, checkpoint, "embedded")), "--profile", str(vllm_only))
    assert r.exit_code == 2 and "measured with engine vllm; the job rolls out with 'embedded'" in r.stderr
