"""Finished rollout samples as the trainer sees them, and their padded token batches.

Sample(prompt tokens, output tokens, behaviour logprobs, reward, version)
    │ make_batch
    ▼
TokenBatch  tokens [N, T]   = prompt ‖ output, right-padded with PAD
            mask   [N, T-1] = True where tokens[:, 1:] is an output token (aligned with logits[:, :-1])
            old_logprobs / ref_logprobs / advantages [N, T-1] on the same grid
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rlctl.engines.base import GenResult
from rlctl.rl.cuts import cut_lengths


@dataclass
class Sample:
    prompt_id: str
    prompt_tokens: list[int]
    output_tokens: list[int]
    logprobs: list[float]  # behaviour policy (engine), one per output token
    reward: float
    version: int = 0
    ref_logprobs: list[float] | None = None  # reference policy, for the KL term; filled by the trainer

    @classmethod
    def from_result(cls, result: GenResult, *, prompt_id: str, reward: float) -> Sample:
        return cls(
            prompt_id,
            list(result.prompt_tokens),
            list(result.output_tokens),
            list(result.logprobs),
            reward,
            result.version,
        )

    def __post_init__(self) -> None:
        if not self.prompt_tokens:  # the grid's row for output token t is the position before it: none for the first
            raise ValueError(
                f"sample of {self.prompt_id}: an empty prompt; its first output token has no position that predicts it "
                "(a prompt needs one token at least: a BOS)"
            )
        if len(self.logprobs) != len(self.output_tokens):
            raise ValueError(
                f"sample of {self.prompt_id}: {len(self.logprobs)} logprobs for {len(self.output_tokens)} output tokens"
            )


@dataclass
class TokenBatch:
    tokens: torch.Tensor
    mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    # [N, T]: the grid positions that hold a row's token, prompt or output (what a MoE's load-balancing loss counts,
    # as transformers' attention mask does); None: every position does (no padding)
    real: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum())

    def to(self, device: torch.device) -> TokenBatch:
        """The batch on `device` (the model's: batches are built on the host)."""
        ref, real = (None if t is None else t.to(device) for t in (self.ref_logprobs, self.real))
        return TokenBatch(
            self.tokens.to(device),
            self.mask.to(device),
            self.old_logprobs.to(device),
            self.advantages.to(device),
            ref,
            real,
        )


def device_of(model: nn.Module) -> torch.device:
    """Where a model's parameters are (what its inputs must be on)."""
    return next(model.parameters()).device


def _grid(samples: list[Sample], pad: int) -> tuple[torch.Tensor, torch.Tensor, list[slice]]:
    rows = [s.prompt_tokens + s.output_tokens for s in samples]
    t = max(len(r) for r in rows)
    tokens = torch.full((len(rows), t), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), t - 1), dtype=torch.bool)
    spans = []
    for i, (s, r) in enumerate(zip(samples, rows, strict=True)):
        tokens[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        span = slice(len(s.prompt_tokens) - 1, len(r) - 1)
        mask[i, span] = True
        spans.append(span)
    return tokens, mask, spans


def make_batch(samples: list[Sample], advantages: list[float] | list[list[float]], *, pad: int = 0) -> TokenBatch:
    """Per-sample advantages (GRPO) are broadcast over the sample's tokens; per-token lists (PPO) are placed."""
    tokens, mask, spans = _grid(samples, pad)
    old = torch.zeros(mask.shape)
    adv = torch.zeros(mask.shape)
    has_ref = all(s.ref_logprobs is not None for s in samples)
    ref = torch.zeros(mask.shape) if has_ref else None
    for i, (s, span) in enumerate(zip(samples, spans, strict=True)):
        old[i, span] = torch.tensor(s.logprobs)
        a = advantages[i]
        adv[i, span] = torch.tensor(a) if isinstance(a, list) else float(a)
        if ref is not None and s.ref_logprobs is not None:
            ref[i, span] = torch.tensor(s.ref_logprobs)
    lengths = torch.tensor([len(s.prompt_tokens) + len(s.output_tokens) for s in samples])
    real = torch.arange(tokens.shape[1])[None, :] < lengths[:, None]
    return TokenBatch(tokens, mask, old, adv, ref, real)


ENTROPY_CHUNK = 1 << 24  # elements (64 MiB in fp32) per piece of the entropy's no-grad pass


def _plogp(log_p: torch.Tensor) -> torch.Tensor:
    """p · log p from log p, 0 where p is 0 (a −inf log-prob: the product would be NaN)."""
    p = log_p.exp()
    return torch.where(p > 0, p * log_p, 0.0)


def token_logprobs(model: nn.Module, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(tokens[:, t+1] | tokens[:, :t+1]) at the sampling temperature, shape [N, T-1]."""
    return logprobs_and_entropy(model, tokens, temperature, entropy=False)[0]


def logprobs_and_entropy(
    model: nn.Module, tokens: torch.Tensor, temperature: float = 1.0, *, entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs`, and with `entropy` the entropy of each position's next-token distribution at the sampling
    temperature (shape [N, T-1], no gradient; computed over ≤ `ENTROPY_CHUNK` elements at a time, so it holds two
    such temporaries beside the log-softmax, whatever the vocabulary)."""
    return logprobs_of(model(tokens), tokens, temperature, entropy=entropy)


def logprobs_of(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0, *, entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`logprobs_and_entropy` from the model's logits [N, T, vocab] of `tokens`."""
    logits = logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    log_p = torch.log_softmax(logits, dim=-1)
    picked = log_p.gather(-1, tokens[:, 1:, None])[..., 0]
    if not entropy:
        return picked, None
    with torch.no_grad():
        flat = log_p.detach().reshape(-1, log_p.shape[-1])
        parts = flat.split(max(1, ENTROPY_CHUNK // flat.shape[-1]))
        h = torch.cat([-_plogp(part).sum(-1) for part in parts]).view(log_p.shape[:-1])
    return picked, h


@torch.no_grad()
def score(model: nn.Module, samples: list[Sample], *, temperature: float = 1.0, pad: int = 0) -> list[list[float]]:
    """Per-output-token logprobs of `samples` under `model` (e.g. the reference policy for the KL term)."""
    tokens, _, spans = _grid(samples, pad)
    with torch.no_grad():
        lp = token_logprobs(model, tokens.to(device_of(model)), temperature).cpu()  # one read-back, not one a sample
    release_gathered(model)
    return [lp[i, span].tolist() for i, span in enumerate(spans)]


def release_gathered(model: nn.Module) -> None:
    """Free what an FSDP2 `model`'s forward left gathered where no backward follows it (a reference's scores, PPO's
    critic's values for GAE): FSDP2 keeps a root's parameters gathered after its forward, for the backward that
    gathers them next, and without one they stayed so (embeddings, lm_head: 4·V·h bytes of bf16 a model) until the
    model's next backward, or for good (a reference never has one). A local free, no collective; a model not
    sharded has nothing to free."""
    if (reshard := getattr(model, "reshard", None)) is not None:
        reshard()


def row_tokens(sample: Sample) -> int:
    """Tokens of one row of the training grid: prompt ‖ output."""
    return len(sample.prompt_tokens) + len(sample.output_tokens)


def fill_ref_logprobs(ref_model: nn.Module | None, samples: list[Sample], *, temperature: float, pad: int = 0) -> None:
    """Score the samples that have no reference logprobs yet under `ref_model` (the KL term's policy)."""
    missing = [s for s in samples if s.ref_logprobs is None]
    if ref_model is None or not missing:
        return
    for s, lp in zip(missing, score(ref_model, missing, temperature=temperature, pad=pad), strict=True):
        s.ref_logprobs = lp


def micro_batches(
    samples: list[Sample], size: int, *, max_tokens: int | None = None, ranks: int = 1
) -> list[list[int]]:
    """Indices of `samples` in length order, cut into micro-batches over `ranks` data-parallel ranks (each takes a
    contiguous run of the order, `rlctl.rl.cuts.share_rows`) whose every share holds at most `size` rows and, with
    `max_tokens`, at most that many padded tokens (its rows × its longest row; a longer sample alone):
    `rlctl.rl.cuts.cut_lengths`.

    Rows of similar length pad little, and a token budget keeps the long tail's rows from padding a
    whole micro-batch to its length: on one CPU thread a 1024-token budget trained a long-tailed batch
    1.77× faster than 32-row cuts (`python -m bench batching`); on a GPU it bounds activation memory.
    """
    return cut_lengths([row_tokens(s) for s in samples], size, max_tokens=max_tokens, ranks=ranks)
