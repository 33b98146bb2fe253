"""EmbeddedEngine: continuous batching of TinyGPT on the model's device (the default rollout engine).

It runs the built-in demo model or any HF Llama/Qwen2/Qwen3/Qwen3MoE/Qwen2MoE/Mistral/Phi3 checkpoint directory
(`from_pretrained`) on the CPU or a CUDA device, in the model's dtype (the checkpoint's on a GPU, fp32 on a CPU:
`rlctl.devices`); a row finishes on any of the model's EOS ids. Every tensor the engine computes with lives on the
model's device; what the host sends or reads goes in one buffer each way (`to_device` for an admission, `_host_out` for
a step's read).

One `step()`:

    admit   waiting requests, oldest group then highest priority first, into free cache rows
            (≤ max_batch_size rows); prefill their prompts (all but the last token) into those rows.
            With `group_barrier` a later group waits while rows of a large earlier one run (below).
            With static shapes (on CUDA) a prefill of at most PREFILL_GRAPH_TOKENS tokens runs at bucketed
            (rows, width) too, as a CUDA graph: the rows past the admitted ones repeat the first admitted
            request (the same row, the same tokens: the same K/V written twice); a larger one is bound by
            its compute, not its launches, and runs eagerly at its own shape
    decode  one token for every cache row (rows of finished requests ride along until compaction);
            on a CUDA device the step is one CUDA graph per (rows, width) bucket (rlctl.engines.graphs)
    sample  inverse-CDF with one uniform hashed from (request seed, output index) per row
            (rlctl.engines.sampling): a request's tokens do not depend on what else is in the batch, so
            schedules can be compared and a requeued sample regenerates identically;
            a greedy request (`GenRequest.greedy`: a held-out evaluation) takes the argmax in the same batch
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

`compile_step`: the decode step's model pass goes through `torch.compile` (inductor, symbolic shapes, no graph
break), which fuses its elementwise work (norms, rotary, activations) into fewer kernels; on a CUDA device the
compiled pass and the sampler are what each bucket's graph captures. The sampler stays eager: inductor's CUDA
code for its fp64 cumulative sum over a 151,936-token vocabulary (a split scan at a symbolic batch) failed to
generate (torch 2.11, `make gpu-check`, 2026-11-28). The first step compiles (tens of seconds), a later one at
a new kind of shape may compile again. Outputs equal the eager step's (tests/unit/engines); whether it is
faster is measured by `make gpu-check` (`engine_compiled`). Inductor needs a C++ compiler on a CPU and triton
with a C compiler on a GPU (`rlctl.engines.compiletools`: `rlctl check`, `check --reach` and a unit as it starts
ask for them); without, the first step fails (InvalidCxxCompiler).

Weights change only between steps (`load_weights`); rows already running keep their K/V (computed
with the older weights) and continue with the new ones, and the result's `version` is the oldest
version that produced any token (`versions_seen` has all of them, `token_versions` each token's).

A request with a prefix (an interrupted generation, `interrupt`) prefills prompt + prefix and samples
its next token with the uniform of the prefix's length: on the same weights it continues as if it had
never stopped.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, Literal

import torch

from rlctl.engines.base import Generation, GenerationEngine, GenRequest, GenResult, check_requests
from rlctl.engines.graphs import StepGraphs
from rlctl.engines.kvsize import MIN_WIDTH, bucket, cache_capacity
from rlctl.engines.sampling import request_seed, sample
from rlctl.models import rope
from rlctl.models.hf import MOE_ARCHITECTURES
from rlctl.models.tinygpt import KVCache, TinyGPT

GroupBarrier = Literal["auto", "always", "never"]
GROUP_BARRIERS: tuple[GroupBarrier, ...] = ("auto", "always", "never")

__all__ = ["GROUP_BARRIERS", "PREFILL_GRAPH_TOKENS", "EmbeddedEngine", "GroupBarrier", "request_seed"]

PREFILL_MIN_WIDTH = 16  # prefill widths round up to 16, 24, 32, 48, 64, … positions (static shapes)
# a prefill of more (bucketed) tokens than this runs at its own shape: its compute, not its launches, bounds it
PREFILL_GRAPH_TOKENS = 8192


def to_device(*values: list[int], device: torch.device) -> tuple[torch.Tensor, ...]:
    """Lists of ints on `device` (int64) in one copy: a 1-D view of it for each list, in order.

    On CUDA a copy from pageable memory (`torch.tensor(..., device=)`, `.to(device)`) waits for the stream, one
    wait a tensor; these are packed into one page-locked buffer copied without waiting (`non_blocking`): the
    caching host allocator does not reuse that buffer before the copy has run."""
    pinned = device.type == "cuda"
    host = torch.tensor(list(chain.from_iterable(values)), dtype=torch.long, pin_memory=pinned)
    return host.to(device, non_blocking=pinned).split_with_sizes([len(v) for v in values])


@dataclass
class _Running(Generation):
    pos: int = 0  # the position of the token fed at the next step


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
        static_shapes: bool | None = None,
        compile_step: bool = False,
    ) -> None:
        """`static_shapes`: run each step at bucketed (rows, width), as CUDA graphs on a CUDA device (None: there
        only); on a CPU they run eagerly, the same step a graph captures (tests), else at the exact shapes.
        `compile_step`: the decode step through `torch.compile` (module docstring). A Qwen3MoE's steps are never
        graphs and never compiled (ValueError): its layers read on the host which experts their tokens chose."""
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be ≥ 1")
        if group_barrier not in GROUP_BARRIERS:
            raise ValueError(f"group_barrier must be one of {', '.join(GROUP_BARRIERS)}, not {group_barrier!r}")
        if temperature < 0:
            raise ValueError("temperature must be ≥ 0 (0 = greedy)")
        if (why := rope.longrope_refusal(model.config.rope_scaling, model.context)) is not None:
            raise ValueError(f"a model built for {model.context} tokens would {why}; build it for the job's context")
        # a Qwen MoE's layers read on the host which experts their tokens chose (SparseMoE): no graph to capture
        moe = model.config.moe is not None
        if compile_step and moe:
            name = MOE_ARCHITECTURES[model.config.architecture]
            raise ValueError(f"compile_step: a {name}'s expert routing is not one graph; leave it off")
        self.model = model.eval()
        model.fuse_projections()  # q/k/v and gate/up as one matmul each, in the caller's model: fewer kernels a step
        self.device = model.lm_head.weight.device
        self.max_batch_size = max_batch_size
        self.step_tokens = 0
        self._temperature = temperature
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
        self._rows: list[_Running | None] = []  # cache row -> running request (None = free): a prefix of the storage
        # what a step reads of the running rows, kept as rows start and end (not a scan of every row, several a step)
        self._n_running = 0
        self._n_greedy = 0  # running greedy requests
        self._running_groups: Counter[int] = Counter()  # running rows per group ≥ 0 (the group barrier's floor)
        self._max_pos = -1  # the largest running row's `pos` (-1: none runs)
        self._cache: KVCache | None = None  # max_batch_size rows, allocated at the first admission
        # per storage row, on the device (static storage: a captured step reads them in place)
        z = torch.zeros(max_batch_size, dtype=torch.long, device=self.device)
        # what the host reads of a step, the sampled tokens (int64, also the tokens fed at the next step) and their
        # log-probs (fp32), are views of one byte buffer: one transfer a step, not two (on a GPU each waits for it)
        self._out = torch.zeros(max_batch_size * 12, dtype=torch.uint8, device=self.device)
        self._next, self._logprobs = self._out_views(self._out)
        pinned = self.device.type == "cuda"  # a transfer into page-locked memory is a direct copy
        self._host_out = torch.zeros(max_batch_size * 12, dtype=torch.uint8, pin_memory=pinned)
        self._host_next, self._host_logprobs = self._out_views(self._host_out)
        self._seeds = z.clone()
        self._steps = z.clone()  # output tokens so far
        self._live = z.clone()  # 1 = a running request holds the row (free rows stay at position 0)
        self._greedy = torch.zeros(max_batch_size, dtype=torch.bool, device=self.device)  # a greedy request's row
        self._static = self.device.type == "cuda" if static_shapes is None else static_shapes
        self.compile_step = compile_step
        # shapes symbolic: one compile serves every (rows, width) bucket. None: the eager `_forward`, called as a
        # method; the compiled one is the class's function, given the engine (a bound method kept on the engine,
        # compiled or not, would be a reference cycle: see StepGraphs)
        self._compiled = torch.compile(type(self)._forward, dynamic=True, fullgraph=True) if compile_step else None
        # static prefill inputs (`_prefill`): tokens [storage rows, cache capacity], rows, lengths
        self._pf_tokens = torch.zeros(0, dtype=torch.long, device=self.device)
        self._pf_rows, self._pf_lengths = z.clone(), z.clone()
        self._graphs: StepGraphs | None = None
        self._mixed_graphs: StepGraphs | None = None  # the decode step with greedy rows among sampled ones
        self._prefill_graphs: StepGraphs | None = None
        if self._static and self.device.type == "cuda" and not moe:
            pool = torch.cuda.graph_pool_handle()  # the decode and prefill graphs share one memory pool
            self._graphs = StepGraphs(self._decode, pool=pool)
            self._mixed_graphs = StepGraphs(self._decode_mixed, pool=pool)
            self._prefill_graphs = StepGraphs(self._prefill_step, pool=pool)
        self.prefills = 0  # prefill calls (admissions that prefilled)
        self.compactions = 0
        self.trace: list[int] | None = None  # set to [] to record the rows computed at every step

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = torch.float32,
        context: int | None = None,
        **kw: Any,
    ) -> EmbeddedEngine:
        """An engine on an HF Llama/Qwen2/Qwen3/Qwen3MoE/Qwen2MoE/Mistral/Phi3 checkpoint directory (or a saved demo
        model), on `device` in `dtype` (None: the checkpoint's), for requests of up to `context` tokens (None: the
        model's max_positions; `TinyGPT.empty`)."""
        return cls(TinyGPT.from_pretrained(directory, dtype=dtype, device=device, context=context), **kw)

    @property
    def temperature(self) -> float:
        return self._temperature

    @temperature.setter
    def temperature(self, value: float) -> None:
        """A captured step samples at the temperature it was captured with: a new one recaptures."""
        self._temperature = value
        self._reset_graphs()

    # ---- GenerationEngine ----
    def describe(self) -> str:
        """One line for the unit's log: the device, the dtype, CUDA graphs and a compiled step when used."""
        how = [str(self.device), str(self.model.lm_head.weight.dtype).removeprefix("torch.")]
        how += ["CUDA graphs"] if self._graphs is not None else []
        how += ["compiled step"] if self.compile_step else []
        return "embedded engine on " + ", ".join(how)

    @property
    def version(self) -> int:
        return self._version

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        self.model.load_weights(state_dict)  # in place: captured graphs read the new weights
        if self.model.fuse_projections():  # a parameter moved since: fused anew
            self._reset_graphs()
        self._version = version

    def add(self, requests: list[GenRequest]) -> None:
        check_requests(requests, limit=self.model.context, limit_name=self.model.context_name)
        for r in requests:
            heapq.heappush(self._waiting, (r.group, -self._key(r), self._seq, r))
            self._seq += 1
            self._group_size[r.group] += 1
            self._group_left[r.group] += 1

    def partials(self) -> list[GenResult]:
        return [r.result("running") for r in self._rows if r is not None]

    def interrupt(self, request_ids: list[str]) -> list[GenResult]:
        ids = set(request_ids)
        taken = [w[3] for w in self._waiting if w[3].request_id in ids]
        out = [Generation.of(r).result("interrupted") for r in taken]
        if taken:
            self._waiting = [w for w in self._waiting if w[3].request_id not in ids]
            heapq.heapify(self._waiting)
            for req in taken:
                self._finished(req.group)
        ended = [i for i, row in enumerate(self._rows) if row is not None and row.req.request_id in ids]
        for i in ended:
            row = self._rows[i]
            assert row is not None
            out.append(row.result("interrupted"))
            self._vacate(i, row)
        self._free(ended)
        if ended:
            self._max_pos = max((r.pos for r in self._rows if r is not None), default=-1)
        if all(r is None for r in self._rows):
            self._rows = []  # as after a step that ended every row (the storage stays allocated)
        return out

    def num_running(self) -> int:
        return self._n_running

    def num_waiting(self) -> int:
        return len(self._waiting)

    def rows_free(self) -> int | None:
        return self.max_batch_size - self.num_running()  # a row is freed only by a finish or `interrupt`

    def step(self) -> list[GenResult]:
        self.step_tokens = 0
        self._admit()
        if not self._rows:
            return []
        assert self._cache is not None
        n = len(self._rows)
        width = self._max_pos + 1
        # a greedy request (a held-out evaluation) beside sampled ones: the step that picks per row, graphs of its own
        mixed = self._temperature != 0 and self._n_greedy > 0
        step, graphs = (self._decode_mixed, self._mixed_graphs) if mixed else (self._decode, self._graphs)
        if self._static:  # shapes from buckets, so that a few graphs serve every step
            rows = min(bucket(n), self.max_batch_size)
            width = min(bucket(width, floor=MIN_WIDTH), self._cache.capacity)
            if graphs is not None:
                graphs.run(rows, width)
            else:
                step(rows, width)
        else:
            rows = n
            step(rows, width)
        if self.trace is not None:
            self.trace.append(rows)
        self.step_tokens = self._n_running  # one each (the prefilled ones: their first)
        self._host_out.copy_(self._out)  # the step's one transfer (on a GPU, its one wait)
        out = self._collect(self._host_next[:n].tolist(), self._host_logprobs[:n].tolist())
        self._maybe_compact()
        return out

    # ---- internals ----
    def _reset_graphs(self) -> None:
        """Forget the captured graphs: what they read moved, or what they compute changed."""
        for graphs in (self._graphs, self._mixed_graphs, self._prefill_graphs):
            if graphs is not None:
                graphs.reset()

    def _out_views(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens (int64) and log-probs (fp32) of every storage row in a byte buffer `out`: 8 bytes a row then 4."""
        split = 8 * self.max_batch_size
        return out[:split].view(torch.long), out[split:].view(torch.float32)

    def _forward(self, rows: int, width: int) -> torch.Tensor:
        """The model's pass of a decode step (what `compile_step` compiles): next-token logits of the first `rows`."""
        assert self._cache is not None
        return self.model.decode(self._cache, self._next[:rows], rows=rows, width=width)

    def _decode(self, rows: int, width: int, *, mixed: bool = False) -> None:
        """One decode and sampling step of the first `rows` storage rows, attending over `width` positions; every
        result lands in place (what a CUDA graph captures). `mixed`: the rows `_greedy` marks take the argmax."""
        assert self._cache is not None
        logits = self._forward(rows, width) if self._compiled is None else self._compiled(self, rows, width)
        greedy = self._greedy[:rows] if mixed else None
        tokens, logprobs = sample(logits, self._seeds[:rows], self._steps[:rows], self._temperature, greedy)
        self._steps[:rows] += 1
        self._next[:rows] = tokens
        self._logprobs[:rows] = logprobs
        self._cache.lengths[:rows] *= self._live[:rows]  # free rows stay at position 0

    def _decode_mixed(self, rows: int, width: int) -> None:
        self._decode(rows, width, mixed=True)

    def _admit(self) -> None:
        room = self.max_batch_size - self._n_running
        floor = self._running_floor()
        new: list[GenRequest] = []
        while self._admissible(floor) and len(new) < room:
            new.append(heapq.heappop(self._waiting)[3])
        if not new:
            return
        free = [i for i, r in enumerate(self._rows) if r is None]
        need = max(len(r.prompt_tokens) + r.max_new_tokens for r in new)
        capacity = cache_capacity(need, self.model.context)  # what `rlctl check` prices
        if self._cache is None:
            self._cache = self.model.new_cache(self.max_batch_size, capacity)
        elif need > self._cache.capacity:
            self._cache.grow(capacity)
            self._reset_graphs()  # the graphs read the old storage
        if self._static and self._pf_tokens.shape[-1] != self._cache.capacity:
            self._pf_tokens = torch.zeros(
                self.max_batch_size, self._cache.capacity, dtype=torch.long, device=self.device
            )
            self._reset_graphs()
        grow = len(new) - len(free)
        if grow > 0:
            free += list(range(len(self._rows), len(self._rows) + grow))
            self._rows += [None] * grow
        rows = free[: len(new)]
        contexts = [r.context for r in new]  # the prompt, and a resumed request's prefix
        for i, (r, c) in enumerate(zip(new, contexts, strict=True)):
            self._rows[rows[i]] = _Running.of(r, pos=len(c) - 1)
            self._n_greedy += r.greedy
            if r.group >= 0:
                self._running_groups[r.group] += 1
        self._n_running += len(new)
        self._max_pos = max(self._max_pos, max(len(c) for c in contexts) - 1)
        self._prefill(rows, contexts)
        # each admitted row's state: its row, the token it feeds next, its seed, the output index it samples next (a
        # resumed request draws the uniforms of the output indices it has not generated yet), greedy or not
        idx, next_tokens, seeds, steps, greedy = to_device(  # the admission's one copy
            rows,
            [c[-1] for c in contexts],
            [request_seed(self.seed, r.request_id) for r in new],
            [len(r.prefix.tokens) if r.prefix else 0 for r in new],
            [int(r.greedy) for r in new],
            device=self.device,
        )
        self._next[idx] = next_tokens
        self._seeds[idx] = seeds
        self._steps[idx] = steps
        self._live.index_fill_(0, idx, 1)  # not `_live[idx] = 1`: on CUDA that copies the 1 to the device, and waits
        self._greedy[idx] = greedy.bool()

    def _prefill(self, rows: list[int], contexts: list[list[int]]) -> None:
        """Prefill each context but its last token into its cache row: at bucketed shapes with static shapes
        (a CUDA graph on CUDA; the module docstring), else at its own."""
        assert self._cache is not None
        self.prefills += 1
        n, width = len(rows), max(len(c) for c in contexts) - 1
        nb = min(bucket(n), self.max_batch_size)
        wb = min(bucket(width, floor=PREFILL_MIN_WIDTH), self._cache.capacity)
        static = self._static and width > 0 and nb * wb <= PREFILL_GRAPH_TOKENS
        if not static:
            nb, wb = n, width
        # rows past the admitted ones repeat the first: the same row and tokens, so the same K/V written twice
        extra = nb - n
        padded = contexts + [contexts[0]] * extra
        host_tokens = list(chain.from_iterable(c[:-1] + [self.pad_id] * (wb + 1 - len(c)) for c in padded))
        flat, at, lengths = to_device(  # the prefill's one copy
            host_tokens, rows + [rows[0]] * extra, [len(c) - 1 for c in padded], device=self.device
        )
        tokens = flat.view(nb, wb)  # each context but its last token, right-padded
        if not static:
            self.model.prefill(self._cache, at, tokens, lengths)
            return
        self._pf_tokens[:nb, :wb].copy_(tokens)
        self._pf_rows[:nb].copy_(at)
        self._pf_lengths[:nb].copy_(lengths)
        if self._prefill_graphs is not None:
            self._prefill_graphs.run(nb, wb)
        else:
            self._prefill_step(nb, wb)

    def _prefill_step(self, rows: int, width: int) -> None:
        """The prefill of the static inputs' first `rows` rows and `width` positions (what a CUDA graph captures)."""
        assert self._cache is not None
        self.model.prefill(self._cache, self._pf_rows[:rows], self._pf_tokens[:rows, :width], self._pf_lengths[:rows])

    def _running_floor(self) -> int | None:
        """The earliest group with a running row, if it holds later groups back: it is larger than one
        batch (None: nothing runs, no group barrier, or the earliest group fits in one batch). A negative group
        (a held-out evaluation's) is admitted first and holds nothing back."""
        if self.group_barrier == "never":
            return None
        floor = min(self._running_groups, default=None)
        if floor is None or (self.group_barrier == "auto" and self._group_size[floor] <= self.max_batch_size):
            return None
        return floor

    def _admissible(self, floor: int | None) -> bool:
        """The next waiting request may start now: no row of an earlier group runs (group barrier)."""
        return bool(self._waiting) and (floor is None or self._waiting[0][0] <= floor)

    def _collect(self, tokens: list[int], logprobs: list[float]) -> list[GenResult]:
        """Append the step's token to every running row and end the finished ones: one pass over the rows (every
        step runs it; the host's work between two steps is time the device waits)."""
        assert self._cache is not None
        done: list[GenResult] = []
        ended: list[int] = []
        version, eos_ids, max_pos = self._version, self.eos_ids, -1
        for i, r in enumerate(self._rows):
            if r is None:
                continue
            token = tokens[i]
            out = r.tokens
            out.append(token)
            r.logprobs.append(logprobs[i])
            r.versions.append(version)
            r.seen.add(version)
            r.pos += 1
            req = r.req
            eos = token in eos_ids and not req.ignore_eos
            if eos or len(out) >= req.max_new_tokens:
                done.append(r.result("eos" if eos else "length"))
                ended.append(i)
                self._vacate(i, r)
            elif r.pos > max_pos:
                max_pos = r.pos
        self._max_pos = max_pos
        self._free(ended)
        return done

    def _vacate(self, i: int, row: _Running) -> None:
        """Row `i`'s request leaves it (finished or interrupted): the running counts without it."""
        self._rows[i] = None
        self._n_running -= 1
        self._n_greedy -= row.req.greedy
        group = row.req.group
        if group >= 0:
            self._running_groups[group] -= 1
            if self._running_groups[group] <= 0:
                del self._running_groups[group]
        self._finished(group)

    def _free(self, rows: list[int]) -> None:
        """These rows hold no request any more: position 0 from now on (a free row never outgrows the cache)."""
        if rows:
            assert self._cache is not None
            (idx,) = to_device(rows, device=self.device)
            self._live.index_fill_(0, idx, 0)  # the 0 a kernel's argument, not a host scalar copied (as in `_admit`)
            self._cache.lengths.index_fill_(0, idx, 0)

    def _finished(self, group: int) -> None:
        self._group_left[group] -= 1
        if self._group_left[group] <= 0:
            del self._group_left[group], self._group_size[group]

    def _maybe_compact(self) -> None:
        assert self._cache is not None
        n_free = len(self._rows) - self._n_running
        if n_free == len(self._rows):
            self._rows = []  # the storage stays allocated (and any captured graph valid)
        elif not self._admissible(self._running_floor()) and n_free >= self.compact_fraction * len(self._rows):
            keep = [i for i, r in enumerate(self._rows) if r is not None]
            (idx,) = to_device(keep, device=self.device)
            # a row's K/V fill the positions before its `pos`: only those move (not the cache's whole capacity)
            self._cache.keep(idx, width=self._max_pos)
            for t in (self._next, self._seeds, self._steps, self._live, self._greedy):
                t[: len(keep)] = t.index_select(0, idx)
            self._live[len(keep) :] = 0
            self._cache.lengths[len(keep) :] = 0
            self._rows = [self._rows[i] for i in keep]
            self.compactions += 1
