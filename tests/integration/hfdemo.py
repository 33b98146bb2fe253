"""The HF demo's checkpoint and data for a test job: built by the shipped builder, untrained (no SFT warm-up),
into the test's directory (nothing can be downloaded on these machines)."""

from __future__ import annotations

import atexit
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]


# (shape, rows) → the builder's output, made once by this test process (the builder is seeded: each build the same
# bytes) and copied into each test's directory, versus a build (a Python process importing torch) per test
_BUILT: dict[tuple[str, int], Path] = {}


def build_hf_demo(out: Path, *, rows: int = 64, shape: str = "tiny") -> None:
    """`out`/model (a Qwen2-architecture checkpoint, or the builder's other `shape`) and `out`/data.jsonl (`rows`
    rows)."""
    built = _BUILT.get((shape, rows))
    if built is None:
        built = Path(tempfile.mkdtemp(prefix="rlctl-test-hfdemo-"))
        atexit.register(shutil.rmtree, built, ignore_errors=True)
        builder = [sys.executable, str(REPO / "jobs/hf-demo/build.py"), "--out", str(built), f"--shape={shape}"]
        build = subprocess.run(
            [*builder, "--sft-steps=0", f"--rows={rows}"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert build.returncode == 0, build.stderr
        _BUILT[(shape, rows)] = built
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(built / "model", out / "model", dirs_exist_ok=True)
    shutil.copy2(built / "data.jsonl", out / "data.jsonl")


def hf_demo_job(out: Path, *, reward: str | None = None, shape: str = "tiny", **fields: Any) -> Path:
    """`out`/job.yaml: the shipped hf-demo job on this machine's local site, on the demo's inputs built into `out`
    (untrained), with the reward function `reward` (source of a `compute_score`, written beside it) and the job's
    top-level `fields` replaced."""
    build_hf_demo(out, shape=shape)
    job = yaml.safe_load((REPO / "jobs/hf-demo.yaml").read_text())
    job.update(inventory=[str(REPO / "clusters/local.yaml")], model={"kind": "hf", "path": "model"}, tracking=[])
    job["task"]["path"] = "data.jsonl"
    if reward is not None:
        (out / "reward.py").write_text(reward)
        job["task"]["reward"] = "reward.py:compute_score"
    job.update(fields)
    path = out / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def check_and_launch(job: Path, run: Path, *, timeout_s: float = 540) -> dict[str, Any]:
    """`rlctl check JOB` (it must pass), then `rlctl launch JOB --job-dir RUN -o json`: its summary."""
    check = subprocess.run([sys.executable, "-m", "rlctl", "check", str(job)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "rlctl", "launch", str(job), "--job-dir", str(run), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary: dict[str, Any] = json.loads(proc.stdout)
    return summary
