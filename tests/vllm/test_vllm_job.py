"""`rollout.engine: vllm` in a real job: `rlctl launch` (this virtualenv's python, so the agents run here too) of the HF
demo's Qwen2-architecture checkpoint (and its Qwen3MoE and Qwen2MoE ones) and dataset, with the rollout unit on vLLM —
weights pushed from the job's weight plane every iteration through vLLM's weight-transfer API without restarting the
engine, running requests keeping their K/V (`rollout.on_new_weights: keep`); every prompt trained once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlctl.agents.appliedlog import unit_rows

from .conftest import ROOT, skip_reason

pytestmark = [pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or ""), pytest.mark.timeout(600)]


@pytest.mark.parametrize("shape", ["tiny", "tiny-qwen3moe", "tiny-qwen2moe"])  # (the MoEs: experts pushed each time)
def test_a_job_with_the_vllm_engine_runs_end_to_end(tmp_path: Path, shape: str) -> None:
    build = [sys.executable, str(ROOT / "jobs/hf-demo/build.py"), "--out", str(tmp_path), "--sft-steps", "0"]
    build += ["--shape", shape]
    assert subprocess.run([*build, "--rows", "64"], capture_output=True, timeout=120).returncode == 0
    job = yaml.safe_load((ROOT / "jobs/hf-demo.yaml").read_text())
    job["inventory"] = [str(ROOT / "clusters/local.yaml")]
    job["model"]["path"] = "model"
    job["task"].update(path="data.jsonl", reward=str(ROOT / "jobs/hf-demo/reward.py") + ":compute_score")
    job["placement"]["rollout"] = [{"site": "local", "gpus": 1}]
    job["rollout"].update(engine="vllm", on_new_weights="keep")
    job.pop("tracking")
    job.update(iterations=3, batch={"prompts_per_iteration": 8, "samples_per_prompt": 4})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "rlctl", "launch", str(tmp_path / "job.yaml"), "--job-dir", str(run), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    assert s["state"] == "done" and s["iterations"] == 3
    assert s["ledger"]["prompts"] == s["ledger"]["trained"] == 24 and s["ledger"]["duplicated"] == 0
    events = unit_rows(json.loads(line) for line in (run / "events.jsonl").read_text().splitlines())
    applied = sorted(e["version"] for e in events if e["event"] == "weights_applied")
    assert applied[-1] == 3  # the last version reached the vLLM unit, pushed in place
    log = (run / "logs" / "rollout-0.log").read_text()
    assert "versions through vLLM's weight-transfer API via this process; on new weights: keep" in log
