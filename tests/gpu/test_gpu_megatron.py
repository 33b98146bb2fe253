"""The megatron trainer backend on CUDA (tp 1 × pp 1): fp32 parameters on the device, bf16 autocast, one GRPO step
that moves the weights as the torch backend's step on the same device does (`bench/gpu_megatron.py`, in a
process of its own: it forms a one-rank NCCL group and megatron's parallel state)."""

import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu_pieces import last_json

REPO = Path(__file__).resolve().parents[2]


def test_a_megatron_grpo_step_on_cuda_moves_the_weights_as_the_torch_backend_does(checkpoint: Path) -> None:
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (make gpu-wheels carries it)")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu_megatron", str(checkpoint), "cuda"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        check=False,
    )
    r = last_json(proc.stdout)
    assert r is not None, f"exited {proc.returncode} with no result: {proc.stderr[-3000:]}"
    # per tensor but k_proj's bias (its gradient is at bf16's noise: tests/gpu/test_gpu_trainer.py)
    assert r["min_update_cosine"] > 0.95 and r["tensors"] > 0, r
    assert min(r["train_tok_s"].values()) > 0, r
    # the step was right; the process must also end cleanly (its NCCL group's teardown)
    assert proc.returncode == 0, f"the result was printed, then it exited {proc.returncode}: {proc.stderr[-3000:]}"
