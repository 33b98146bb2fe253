"""The generation-engine interface: what a rollout agent drives, whatever runs the model.

    add(requests) ──▶ waiting queue (highest priority first, FIFO among equals)
                            │ admitted when a batch slot is free (≤ max_batch_size running)
                            ▼
    step() ──▶ one decode step for every running request ──▶ finished samples returned at once
    load_weights(sd, v)     between steps; every later token is generated with version v

A request admitted under version v keeps generating after `load_weights(…, v+1)`;
`GenResult.version` is the *oldest* version that produced any of its tokens (the staleness bound
is enforced on that) and `versions_seen` lists them all.

`EmbeddedEngine` is the CPU implementation and test double; `VllmEngine` the optional GPU one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch


@dataclass
class GenRequest:
    request_id: str
    prompt_tokens: list[int]
    max_new_tokens: int
    priority: float = 0.0  # higher = admitted first (LPT: the predicted output length)
    group: int = 0  # admission group (the iteration); engines may keep a later group waiting while an earlier runs
    ignore_eos: bool = False  # keep decoding past EOS (benchmarks that need a fixed length)


@dataclass
class GenResult:
    request_id: str
    prompt_tokens: list[int]
    output_tokens: list[int]  # ends with EOS when finish_reason == "eos"
    logprobs: list[float]  # behaviour-policy log-prob of each output token (at the sampling temperature)
    version: int  # oldest weight version that generated any of the output tokens
    finish_reason: str  # "eos" | "length"
    versions_seen: list[int] = field(default_factory=list)  # every version that contributed, ascending


def check_requests(requests: list[GenRequest], *, limit: int, limit_name: str) -> None:
    """ValueError naming the first request with an empty prompt, no new tokens, or prompt + new tokens over
    the engine's context `limit` (called `limit_name` in the message)."""
    for r in requests:
        if not r.prompt_tokens or r.max_new_tokens < 1:
            raise ValueError(f"request {r.request_id}: empty prompt or max_new_tokens < 1")
        if len(r.prompt_tokens) + r.max_new_tokens > limit:
            raise ValueError(
                f"request {r.request_id}: {len(r.prompt_tokens)} prompt + {r.max_new_tokens} "
                f"new tokens > {limit_name} {limit}"
            )


class GenerationEngine(ABC):
    """A continuous-batching generator. Not thread-safe: one caller drives add/step/load_weights."""

    max_batch_size: int

    @abstractmethod
    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Swap in new weights; call between steps. Running requests continue with them."""

    @abstractmethod
    def add(self, requests: list[GenRequest]) -> None:
        """Queue requests; they are admitted by priority (highest first), FIFO among equals."""

    @abstractmethod
    def step(self) -> list[GenResult]:
        """Admit what fits, run one decode step, return the samples that finished in it."""

    @abstractmethod
    def num_running(self) -> int: ...

    @abstractmethod
    def num_waiting(self) -> int: ...

    @property
    @abstractmethod
    def version(self) -> int: ...

    def has_work(self) -> bool:
        return self.num_running() + self.num_waiting() > 0

    def run_until_done(self) -> list[GenResult]:
        """Step until every queued request finished (a convenience for benchmarks and tests)."""
        out: list[GenResult] = []
        while self.has_work():
            out.extend(self.step())
        return out
