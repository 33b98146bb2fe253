"""The process's resident memory and its peak (Linux's VmRSS and VmHWM, the peak reset by `reset_peak`): what a
memory test reads around the step it measures."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def resident_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def peak_resident_mib() -> float:
    """The process's peak resident memory since `reset_peak` (VmHWM)."""
    line = next(s for s in Path("/proc/self/status").read_text().splitlines() if s.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to the resident memory now


def trained_checkpoint(tmp_path: Path, backend: str) -> tuple[float, Any]:
    """A `backend` rank's checkpoint `tmp_path/iter-1` of weights other than its start's (`tmp_path/start`: 8 layers
    of 256, 22 MB of fp32 weights, none of its tensors over 1 MB), and the MiB of its policy; the `ParallelConfig` it
    was saved at."""
    import torch

    from rlctl.checkpoint.trainer import save_trainer
    from rlctl.launch.agentenv import ParallelConfig
    from rlctl.models.tinygpt import TinyGPT
    from rlctl.models.weightfiles import load_state_dict
    from rlctl.trainers.base import load_backend
    from tests.unit.tiny_models import small_config

    torch.manual_seed(0)
    TinyGPT(small_config(hidden=256, layers=8, heads=4, positions=64)).save_pretrained(tmp_path / "start")
    trained = load_backend(backend, tmp_path / "start")
    with torch.no_grad():
        for p in trained.model.parameters():
            p.add_(1.0)  # weights other than the start's, which a resumed backend holds
    one, opt = ParallelConfig("trainer"), torch.optim.AdamW(trained.model.parameters())  # no step: no state to read
    save_trainer(tmp_path / "iter-1", model=trained, optimizers={"policy": opt}, counters={"version": 1}, split=one,
                 data_parallel=trained.data_parallel())  # fmt: skip
    saved = load_state_dict(tmp_path / "iter-1" / "model")
    return sum(t.numel() * 4 for t in saved.values()) / 2**20, one
