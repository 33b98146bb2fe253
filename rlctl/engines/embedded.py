"""EmbeddedEngine: continuous batching of TinyGPT on the CPU (the default rollout engine).

It runs the built-in demo model or any HF Llama/Qwen2 checkpoint directory (`from_pretrained`);
a row finishes on any of the model's EOS ids.

One `step()`:

    admit   waiting requests, oldest group then highest priority first, into free cache rows
            (≤ max_batch_size rows); prefill their prompts (all but the last token) into those rows.
            With `group_barrier` a later group waits while rows of a large earlier one run (below)
    decode  one token for every cache row (rows of finished requests ride along until compaction)
    sample  Gumbel-max with noise hashed from (request seed, output index, token): a request's
            tokens do not depend on what else is in the batch, so schedules can be compared
    finish  EOS or max_new_tokens → GenResult; the row is free for the next admission
    compact only when nothing can be admitted and ≥ compact_fraction of the rows are free: copying
            the cache at every EOS made generation 1.5–1.8× slower (DESIGN §10)

Group barrier: a decode step reads every row's K/V up to the *longest* row's position (a dense
cache; attention is memory-bound on a CPU), so short rows of the next iteration admitted beside the
previous iteration's long tail make every step read the tail's length for all rows. A group with
more requests than `max_batch_size` refills its own freed rows with its own waiting requests, so
its tail is short next to its work: there the next group waits for its last row. A group that fits
in one batch would otherwise run its tail alone at a small batch (static batching), so the next
group fills its freed rows at once. That is `group_barrier="auto"`; "always" and "never" force one
way. Measured (long-tailed requests, batch 64, CPU per token, never ÷ always): 0.62 at 32 requests
per iteration, 0.92 at 64, 1.17 at 96, 1.25 at 128, 1.20 at 192 (`python -m bench batching` runs
64 and 128). A paged-attention engine (vLLM) reads only each row's own length and has no barrier.

Weights change only between steps (`load_weights`); rows already running keep their K/V (computed
with the older weights) and continue with the new ones, and the result's `version` is the oldest
version that produced any token (`versions_seen` has all of them).
"""

from __future__ import annotations

import heapq
import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from rlctl.engines.base import GenerationEngine, GenRequest, GenResult, check_requests
from rlctl.models.tinygpt import KVCache, TinyGPT

_M32 = 0xFFFFFFFF
GroupBarrier = Literal["auto", "always", "never"]
GROUP_BARRIERS: tuple[GroupBarrier, ...] = ("auto", "always", "never")


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int64 tensors (values stay < 2^63: no signed overflow)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x68E31DA5) & _M32
    return x ^ (x >> 16)


