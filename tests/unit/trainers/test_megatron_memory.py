"""What a `megatron` rank holds while it reads a checkpoint (one gloo rank on CPU), at a job's start and on resume:
its own parameters and one HF tensor at a time, read from the checkpoint's file as its parameter is loaded (the
peak of the process's resident memory over the read, Linux's VmHWM: 1.9 MiB here), versus the whole model: at the
start a state dict of it (18 MiB here, the model's bytes; 70B in fp32: 280 GB on every rank of a node), on resume
that and a TinyGPT built from it (18 MiB here; 1.8 × a 165 MiB model; 70B in fp32: ≈ 560 GB on every rank)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlctl.checkpoint.trainer import load_trainer
from rlctl.models.tinygpt import TinyGPT
from rlctl.models.weightfiles import load_state_dict
from rlctl.trainers.base import load_backend
from tests.unit.resident import peak_resident_mib, reset_peak, resident_mib, trained_checkpoint
from tests.unit.tiny_models import small_config

pytestmark = pytest.mark.usefixtures("megatron_rank")


def test_a_resumed_rank_reads_the_checkpoints_policy_one_tensor_at_a_time(tmp_path: Path) -> None:
    model_mib, one = trained_checkpoint(tmp_path, "megatron")

    resumed = load_backend("megatron", tmp_path / "start")
    opt = torch.optim.AdamW(resumed.model.parameters())
    reset_peak()
    before = resident_mib()
    load_trainer(tmp_path / "iter-1", model=resumed, optimizers={"policy": opt}, split=one,
                 data_parallel=resumed.data_parallel(), version=1)  # fmt: skip
    rise = peak_resident_mib() - before
    assert rise < model_mib / 4, f"the read's peak rose {rise:.1f} MiB for a model of {model_mib:.1f} MiB"
    saved = load_state_dict(tmp_path / "iter-1" / "model")
    assert all(torch.equal(resumed.weights()[k], v) for k, v in saved.items())


def test_a_rank_reads_its_starting_model_one_tensor_at_a_time(tmp_path: Path) -> None:
    cfg = small_config(hidden=256, layers=8, heads=4, positions=64)
    torch.manual_seed(0)
    TinyGPT(cfg).save_pretrained(tmp_path / "model")
    model_mib = sum(t.numel() * 4 for t in load_state_dict(tmp_path / "model").values()) / 2**20
    load_backend("megatron", tmp_path / "model")  # a first build: what is made once (imports, allocator arenas)
    reset_peak()
    backend = load_backend("megatron", tmp_path / "model")
    rise = peak_resident_mib() - resident_mib()  # over what it holds after: the read's and the build's transients
    assert rise < model_mib / 4, (
        f"the start's peak rose {rise:.1f} MiB over what it holds, a model of {model_mib:.1f} MiB"
    )
    saved = load_state_dict(tmp_path / "model")
    assert all(torch.equal(backend.weights()[k], v) for k, v in saved.items())
