"""A policy whose log-probs are chosen by the test: fixed logits over a 4-token vocabulary, so every
log-prob and importance ratio in a loss is a number the test can work out by hand."""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import nn

from rlctl.models.tinygpt import TinyGPT

P = [0.1, 0.2, 0.3, 0.4]  # the policy's probability of tokens 0..3, at every position


class FixedPolicy(nn.Module):
    """Logits that do not depend on the input: shape [V] (the same at every position) or [N, T, V]."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = nn.Parameter(logits.clone())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(tokens.shape[0], tokens.shape[1], len(P))


def fixed(shape: tuple[int, ...] = ()) -> TinyGPT:
    """log P as logits (their log-softmax is log P again, P sums to 1), typed as the learners expect."""
    return cast(TinyGPT, FixedPolicy(torch.log(torch.tensor(P)).expand(*shape, len(P))))


def behaviour(output: list[int], ratios: list[float]) -> list[float]:
    """Behaviour log-probs that make exp(logp_θ − logp_behaviour) equal `ratios` under the fixed policy."""
    return [math.log(P[tok] / r) for tok, r in zip(output, ratios, strict=True)]
