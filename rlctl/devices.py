"""Device policy: where an agent computes and in which dtypes (DESIGN §6).

    site's gpu ≠ CPU ──launcher──▶ RLCTL_DEVICE=cuda ──▶ cuda:0 of the agent's CUDA_VISIBLE_DEVICES (its slice,
                                                         or the GPUs SLURM bound); no CUDA device visible ──▶
                                                         DeviceError at start, one line: host, CUDA_VISIBLE_DEVICES,
                                                         torch's version and build. Never a silent CPU run.
        a SLURM task that sees more than its own GPUs (`gpu_request: gres` gives every task of a node all the
        node's): the SLURM_LOCALID-th group of RLCTL_TASK_GPUS (the launcher's GPUs per task), not cuda:0
    gpu: CPU         ──launcher──▶ RLCTL_DEVICE=cpu  ──▶ cpu (unset: cpu — in-process jobs and tests)

    what                          on CUDA                               on a CPU
    rollout engine weights        the checkpoint's dtype (bf16, fp16…)  fp32 (CPUs are slow in bf16)
    trainer master weights, AdamW fp32                                  fp32
    trainer compute               bf16 (autocast; FSDP2: bf16 params,   fp32
                                  fp32 gradient reduction)
    published versions, the wire  the checkpoint's dtype                the checkpoint's dtype

So the planner's weight bytes (parameters × the checkpoint's bytes per parameter) are what crosses every link,
whatever device computes. Torch is imported only inside the functions that need it: `rlctl check` imports
this module too.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlctl.errors import RlctlError

if TYPE_CHECKING:
    import torch
    from torch.distributed.tensor import DTensor

ENV_DEVICE = "RLCTL_DEVICE"
ENV_VISIBLE = "CUDA_VISIBLE_DEVICES"
ENV_TASK_GPUS = "RLCTL_TASK_GPUS"  # a trainer whose ranks are a SLURM job's tasks: the GPUs of each task
KINDS = ("cpu", "cuda")


class DeviceError(RlctlError):
    """An agent placed on GPUs that cannot use them (one line: host, visible devices, torch's build)."""


def kind_for(gpu_name: str) -> str:
    """The device kind of an inventory site's agents: "cpu" for `gpu: CPU`, else "cuda"."""
    return "cpu" if gpu_name == "CPU" else "cuda"


def torch_build() -> str:
    """torch's version and what it was built for: "2.13.0+cpu (no CUDA)", "2.11.0+cu130 (CUDA 13.0)"."""
    import torch

    cuda = torch.version.cuda
    return f"{torch.__version__} ({'CUDA ' + cuda if cuda else 'no CUDA'})"


def cuda_problem() -> str | None:
    """Why this process cannot compute on a CUDA device (None: it can): no CUDA build, no driver, no device."""
    import torch

    if torch.version.cuda is None:
        return f"torch {torch_build()} is a CPU build"
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return f"torch {torch_build()} sees no CUDA device (driver missing or no GPU visible)"
    return None


@dataclass(frozen=True)
class Compute:
    """Where one agent computes: its device and the dtypes of the table above."""

    device: torch.device
    engine_dtype: torch.dtype | None  # None: the checkpoint's own
    autocast_dtype: torch.dtype | None  # the trainer's compute dtype when not fp32 (None: fp32)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


def compute_for(kind: str) -> Compute:
    """The Compute of an agent of device kind `kind`; DeviceError when it is "cuda" and CUDA is not usable here."""
    import torch

    if kind not in KINDS:
        raise DeviceError(f"{ENV_DEVICE}={kind!r}: expected one of {', '.join(KINDS)}")
    if kind == "cpu":
        return Compute(torch.device("cpu"), torch.float32, None)
    problem = cuda_problem()
    if problem is not None:
        raise DeviceError(
            f"{socket.gethostname()}: this agent's site declares GPUs ({ENV_VISIBLE}="
            f"{os.environ.get(ENV_VISIBLE, '(unset)')}) but {problem}",
            hint="install a CUDA build of torch on the site (pip install torch from download.pytorch.org/whl/cu12x), "
            "check the driver with nvidia-smi, or declare the site `gpu: CPU`",
        )
    index = first_device(torch.cuda.device_count())
    torch.cuda.set_device(index)
    return Compute(torch.device("cuda", index), None, torch.bfloat16)


def first_device(visible: int, env: Mapping[str, str] = os.environ) -> int:
    """The first of this agent's CUDA devices among the `visible` ones. 0 where only its own are visible (a local
    or SSH agent's slice, SLURM's per-task binding). A SLURM task that sees more (`--gres=gpu:N` hands every task
    of a node all N, and a plain srun binds none): its SLURM_LOCALID-th group of RLCTL_TASK_GPUS — else every rank
    of the node would compute on the first GPU."""
    per_task = int(env.get(ENV_TASK_GPUS) or 0)
    if not per_task or visible <= per_task:
        return 0
    local = int(env.get("SLURM_LOCALID") or 0)
    index = local * per_task
    if index + per_task > visible:
        raise DeviceError(
            f"{socket.gethostname()}: SLURM task {local} of {per_task} GPU(s) each needs devices {index}…"
            f"{index + per_task - 1}, but {visible} are visible ({ENV_VISIBLE}={env.get(ENV_VISIBLE, '(unset)')})",
            hint="check the site's scheduler.gpu_request and how the cluster binds GPUs to tasks",
        )
    return index


def sync(device: torch.device) -> None:
    """Wait until `device` has run what was queued on it: CUDA kernels run after the call that launched them
    returns, so a clock read right after a pass stops before the pass has run. Nothing to wait for on a CPU."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def agent_compute() -> Compute:
    """This agent's Compute, from the launcher's RLCTL_DEVICE (unset: the CPU)."""
    return compute_for(os.environ.get(ENV_DEVICE, "cpu"))


def as_dtensor(t: Any) -> DTensor | None:
    """`t` when it is a DTensor (FSDP2's sharded parameters and optimizer state), else None — without importing
    torch.distributed.tensor (≈ 1 s of every agent's start on 2 cores; a rollout unit and an unsharded trainer
    never hold one): nothing is an instance of it before that module is loaded."""
    mod = sys.modules.get("torch.distributed.tensor")
    return t if mod is not None and isinstance(t, mod.DTensor) else None
