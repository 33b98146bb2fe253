"""The generation-engine interface: what a rollout agent drives, whatever runs the model.

    add(requests) ──▶ waiting queue (highest priority first, FIFO among equals)
                            │ admitted when a batch slot is free (≤ max_batch_size running)
                            ▼
    step() ──▶ one decode step for every running request ──▶ finished samples returned at once
    load_weights(sd, v)     between steps; every later token is generated with version v

A request admitted under version v keeps generating after `load_weights(…, v+1)`;
`GenResult.version` is the *oldest* version that produced any of its tokens (the staleness bound
is enforced on that), `versions_seen` lists them all and `token_versions` names each token's.

Partial rollouts (StaleFlow's trajectory server, seed 004 §5): `partials()` shows what running requests
have generated so far, `interrupt(ids)` takes requests out and returns what they had, and a request with
a `prefix` (an interrupted generation's tokens, log-probs and versions) resumes it — the engine prefills
prompt + prefix and samples from there, on any unit; `max_new_tokens` counts the prefix.

`EmbeddedEngine` is the CPU implementation and test double; `VllmEngine` the optional GPU one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:  # the controller imports `Prefix` from here (rlctl.agents.trajectories), which needs no torch
    import torch


@dataclass
class Prefix:
    """Output a request generated before it was interrupted: its tokens, each token's behaviour log-prob and the
    weight version that sampled it."""

    tokens: list[int]
    logprobs: list[float]
    versions: list[int]

    def __post_init__(self) -> None:
        if not len(self.tokens) == len(self.logprobs) == len(self.versions):
            raise ValueError(
                f"prefix: {len(self.tokens)} tokens, {len(self.logprobs)} log-probs, {len(self.versions)} versions"
            )


@dataclass
class GenRequest:
    request_id: str
    prompt_tokens: list[int]
    max_new_tokens: int  # output tokens in all, a prefix's included
    priority: float = 0.0  # higher = admitted first (LPT: the predicted output length)
    group: int = 0  # admission group (the iteration); engines may keep a later group waiting while an earlier runs
    # (a negative group — held-out evaluation — goes first and keeps nothing waiting)
    ignore_eos: bool = False  # keep decoding past EOS (benchmarks that need a fixed length)
    prefix: Prefix | None = None  # resume an interrupted generation
    greedy: bool = False  # decode this request greedily whatever the engine's temperature (held-out evaluation)

    @property
    def context(self) -> list[int]:
        """What the engine prefills: the prompt, then the prefix's tokens."""
        return self.prompt_tokens + self.prefix.tokens if self.prefix else self.prompt_tokens


@dataclass
class GenResult:
    request_id: str
    prompt_tokens: list[int]
    output_tokens: list[int]  # ends with EOS when finish_reason == "eos"
    logprobs: list[float]  # behaviour-policy log-prob of each output token (at the sampling temperature)
    version: int  # oldest weight version that generated any of the output tokens
    finish_reason: str  # "eos" | "length" | "interrupted" (`interrupt`) | "running" (`partials`)
    versions_seen: list[int] = field(default_factory=list)  # every version that contributed, ascending
    token_versions: list[int] = field(default_factory=list)  # the version that sampled each output token


@dataclass
class Generation:
    """A request's output so far inside an engine: its tokens, their log-probs and versions, and the versions'
    distinct values (kept as tokens come: a unit's report reads every running request's each second)."""

    req: GenRequest
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # the version that sampled each token
    seen: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.seen.update(self.versions)

    @classmethod
    def of(cls, req: GenRequest, **kw: Any) -> Self:
        """A request's output as it enters the engine: its prefix's (fresh copies), else none."""
        p = req.prefix
        if p is None:
            return cls(req, **kw)
        return cls(req, list(p.tokens), list(p.logprobs), list(p.versions), **kw)

    def result(self, reason: str) -> GenResult:
        """The result, or the state so far; with no output yet (a waiting request), version -1."""
        seen = sorted(self.seen)
        r = self.req
        return GenResult(
            r.request_id,
            r.prompt_tokens,
            self.tokens,
            self.logprobs,
            seen[0] if seen else -1,
            reason,
            seen,
            self.versions,
        )


def check_requests(requests: list[GenRequest], *, limit: int, limit_name: str) -> None:
    """ValueError naming the first request with an empty prompt, no new tokens, or prompt + new tokens over
    the engine's context `limit` (called `limit_name` in the message)."""
    for r in requests:
        if not r.prompt_tokens or r.max_new_tokens < 1:
            raise ValueError(f"request {r.request_id}: empty prompt or max_new_tokens < 1")
        if r.prefix is not None and len(r.prefix.tokens) >= r.max_new_tokens:
            raise ValueError(
                f"request {r.request_id}: a prefix of {len(r.prefix.tokens)} tokens leaves nothing to generate "
                f"(max_new_tokens {r.max_new_tokens})"
            )
        if len(r.prompt_tokens) + r.max_new_tokens > limit:
            raise ValueError(
                f"request {r.request_id}: {len(r.prompt_tokens)} prompt + {r.max_new_tokens} "
                f"new tokens > {limit_name} {limit}"
            )


class GenerationEngine(ABC):
    """A continuous-batching generator. Not thread-safe: one caller drives add/step/load_weights."""

    max_batch_size: int
    step_tokens: int  # tokens the last `step` added, over all requests (a unit's flight record counts them)

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
    def partials(self) -> list[GenResult]:
        """Every running request's output so far (finish_reason "running"; read-only, valid until the next
        call that changes the engine)."""

    @abstractmethod
    def interrupt(self, request_ids: list[str]) -> list[GenResult]:
        """Take these requests out (waiting or running; unknown ids are ignored): what each had generated,
        finish_reason "interrupted". Resume one elsewhere with its output as a `prefix`."""

    @abstractmethod
    def num_running(self) -> int: ...

    def rows_free(self) -> int | None:
        """Rows a queued request can be admitted into before a running one finishes or is taken out; None where
        the engine may also free rows on its own (vLLM preempts running requests when its cache is short)."""
        return None

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
