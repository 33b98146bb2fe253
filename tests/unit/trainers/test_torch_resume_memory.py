"""What a `torch` rank (a whole replica, not sharded) holds while it reads a checkpoint's policy on resume: its own
parameters and one HF tensor at a time, each read from the checkpoint's file as it is copied into its parameter
(the peak of the process's resident memory over the read, Linux's VmHWM), versus a state dict of the whole model
that torch's `load_state_dict` makes of the lazy tensors first."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlctl.checkpoint.trainer import load_trainer
from rlctl.models.weightfiles import load_state_dict
from rlctl.trainers.base import load_backend
from tests.unit.resident import peak_resident_mib, reset_peak, resident_mib, trained_checkpoint


@pytest.mark.parametrize("into", ["backend", "tinygpt"])
def test_a_resumed_rank_reads_the_checkpoints_policy_one_tensor_at_a_time(tmp_path: Path, into: str) -> None:
    model_mib, one = trained_checkpoint(tmp_path, "torch")

    resumed = load_backend("torch", tmp_path / "start")
    opt = torch.optim.AdamW(resumed.model.parameters())
    reset_peak()
    before = resident_mib()
    load_trainer(tmp_path / "iter-1", model=resumed if into == "backend" else resumed.model, optimizers={"policy": opt},
                 split=one, data_parallel=resumed.data_parallel(), version=1)  # fmt: skip
    rise = peak_resident_mib() - before
    assert rise < model_mib / 4, f"the read's peak rose {rise:.1f} MiB for a model of {model_mib:.1f} MiB"
    saved = load_state_dict(tmp_path / "iter-1" / "model")
    assert all(torch.equal(resumed.weights()[k], v) for k, v in saved.items())
