"""Batch-independent sampling: a request's tokens depend on its seed and its logits only, never on the batch.

    u     = uniform(seed, step)                   one 53-bit draw per row, hashed on the device: O(batch)
    token = the first i with cdf[i] ≥ u · cdf[-1] inverse-CDF over exp(logits/T − max), accumulated in fp64
    logp  = logits[token]/T − max − log(cdf[-1])  the behaviour log-prob at temperature T

One uniform per row instead of Gumbel noise per (row, token): the hash work is batch-sized, not
batch × vocabulary (at Qwen2's 151,936-token vocabulary, noise per token cost more than the decode step on a
CPU). What remains per token is one exp and one cumulative sum, the same order of work as the softmax the
log-probs need anyway; the cumulative sum is fp64 so that tokens of probability far below fp32's resolution
are drawn at their own probability. Every operation keeps the shapes of its inputs and never asks the host
for a value, so a CUDA graph captures it with the decode step (rlctl.engines.graphs).

Temperature 0 is greedy: the argmax, with its log-prob at temperature 1; so is a row that `greedy` marks
(a held-out evaluation's request in a batch of sampled ones), whatever the temperature.
"""

from __future__ import annotations

import zlib

import torch

_M32 = 0xFFFFFFFF


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int64 tensors (values stay < 2^63: no signed overflow)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x68E31DA5) & _M32
    return x ^ (x >> 16)


def request_seed(engine_seed: int, request_id: str) -> int:
    """A request's sampling seed: a function of the job's seed and the request's id only."""
    return zlib.crc32(f"{engine_seed}:{request_id}".encode())


def uniform(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """U(0, 1) in float64, 53 random bits, a pure function of each row's (seed, step)."""
    two = torch.stack((2 * steps, 2 * steps + 1), dim=-1) & _M32  # both halves' counters in one pass
    hi, lo = mix32(seeds[:, None] ^ mix32(two)).unbind(-1)
    return (((hi << 21) + (lo >> 11)).double() + 0.5) / 2.0**53


def sample(
    logits: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
    temperature: float,
    greedy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token [b] int64, its log-prob [b] fp32) for each row of `logits` [b, V] (any float dtype); the rows that
    `greedy` [b] (bool) marks take the argmax (None: none does)."""
    x = logits.float()
    if temperature == 0 or greedy is not None:
        best = x.argmax(-1, keepdim=True)
        best_logp = (x.gather(1, best) - torch.logsumexp(x, -1, keepdim=True))[:, 0]
        if temperature == 0:
            return best[:, 0], best_logp
    if temperature != 1.0:  # the common 1.0 skips a pass over batch × vocabulary (x / 1.0 is x)
        x = x / temperature
    top = x.amax(-1, keepdim=True)
    cdf = torch.cumsum((x - top).exp_(), -1, dtype=torch.float64)
    total = cdf[:, -1:]
    target = uniform(seeds, steps)[:, None] * total
    tok = torch.searchsorted(cdf, target).clamp_(max=x.shape[-1] - 1)
    logp = x.gather(1, tok) - top - total.log().float()
    if greedy is not None:
        return torch.where(greedy, best[:, 0], tok[:, 0]), torch.where(greedy, best_logp, logp[:, 0])
    return tok[:, 0], logp[:, 0]
