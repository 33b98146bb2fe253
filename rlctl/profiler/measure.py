"""Measured profiles: decode PTL(BS) and prefill of a real generation engine, on this machine.

For each (context C, batch size BS) of the grid: an empty engine with room for BS rows, BS requests
with a C-token prompt that ignore EOS, one step that admits and prefills them (timed: prefill),
`warmup_steps` untimed steps, then `steps` timed decode steps whose median is PTL(BS) at C (each
request has one token left: the engine is dropped, or emptied by the factory before its next use).
The engine comes from a factory (`bs → engine`), so the same code measures the embedded CPU engine
(a fresh one per batch size), a vLLM engine (one engine reused: it takes ~20 s to start), or a fake
with a fake clock in tests. `probe.py` picks the engines a profile measures; `measure_train.py`
measures the training side.
"""

from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from rlctl.errors import RlctlError, UsageError
from rlctl.models.catalog import ModelArch
from rlctl.profiler.profile import GenerationEntry


class Engine(Protocol):
    """The part of `rlctl.engines.base.GenerationEngine` a measurement drives (imported lazily: needs torch)."""

    def add(self, requests: list[Any]) -> None: ...

    def step(self) -> list[Any]: ...


LOCAL_CONTEXTS = [16, 64, 160]
LOCAL_MAX_CONTEXT = 640  # a job's longest context measured on a CPU: 4 × the grid's top (probe.contexts_for)
BOS_TOKEN, PROMPT_TOKEN = 1, 3
LOCAL_BATCHES = [1, 2, 4, 8, 16, 32, 64, 128]


def measure_generation(
    engine_factory: Callable[[int], Engine],
    *,
    contexts: Sequence[int],
    batch_sizes: Sequence[int],
    kv_capacity_tokens: int,
    steps: int = 8,
    warmup_steps: int = 2,
    clock: Callable[[], float] = time.perf_counter,
    compact_fraction: float | None = None,
    padded_attention: bool = False,
) -> GenerationEntry:
    """One profile entry (TP = 1) measured on engines from `engine_factory`.

    `clock` may be `time.thread_time` on a busy machine (one-thread engines: CPU time, not wall time).
    `compact_fraction` records the engine's row-compaction rule for the simulator (default: the
    engine's own `compact_fraction` attribute, if it has one); `padded_attention` that a step attends
    over the batch's longest context (the embedded engine) rather than each row's own (paged, vLLM).
    """
    gen_request = importlib.import_module("rlctl.engines.base").GenRequest
    if steps < 1 or warmup_steps < 0:
        raise ValueError("steps must be ≥ 1 and warmup_steps ≥ 0")
    grid: list[list[float]] = []
    prefill: list[tuple[float, float]] = []  # (prompt tokens admitted in one step, extra seconds)
    for ctx in contexts:
        row = []
        for bs in batch_sizes:
            engine = engine_factory(bs)
            if compact_fraction is None:
                compact_fraction = getattr(engine, "compact_fraction", None)
            prompt = [BOS_TOKEN] + [PROMPT_TOKEN] * (ctx - 1)
            engine.add(
                [
                    gen_request(f"prof-{ctx}-{bs}-{i}", prompt, 1 + warmup_steps + steps + 1, ignore_eos=True)
                    for i in range(bs)
                ]
            )
            t0 = clock()
            engine.step()  # admission + prefill + first decode step
            first = clock() - t0
            for _ in range(warmup_steps):
                engine.step()
            times = []
            for _ in range(steps):
                t0 = clock()
                engine.step()
                times.append(clock() - t0)
            ptl = statistics.median(times)
            row.append(ptl)
            prefill.append((bs * max(ctx - 1, 1), max(first - ptl, 0.0)))
        grid.append(row)
    fixed_s, per_token_s = _fit_line(prefill)
    return GenerationEntry(
        tp=1,
        contexts=list(contexts),
        batch_sizes=list(batch_sizes),
        ptl_s=grid,
        prefill_s_per_token=per_token_s,
        prefill_fixed_s=fixed_s,
        kv_capacity_tokens=kv_capacity_tokens,
        compact_fraction=compact_fraction,
        padded_attention=padded_attention,
    )


