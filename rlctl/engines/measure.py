"""Measured PTL(BS): seconds per continuous-batching decode step vs batch size, on a real engine.

For each batch size BS: a fresh engine with max_batch_size = BS, BS identical-length requests with
a `context_tokens`-token prompt that ignore EOS, a few warm-up steps (admission + prefill happen in
the first), then the median time of `steps` decode steps. This is what `rlctl profile --source
measured` reports for a local site (DESIGN §4: Latency = PTL(BS) × L_avg × ⌈M/BS⌉).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable

from rlctl.engines.base import GenerationEngine, GenRequest


def measure_ptl(engine_factory: Callable[[int], GenerationEngine], batch_sizes: Iterable[int],
                context_tokens: int, steps: int, *, warmup_steps: int = 3, prompt_token: int = 3,
                bos_token: int = 1, clock: Callable[[], float] = time.perf_counter) -> dict[int, float]:
    """{batch size: median seconds per decode step}; `engine_factory(bs)` builds an engine for bs rows.

    The KV length grows from `context_tokens` to `context_tokens + warmup_steps + steps` during the run.
    `clock=time.process_time` measures CPU time instead of wall time (one-thread engines on a shared machine).
    """
    if context_tokens < 1 or steps < 1:
        raise ValueError("context_tokens and steps must be ≥ 1")
    out: dict[int, float] = {}
    for bs in batch_sizes:
        engine = engine_factory(bs)
        prompt = [bos_token] + [prompt_token] * (context_tokens - 1)
        engine.add([GenRequest(f"ptl{bs}-{i}", prompt, warmup_steps + steps + 1, ignore_eos=True)
                    for i in range(bs)])
        for _ in range(warmup_steps):
            engine.step()
        times = []
        for _ in range(steps):
            t0 = clock()
            engine.step()
            times.append(clock() - t0)
        out[bs] = statistics.median(times)
    return out
