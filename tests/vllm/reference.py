"""What `transformers` generates on given weights: the reference the vLLM engine's outputs are held to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

EOS = (2, 3)  # the test checkpoints' end-of-sequence ids


def hf_with(directory: Path, sd: dict[str, torch.Tensor] | None) -> Any:
    """The checkpoint in `directory` as a `transformers` model (fp32), with weights `sd` (TinyGPT's names: a Phi3's
    q/k/v and gate/up apart, fused here as its file has them; a Qwen3MoE's experts apart, stacked here as its model
    holds them) when given."""
    from transformers import AutoModelForCausalLM

    from rlctl.models.hf import read_config
    from tests.unit.hf_checkpoints import as_transformers_holds

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    if sd is not None:
        model.load_state_dict(as_transformers_holds(sd, read_config(directory)), strict=True)
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


def worst_logprob_gap(hf: Any, prompts: list[list[int]], got: dict[str, Any], temperature: float) -> float:
    """The largest |engine − transformers| behaviour log-prob over the sampled tokens of results `got` (`t<i>` for
    prompt i): log_softmax(logits / T) of each, teacher-forced in `hf`; said on stdout."""
    worst = 0.0
    with torch.no_grad():
        for i, p in enumerate(prompts):
            r = got[f"t{i}"]
            seq = torch.tensor([p + r.output_tokens])
            logits = hf(seq).logits[0, len(p) - 1 : -1].float()
            want = torch.log_softmax(logits / temperature, -1).gather(1, seq[0, len(p) :, None])[:, 0]
            worst = max(worst, float((torch.tensor(r.logprobs) - want).abs().max()))
    print(f"\nmax |vLLM - transformers| log-prob at T={temperature}: {worst:.2e}")
    return worst
