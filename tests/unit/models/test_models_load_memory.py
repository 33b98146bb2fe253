"""What `TinyGPT.from_pretrained` (the embedded engine's, the torch trainer's, the held-out evaluation's and the
profiler's load) holds while it reads a checkpoint: the model and one tensor at a time, each read from its file as it
is copied into its parameter (the peak of the process's resident memory over the load, Linux's VmHWM), versus a state
dict of the whole model read first and copied into the model after."""

from __future__ import annotations

import ctypes
import dataclasses
import gc
from pathlib import Path

import pytest
import torch

from rlctl.models import hf, weightfiles
from rlctl.models.tensors import ModelTensors
from rlctl.models.tinygpt import TinyGPT
from tests.unit.resident import peak_resident_mib, reset_peak, resident_mib
from tests.unit.tiny_models import small_config


@pytest.mark.parametrize(
    ("architecture", "dtype"),
    [(hf.LLAMA, torch.float32), (hf.PHI3, torch.bfloat16)],  # a Phi3's file: fused qkv_proj and gate_up_proj
)
def test_from_pretrained_holds_the_model_and_one_tensor(tmp_path: Path, architecture: str, dtype: torch.dtype) -> None:
    # 8 layers of 384: 41 MiB of fp32 weights (20 MiB in bf16), none of its tensors over 2.3 MiB (fp32)
    cfg = dataclasses.replace(small_config(hidden=384, layers=8, heads=4, positions=64), architecture=architecture)
    torch.manual_seed(0)
    d = TinyGPT(cfg).save_pretrained(tmp_path / "start", dtype=dtype)  # loaded in its own dtype below
    saved = weightfiles.load_state_dict(d, to_fp32=False)
    model_mib = sum(t.numel() * t.element_size() for t in saved.values()) / 2**20
    del saved
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # the memory the steps above freed back to the system: not reused below
    reset_peak()
    before = resident_mib()
    model = TinyGPT.from_pretrained(d, dtype=None)
    rise = peak_resident_mib() - before
    # measured: fp32 +42 MiB for 41 (+82 read whole first), a bf16 Phi3 +25…29 MiB for 20 (+62: its state dict in fp32)
    assert rise < 1.5 * model_mib, f"the load's peak rose {rise:.1f} MiB for a model of {model_mib:.1f} MiB"
    want = TinyGPT(model.config).to(dtype)
    want.load_weights(ModelTensors(weightfiles.load_state_dict(d), model.config))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), want.state_dict().values(), strict=True))
