"""`rlctl launch` of a job whose torch trainer shards its replica over two ranks with FSDP2 (`trainer.shard:
fsdp`, over gloo on this CPU machine: the code the GPU path runs over NCCL): the plan says so, both ranks build
the sharded model, every prompt is trained once, the units take the versions both ranks gathered, and each rank
checkpoints its own part of the policy and of AdamW's state beside the gathered HF model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from rlctl.models.hf import load_state_dict
from tests.integration.hfdemo import build_hf_demo

from .test_agents_megatron_job import LENGTH_REWARD

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]


def test_a_job_with_an_fsdp_sharded_trainer_runs_and_checkpoints_each_part(tmp_path: Path) -> None:
    build_hf_demo(tmp_path)
    job = yaml.safe_load((ROOT / "jobs/hf-demo.yaml").read_text())
    (tmp_path / "length.py").write_text(LENGTH_REWARD)
    job["task"].update(path="data.jsonl", reward="length.py:compute_score")
    job.update(
        inventory=[str(ROOT / "clusters/local.yaml")],
        model={"kind": "hf", "path": "model"},
        iterations=3,
        batch={"prompts_per_iteration": 4, "samples_per_prompt": 4},
        tracking=[],
        placement={"trainer": {"site": "local", "gpus": 2}, "rollout": [{"site": "local", "gpus": 1}]},
        trainer={"shard": "fsdp"},
        checkpoint={"every_iterations": 2},
        weight_sync={"mode": "delta"},
    )
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    check = subprocess.run([sys.executable, "-m", "rlctl", "check", str(tmp_path / "job.yaml")], capture_output=True)
    assert check.returncode == 0, check.stderr
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
    assert s["ledger"]["prompts"] == s["ledger"]["trained"] == 12
    assert (s["ledger"]["lost"], s["ledger"]["duplicated"]) == (0, 0)
    parallel = json.loads((run / "plan.json").read_text())["trainer"]["parallel"]
    assert parallel == {"tp": 1, "pp": 1, "dp": 2, "fsdp": True}
    for rank in (0, 1):
        log = next(run.glob(f"**/trainer-{rank}*.log")).read_text()
        assert "trainer backend torch, tp 1 pp 1 fsdp" in log, log[:2000]
    versions = json.loads((run / "summary.json").read_text())["weights"]["versions"]
    assert len(versions) == 3 and versions[0]["encodings"] == {"full": 1}
    start = load_state_dict(tmp_path / "model")
    for it in (2, 3):
        ckpt = run / "checkpoints" / f"iter-{it}"
        ranks = sorted(p.name for p in (ckpt / "ranks").glob("rank-*.pt"))
        assert ranks == ["rank-0.pt", "rank-1.pt"]  # every rank wrote its own part
        halves = [torch.load(ckpt / "ranks" / name, weights_only=True)["module.policy"] for name in ranks]
        gathered = load_state_dict(ckpt / "model")  # the HF directory: the weights both ranks gathered
        for name, full in gathered.items():  # (fp32: the demo's checkpoint dtype)
            assert torch.equal(torch.cat([h[name] for h in halves]), full), name
        assert not torch.equal(gathered["model.norm.weight"], start["model.norm.weight"])  # it trained
