"""Measured profiles: decode PTL(BS) and prefill of a real generation engine, on this machine.

For each (context C, batch size BS) of the grid: a fresh engine with room for BS rows, BS requests
with a C-token prompt that ignore EOS, one step that admits and prefills them (timed: prefill),
`warmup_steps` untimed steps, then `steps` timed decode steps whose median is PTL(BS) at C.
The engine comes from a factory (`bs → engine`), so the same code measures the embedded CPU engine,
a vLLM engine, or a fake with a fake clock in tests.
"""

from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from rlctl.errors import RlctlError, UsageError
from rlctl.modelcatalog import ModelArch
from rlctl.profiler.profile import GenerationEntry


class Engine(Protocol):
    """The part of `rlctl.engines.base.GenerationEngine` a measurement drives (imported lazily: needs torch)."""

    def add(self, requests: list[Any]) -> None: ...

    def step(self) -> list[Any]: ...


LOCAL_CONTEXTS = [16, 64, 160]
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
        embedded = importlib.import_module("rlctl.engines.embedded")
        net = importlib.import_module("rlctl.engines.model").TinyGPT()
    except ImportError as e:
        raise RlctlError(
            f"--source measured on a local site needs the embedded engine (rlctl.engines.embedded): {e}",
            hint="use --source analytical until it is installed",
        ) from e
    return lambda bs: embedded.EmbeddedEngine(net, max_batch_size=bs, temperature=1.0, seed=0)