def gumbel_noise(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """Gumbel(0,1) noise [rows, vocab], a pure function of each row's (seed, step) and the token id."""
    ids = steps[:, None] * vocab + torch.arange(vocab)
    x = _mix32(seeds[:, None] ^ _mix32(ids & _M32))
    u = (x.double() + 0.5) / 2.0**32
    return -torch.log(-torch.log(u))


def request_seed(engine_seed: int, request_id: str) -> int:
    return zlib.crc32(f"{engine_seed}:{request_id}".encode())


@dataclass
class _Running:
    req: GenRequest
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: set[int] = field(default_factory=set)


class EmbeddedEngine(GenerationEngine):
    def __init__(
        self,
        model: TinyGPT,
        *,
        max_batch_size: int = 64,
        temperature: float = 1.0,
        seed: int = 0,
        version: int = 0,
        compact_fraction: float = 0.25,
        admission_key: Callable[[GenRequest], float] | None = None,
        group_barrier: GroupBarrier = "auto",
        eos_token_ids: Iterable[int] | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be ≥ 1")
        if group_barrier not in GROUP_BARRIERS:
            raise ValueError(f"group_barrier must be one of {', '.join(GROUP_BARRIERS)}, not {group_barrier!r}")
        if temperature < 0:
            raise ValueError("temperature must be ≥ 0 (0 = greedy)")
        self.model = model.eval()
        self.max_batch_size = max_batch_size
        self.temperature = temperature
        self.seed = seed
        self.compact_fraction = compact_fraction
        # a row ends on any of these; default the model's config.json ids (a tokenizer may add
        # generation_config.json's, e.g. an instruct model's end-of-turn)
        self.eos_ids = frozenset(model.config.eos_token_ids if eos_token_ids is None else eos_token_ids)
        self.pad_id = model.config.pad_token_id or 0  # HF configs may have none: any id does (masked)
        self._key = admission_key or (lambda r: r.priority)  # the admission-order hook; higher = sooner
        self.group_barrier = group_barrier
        self._version = version
        self._waiting: list[tuple[int, float, int, GenRequest]] = []
        self._seq = 0
        self._group_size: Counter[int] = Counter()  # requests added per group (while any is unfinished)
        self._group_left: Counter[int] = Counter()  # … and not finished yet
        self._rows: list[_Running | None] = []  # cache row -> running request (None = free)
        self._cache: KVCache | None = None
        self._next = torch.zeros(0, dtype=torch.long)  # per row: token to feed next
        self._seeds = torch.zeros(0, dtype=torch.long)
        self._steps = torch.zeros(0, dtype=torch.long)  # per row: output tokens so far
        self.compactions = 0
        self.trace: list[int] | None = None  # set to [] to record the rows computed at every step

    @classmethod
    def from_pretrained(cls, directory: str | Path, **kw: Any) -> EmbeddedEngine:
        """An engine on an HF Llama/Qwen2 checkpoint directory (or a saved demo model)."""
        return cls(TinyGPT.from_pretrained(directory), **kw)

    # ---- GenerationEngine ----
    @property
    def version(self) -> int:
        return self._version

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        self.model.load_state_dict(state_dict)
        self._version = version
        for r in self._rows:
            if r is not None:
                r.versions.add(version)

    def add(self, requests: list[GenRequest]) -> None:
        check_requests(requests, limit=self.model.config.max_position_embeddings, limit_name="max_position_embeddings")
        for r in requests:
            heapq.heappush(self._waiting, (r.group, -self._key(r), self._seq, r))
            self._seq += 1
            self._group_size[r.group] += 1
            self._group_left[r.group] += 1

    def num_running(self) -> int:
        return sum(r is not None for r in self._rows)

    def num_waiting(self) -> int:
        return len(self._waiting)

    def step(self) -> list[GenResult]:
        self._admit()
        if self._cache is None:
            return []
        if self.trace is not None:
            self.trace.append(self._cache.rows)
        logits = self.model.decode(self._cache, self._next)
        tokens, logprobs = self._sample(logits)
        self._steps += 1
        self._next = tokens
        out = self._collect(tokens.tolist(), logprobs.tolist())
        self._maybe_compact()
        return out

    # ---- internals ----
    def _admit(self) -> None:
        free = [i for i, r in enumerate(self._rows) if r is None]
        room = len(free) + self.max_batch_size - len(self._rows)
        floor = self._running_floor()
        new: list[GenRequest] = []
        while self._admissible(floor) and len(new) < room:
            new.append(heapq.heappop(self._waiting)[3])
        if not new:
            return
        grow = len(new) - len(free)
        need = max(len(r.prompt_tokens) + r.max_new_tokens for r in new)
        if self._cache is None:
            self._cache = self.model.new_cache(0, need)
        if grow > 0:
            self._cache.add_rows(grow)
            free += list(range(len(self._rows), len(self._rows) + grow))
            self._rows += [None] * grow
            z = torch.zeros(grow, dtype=torch.long)
            self._next, self._seeds, self._steps = (torch.cat([t, z]) for t in (self._next, self._seeds, self._steps))
        self._cache.grow(need)
        rows = free[: len(new)]
        width = max(len(r.prompt_tokens) for r in new) - 1
        prompt = torch.full((len(new), width), self.pad_id, dtype=torch.long)
        for i, r in enumerate(new):
            prompt[i, : len(r.prompt_tokens) - 1] = torch.tensor(r.prompt_tokens[:-1], dtype=torch.long)
            self._rows[rows[i]] = _Running(r, versions={self._version})
        idx = torch.tensor(rows, dtype=torch.long)
        self.model.prefill(self._cache, idx, prompt, torch.tensor([len(r.prompt_tokens) - 1 for r in new]))
        self._next[idx] = torch.tensor([r.prompt_tokens[-1] for r in new])
        self._seeds[idx] = torch.tensor([request_seed(self.seed, r.request_id) for r in new])
        self._steps[idx] = 0

    def _running_floor(self) -> int | None:
        """The earliest group with a running row, if it holds later groups back: it is larger than one
        batch (None: nothing runs, no group barrier, or the earliest group fits in one batch)."""
        if self.group_barrier == "never":
            return None
        floor = min((r.req.group for r in self._rows if r is not None), default=None)
        if floor is None or (self.group_barrier == "auto" and self._group_size[floor] <= self.max_batch_size):
            return None
        return floor

    def _admissible(self, floor: int | None) -> bool:
        """The next waiting request may start now: no row of an earlier group runs (group barrier)."""
        return bool(self._waiting) and (floor is None or self._waiting[0][0] <= floor)

    def _sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.temperature == 0:
            logp = torch.log_softmax(logits.float(), dim=-1)
            tok = logp.argmax(-1)
        else:
            logp = torch.log_softmax(logits.float() / self.temperature, dim=-1)
            tok = (logp.double() + gumbel_noise(self._seeds, self._steps, logits.shape[-1])).argmax(-1)
        return tok, logp.gather(1, tok[:, None])[:, 0]

    def _collect(self, tokens: list[int], logprobs: list[float]) -> list[GenResult]:
        assert self._cache is not None
        done: list[GenResult] = []
        for i, r in enumerate(self._rows):
            if r is None:
                continue
            r.tokens.append(tokens[i])
            r.logprobs.append(logprobs[i])
            eos = tokens[i] in self.eos_ids and not r.req.ignore_eos
            if eos or len(r.tokens) >= r.req.max_new_tokens:
                seen = sorted(r.versions)
                done.append(
                    GenResult(
                        r.req.request_id,
                        r.req.prompt_tokens,
                        r.tokens,
                        r.logprobs,
                        seen[0],
                        "eos" if eos else "length",
                        seen,
                    )
                )
                self._rows[i] = None
                self._finished(r.req.group)
        free = torch.tensor([r is None for r in self._rows])
        self._cache.lengths[free] = 0  # free rows attend to position 0 only and never outgrow the cache
        return done

    def _finished(self, group: int) -> None:
        self._group_left[group] -= 1
        if self._group_left[group] <= 0:
            del self._group_left[group], self._group_size[group]

    def _maybe_compact(self) -> None:
        assert self._cache is not None
        n_free = sum(r is None for r in self._rows)
        if n_free == len(self._rows):
            self._cache, self._rows = None, []
            self._next, self._seeds, self._steps = (t[:0] for t in (self._next, self._seeds, self._steps))
        elif not self._admissible(self._running_floor()) and n_free >= self.compact_fraction * len(self._rows):
            keep = torch.tensor([i for i, r in enumerate(self._rows) if r is not None])
            self._cache.select(keep)
            self._next, self._seeds, self._steps = (t[keep] for t in (self._next, self._seeds, self._steps))
            self._rows = [r for r in self._rows if r is not None]
            self.compactions += 1
