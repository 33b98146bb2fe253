"""The `torch` trainer backend: TinyGPT (the embedded engine's own model), a whole replica on every rank.

On a CUDA device the parameters and AdamW state stay fp32 (master weights) and the passes compute in bf16 under
autocast (`rlctl.devices`); on a CPU everything is fp32. Gradients are summed over the trainer's process group:
NCCL for CUDA tensors, gloo on CPUs (`rlctl.agents.trainer.init_group`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path

import torch

from rlctl.devices import Compute
from rlctl.models.tinygpt import TinyGPT
from rlctl.trainers.base import TrainerBackend


class TorchBackend(TrainerBackend):
    def __init__(self, model: TinyGPT) -> None:
        self.model: TinyGPT = model

    @classmethod
    def load(cls, model_dir: Path, *, compute: Compute | None = None) -> TorchBackend:
        """The checkpoint in fp32 on `compute`'s device (default: the CPU), computing in its autocast dtype."""
        device = torch.device("cpu") if compute is None else compute.device
        model = TinyGPT.from_pretrained(model_dir, dtype=torch.float32, device=device)
        model.autocast_dtype = None if compute is None else compute.autocast_dtype
        return cls(model)

    def critic_trunk(self) -> TinyGPT:
        """A copy of the policy (its `hidden` is the trunk; its lm_head is not used)."""
        return copy.deepcopy(self.model)

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.model.load_weights(state_dict)

    def save_pretrained(self, directory: str | Path, *, tokenizer_from: str | Path | None = None) -> Path:
        return self.model.save_pretrained(directory, tokenizer_from=tokenizer_from)
