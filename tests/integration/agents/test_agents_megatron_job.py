"""`rlctl launch` of a job whose trainer is the Megatron-core backend: two trainer ranks (data parallel over
gloo, each a megatron GPTModel with tp = pp = 1) on the HF demo's Qwen2-architecture checkpoint, one rollout
unit with the embedded engine; the job finishes, every prompt is trained once, and the final checkpoint is an
HF directory whose weights the training moved."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlctl.trainers.base import megatron_available

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]

# the untrained model (no SFT warm-up) scores 0 on the demo's reward: this one differs within each group, so
# the advantages, and the updates, are not 0
LENGTH_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return len(solution_str.split()) % 3 / 2
"""


def test_a_job_with_the_megatron_trainer_backend_runs_end_to_end(tmp_path: Path) -> None:
    if (hint := megatron_available()) is not None:
        pytest.skip(f"megatron-core is not installed: {hint}")
    build = subprocess.run(
        [sys.executable, str(ROOT / "jobs/hf-demo/build.py"), "--out", str(tmp_path), "--sft-steps=0", "--rows=64"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert build.returncode == 0, build.stderr
    job = yaml.safe_load((ROOT / "jobs/hf-demo.yaml").read_text())
    job["inventory"] = [str(ROOT / "clusters/local.yaml")]
    job["model"]["path"] = "model"
    (tmp_path / "length.py").write_text(LENGTH_REWARD)
    job["task"].update(path="data.jsonl", reward="length.py:compute_score")
    job.update(iterations=3, batch={"prompts_per_iteration": 4, "samples_per_prompt": 4}, tracking=[])
    job["placement"] = {"trainer": {"site": "local", "gpus": 2}, "rollout": [{"site": "local", "gpus": 1}]}
    job["trainer"] = {"backend": "megatron"}
    job["weight_sync"] = {"mode": "delta"}  # the two ranks split each delta's encoding
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
    # both ranks built the Megatron model, data parallel
    for rank in (0, 1):
        log = next(run.glob(f"**/trainer-{rank}*.log")).read_text()
        assert '"dp": 2' in log and "trainer backend megatron, tp 1 pp 1" in log, log[:2000]
        assert "encoded by 2 ranks" in log, log[-2000:]
    # and the unit rebuilt and verified versions 2 and 3 from those deltas
    versions = json.loads((run / "summary.json").read_text())["weights"]["versions"]
    assert [v["encodings"] for v in versions] == [{"full": 1}, {"delta": 1}, {"delta": 1}]
    # the final checkpoint: an HF directory (Qwen2, tied embeddings) the training moved away from the start
    import torch

    from rlctl.engines.hf import load_state_dict

    final, start = load_state_dict(run / "checkpoints" / "iter-3" / "model"), load_state_dict(tmp_path / "model")
    assert json.loads((run / "checkpoints/iter-3/model/config.json").read_text())["architectures"] == [
        "Qwen2ForCausalLM"
    ]
    assert sorted(final) == sorted(start)
    assert not all(torch.equal(final[k], start[k]) for k in start)
