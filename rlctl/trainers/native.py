"""The `torch` trainer backend: TinyGPT (the embedded engine's own model), a full replica on every rank."""

from __future__ import annotations

from pathlib import Path

import torch

from rlctl.engines.model import TinyGPT
from rlctl.trainers.base import TrainerBackend


class TorchBackend(TrainerBackend):
    def __init__(self, model: TinyGPT) -> None:
        self.model: TinyGPT = model

    @classmethod
    def load(cls, model_dir: Path, *, tp: int = 1, pp: int = 1) -> TorchBackend:
        if (tp, pp) != (1, 1):
            raise ValueError(f"trainer backend 'torch' keeps a whole model per rank: tp {tp} pp {pp} needs megatron")
        return cls(TinyGPT.from_pretrained(model_dir))

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def save_pretrained(self, directory: str | Path, *, tokenizer_from: str | Path | None = None) -> Path:
        return self.model.save_pretrained(directory, tokenizer_from=tokenizer_from)
