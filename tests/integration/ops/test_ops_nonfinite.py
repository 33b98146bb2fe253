"""A launched job whose trainer meets NaN gradients (`trainer.skip_nonfinite`): a step whose gradient norm is not
finite is skipped — the weights stay finite, the metrics row and an event say so, the job goes on — and more such
steps in a row than the job takes fail it, naming them.

The NaN is put into the real trainer by a `sitecustomize` on its PYTHONPATH (the launcher passes its environment to
local agents): before the optimizer steps 2, 5 and 6 one parameter's gradient is filled with NaN."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from safetensors.torch import load_file

from .conftest import events, hf_job, hooked, launched, metrics_rows

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SITECUSTOMIZE = """
import json, os

if json.loads(os.environ.get("RLCTL_PARALLEL") or "{}").get("role") == "trainer":
    from rlctl.rl import learner

    _apply = learner.StreamingLearner.apply_step

    def nan_gradients_at_some_steps(self, step):
        if self.steps in (2, 5, 6):
            next(p for p in self.model.parameters() if p.grad is not None).grad.fill_(float("nan"))
        return _apply(self, step)

    learner.StreamingLearner.apply_step = nan_gradients_at_some_steps
"""


def test_nan_gradients_are_skipped_and_too_many_in_a_row_fail_the_job(tmp_path):
    job_dir = tmp_path / "run"
    job = hf_job(tmp_path, job_dir=job_dir, iterations=10, every=3)
    (tmp_path / "hold").unlink()  # the reward never holds this run
    spec = yaml.safe_load(job.read_text())
    spec["trainer"] = {"skip_nonfinite": 1}
    job.write_text(yaml.safe_dump(spec))
    proc = launched(job, job_dir, hooked(tmp_path, SITECUSTOMIZE), 280)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    why = (
        "the trainer's gradient norm was NaN or infinite at 2 steps in a row (iterations 5–6), more than "
        "trainer.skip_nonfinite (1) allows; those steps were skipped, so the weights are still those of v5"
    )
    assert why in proc.stderr, proc.stderr[-3000:]
    summary = json.loads((job_dir / "summary.json").read_text())
    assert summary["state"] == f"failed: {why}" and summary["iterations"] == 7

    rows = metrics_rows(job_dir)
    assert [r["iteration"] for r in rows if r.get("step_skipped")] == [2, 5, 6]
    assert all(r["grad_norm"] is None for r in rows if r.get("step_skipped"))
    assert all(isinstance(r["grad_norm"], float) for r in rows if not r.get("step_skipped"))
    skipped = [e for e in events(job_dir) if e["event"] == "step_skipped"]
    assert [(e["iteration"], e["in_a_row"]) for e in skipped] == [(2, 1), (5, 1), (6, 2)]

    # the checkpoint after a skipped step (v3, taken past step 2) holds finite weights, as does v6
    for version in (3, 6):
        tensors = load_file(next((job_dir / "checkpoints" / f"iter-{version}").rglob("*.safetensors")))
        assert tensors and all(torch.isfinite(t).all() for t in tensors.values()), version
    print(f"\n{why}")