def _fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares a + b·x with a, b ≥ 0 (prefill: fixed cost per admitting step + cost per token)."""
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    if len(set(xs)) < 2:
        return 0.0, max(ys[0] / max(xs[0], 1.0), 0.0)
    b = max(0.0, statistics.linear_regression(xs, ys).slope)
    a = max(0.0, statistics.fmean(ys) - b * statistics.fmean(xs))
    return a, b


def require_embedded_model(model: ModelArch) -> None:
    """UsageError unless the embedded engine can run `model` (it runs the built-in tiny model only)."""
    if model.name != "tiny-demo":
        raise UsageError(
            f"measured profiles run the embedded engine, which runs 'tiny-demo' only; got {model.name!r}",
            hint="use --source analytical for other models",
        )


def embedded_engine_factory(model: ModelArch) -> Callable[[int], Engine]:
    """Engines of the embedded CPU engine running the built-in tiny model (random weights: speed only)."""
    require_embedded_model(model)
    try:
        net = importlib.import_module("rlctl.models.tinygpt").TinyGPT()
    except ImportError as e:
        raise RlctlError(
            f"--source measured on a local site needs the embedded engine (rlctl.engines.embedded): {e}",
            hint="use --source analytical until it is installed",
        ) from e
    return embedded_engines_on(net)


def embedded_engines_on(net: Any) -> Callable[[int], Engine]:
    """A fresh embedded engine per batch size on the loaded model `net` (a TinyGPT: tiny-demo or HF)."""
    embedded = importlib.import_module("rlctl.engines.embedded")
    return lambda bs: embedded.EmbeddedEngine(net, max_batch_size=bs, temperature=1.0, seed=0)


def vllm_engine_factory(engine: Any) -> Callable[[int], Engine]:
    """Batch sizes ≤ `engine.max_batch_size` measured on one running `VllmEngine`: vLLM's batch is
    whatever is queued, up to its bound, so BS requests on an empty engine run at batch BS."""

    def factory(bs: int) -> Engine:
        if bs > engine.max_batch_size:
            raise ValueError(f"batch size {bs} > the vLLM engine's max_batch_size {engine.max_batch_size}")
        engine.abort_all()  # leftovers of an interrupted measurement
        return engine

    return factory


def start_vllm_for_profile(
    model_dir: str | Path, *, contexts: Sequence[int], batch_sizes: Sequence[int], **llm_kwargs: Any
) -> Any:
    """A warmed-up `VllmEngine` on `model_dir` for `measure_generation`: room for the largest batch,
    every prompt of a batch prefilled in its first step (no chunking), no prefix cache (the
    profile's prompts are identical: cache hits would make prefill look free)."""
    try:
        vllm_engine = importlib.import_module("rlctl.engines.vllm")
    except ImportError as e:
        raise RlctlError(f"--source measured with the vllm engine needs rlctl.engines.vllm: {e}") from e
    max_bs = max(batch_sizes)
    kwargs = {
        "enable_prefix_caching": False,
        "max_num_batched_tokens": max(max_bs * max(contexts), 2048),
        **llm_kwargs,
    }
    try:
        engine = vllm_engine.VllmEngine(model_dir, max_batch_size=max_bs, temperature=1.0, seed=0, **kwargs)
    except ImportError as e:
        raise RlctlError(str(e), hint="use --source analytical, or the embedded engine") from e
    # vLLM's first step at a new shape costs seconds (allocation, kernel set-up): not part of a profile
    gen_request = importlib.import_module("rlctl.engines.base").GenRequest
    prompt = [BOS_TOKEN] + [PROMPT_TOKEN] * (max(contexts) - 1)
    engine.add([gen_request(f"prof-warmup-{i}", prompt, 2, ignore_eos=True) for i in range(max_bs)])
    engine.run_until_done()
    return engine


def vllm_kv_capacity_tokens(engine: Any) -> int | None:
    """Tokens of KV cache vLLM allocated (cache blocks × block size), None if it does not say."""
    cache = engine.llm.llm_engine.vllm_config.cache_config
    blocks = getattr(cache, "num_gpu_blocks", None)
    return int(blocks * cache.block_size) if blocks else None


def measure_vllm(
    model_dir: str | Path,
    *,
    contexts: Sequence[int],
    batch_sizes: Sequence[int],
    kv_capacity_tokens: int,
    steps: int = 8,
    warmup_steps: int = 2,
    clock: Callable[[], float] = time.perf_counter,
    **llm_kwargs: Any,
) -> GenerationEntry:
    """PTL(BS) and prefill of vLLM on the HF checkpoint `model_dir`, on this host (paged attention:
    each row attends over its own length). The KV capacity is vLLM's own (its cache blocks) when it
    reports one, else `kv_capacity_tokens`."""
    engine = start_vllm_for_profile(model_dir, contexts=contexts, batch_sizes=batch_sizes, **llm_kwargs)
    entry = measure_generation(
        vllm_engine_factory(engine),
        contexts=contexts,
        batch_sizes=batch_sizes,
        kv_capacity_tokens=vllm_kv_capacity_tokens(engine) or kv_capacity_tokens,
        steps=steps,
        warmup_steps=warmup_steps,
        clock=clock,
        padded_attention=False,
    )
    engine.abort_all()
    return entry
