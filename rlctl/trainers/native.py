"""The `torch` trainer backend: TinyGPT (the embedded engine's own model), a whole replica on every rank."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path

import torch

from rlctl.models.tinygpt import TinyGPT
from rlctl.trainers.base import TrainerBackend


class TorchBackend(TrainerBackend):
    def __init__(self, model: TinyGPT) -> None:
        self.model: TinyGPT = model

    @classmethod
    def load(cls, model_dir: Path) -> TorchBackend:
        return cls(TinyGPT.from_pretrained(model_dir))

    def critic_trunk(self) -> TinyGPT:
        """A copy of the policy (its `hidden` is the trunk; its lm_head is not used)."""
        return copy.deepcopy(self.model)

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state_dict)

    def save_pretrained(self, directory: str | Path, *, tokenizer_from: str | Path | None = None) -> Path:
        return self.model.save_pretrained(directory, tokenizer_from=tokenizer_from)
