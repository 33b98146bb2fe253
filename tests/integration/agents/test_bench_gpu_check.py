"""`python -m bench gpu-check --quick --json`, the GPU check's reduced form on this CPU machine: every figure the
GPU machine reports is computed by the same functions (so the script does not rot between GPU machines), the
launched job trains every prompt once, and on Qwen2-0.5B's shape the sampler is a small share of a CPU step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, bench_json

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def test_gpu_check_quick_runs_every_piece_on_the_cpu():
    r = bench_json("gpu-check", timeout_s=840)
    assert "errors" not in r and "skipped" not in r, (r.get("errors"), r.get("skipped"))
    assert r["device"] == "cpu" and r["commit"] != "unknown"
    assert r["engine_vs_cpu"]["argmax_agreement"] == 1.0 and r["grpo_step_vs_cpu"]["min_update_cosine"] > 0.999
    assert set(r["archs_vs_cpu"]) == {"tiny-qwen3", "tiny-llama3", "tiny-phi3"}
    assert all(a["argmax_agreement"] == 1.0 for a in r["archs_vs_cpu"].values()), r["archs_vs_cpu"]
    assert set(r["engine_tok_s"]) == set(r["hf_generate_tok_s"]) == {"4", "8"}
    assert all(v > 0 for v in r["engine_tok_s"].values()) and r["train_tok_s"] > 0
    assert r["delta_encode_gb_s"] > 0 and 0 < r["delta_ratio"] < 0.05
    assert r["sampler_share"]["vocab"] == 151_936 and r["sampler_share"]["share"] <= 0.25
    assert r["host_bytes_per_model_byte"] > 0
    ops = r["engine_step_ops"]
    assert 0 < ops["fused"]["ops"] < ops["separate"]["ops"] and ops["commonest"]
    assert ops["separate"]["tok_s"] > 0 and ops["fused_over_separate_tok_s"] > 0
    mixed = r["engine_mixed"]
    assert mixed["tok_s"] > 0 and mixed["prefills"] > 1 and 0 < mixed["prefill_share"] < 1
    es = r["engine_syncs"]  # on the CPU nothing synchronises: the waves and the verdict run (bench/gpu_syncs.py)
    assert "failed" not in r and es["failures"] == [] and es["admissions"] >= 2 and es["compactions"] > 0
    ec = r["engine_compiled"]
    assert set(ec["tok_s"]) == {"4"} and ec["tok_s"]["4"] > 0 and ec["over_eager_step"] > 0 and ec["first_run_s"] > 0
    am = r["actmem"]  # the learner's saved bytes against the planner's saved_bytes, each cut (bench/gpu_actmem.py)
    assert set(am["cuts"]) == {"2x24", "4x24", "4x24+ckpt"} and am["failures"] == []
    assert all(0.9 < c["ratio"] <= 1.1 for c in am["cuts"].values()), am["cuts"]
    mg = r["megatron"]
    assert mg["min_update_cosine"] > 0.9 and mg["tensors"] > 0 and min(mg["train_tok_s"].values()) > 0
    tr = r["transport"]
    assert tr["cpus"] >= 1 and min(tr["untagged_gb_per_s"], tr["tagged_gb_per_s"], tr["encrypted_gb_per_s"]) > 0
    launch = r["launch"]
    assert launch["rc"] == 0, launch.get("stderr_tail")
    assert (launch["state"], launch["lost"], launch["duplicated"]) == ("done", 0, 0)
    assert set(launch["devices"].values()) == {"cpu"} and len(launch["devices"]) == 3
    assert r["gpu_tests"]["failed"] == r["gpu_tests"]["error"] == 0 and r["gpu_tests"]["skipped"] > 0


def test_make_gpu_check_writes_its_json_under_the_device_tools_out(tmp_path: Path) -> None:
    """Under the device tool (`$OUT`: what a command leaves there comes back, also when its limit kills it) the
    check's JSON is written to $OUT/gpu-check.json as it goes, within the Makefile's default budget; it was written
    to ./gpu-check.json at the end only, which a killed run never reached."""
    env = {k: v for k, v in os.environ.items() if k != "RLCTL_GPU_CHECK_OUT"}
    env |= {"OUT": str(tmp_path), "RLCTL_GPU_CHECK_ONLY": "none"}  # the checkpoint's build alone
    argv = [
        "make",
        "-s",
        "--no-print-directory",
        "gpu-check",
        f"GPU_PY={sys.executable}",
        "GPU_DEPS=",
        "GPU_PIECE_DEPS=",
    ]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = json.loads((tmp_path / "gpu-check.json").read_text())
    assert written["budget_s"] == 450 and written["build_s"] > 0 and "running" not in written
    assert written["skipped_why"]["engine"] == "not in RLCTL_GPU_CHECK_ONLY"
    assert json.loads(proc.stdout)["build_s"] == written["build_s"]
