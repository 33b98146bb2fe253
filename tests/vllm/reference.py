"""What `transformers` generates on given weights: the reference the vLLM engine's outputs are held to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

EOS = (2, 3)  # the test checkpoints' end-of-sequence ids


def hf_with(directory: Path, sd: dict[str, torch.Tensor] | None) -> Any:
    """The checkpoint in `directory` as a `transformers` model (fp32), with weights `sd` when given."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    if sd is not None:
        model.load_state_dict(sd, strict=True)
    return model


@torch.no_grad()
def hf_greedy(model: Any, prompt: list[int], n: int, *, stop: tuple[int, ...] = EOS) -> list[int]:
    """Up to `n` greedy tokens after `prompt`, the first of `stop` included."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        if ids[-1] in stop:
            break
    return ids[len(prompt) :]
