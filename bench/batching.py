"""How the engine and the trainer cut their batches, measured on this CPU (one thread, like an agent).

- `engine`: consecutive iterations of long-tailed requests (lognormal lengths, median 30, σ 0.8,
  cap 200, as in DESIGN §10) on one `EmbeddedEngine` at batch 64, the next iteration queued as soon
  as the previous one is admitted (what a one-step-async rollout unit sees), at 64 and 128 requests
  per iteration. `group_barrier` "always": the next iteration starts after the previous one's last
  row; "never": it fills freed rows at once; "auto" (the default): "always" for an iteration larger
  than the batch, else "never". CPU µs per generated token, and the ratios.
- `train`: one GRPO step over 128 samples with those lengths, micro-batches cut by 32 rows (the old
  cut) vs by a 1024 padded-token budget; seconds (median of 5) and the ratio.

Process CPU time, not wall time: the machine is shared.
"""

from __future__ import annotations

import math
import random
import statistics
import tempfile
import time
from typing import Any

import torch

from rlctl.config.algorithm import GrpoAlgorithm
from rlctl.engines.base import GenRequest
from rlctl.engines.embedded import GROUP_BARRIERS, EmbeddedEngine, GroupBarrier
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.grpo import GrpoLearner
from rlctl.rl.samples import Sample

PROMPT = [1, 5, 6, 7, 9]


def _length(rng: random.Random, cap: int = 200) -> int:
    return min(cap, max(2, int(math.exp(rng.gauss(math.log(30), 0.8)))))


def _iteration(it: int, rng: random.Random, n: int) -> list[GenRequest]:
    lengths = [_length(rng) for _ in range(n)]
    return [
        GenRequest(f"{it}-{i}", PROMPT, ln, priority=float(ln), group=it, ignore_eos=True)
        for i, ln in enumerate(lengths)
    ]


def engine_cpu_per_token(
    model: TinyGPT, *, barrier: GroupBarrier, iterations: int, per_iteration: int
) -> dict[str, float]:
    engine = EmbeddedEngine(model, max_batch_size=64, temperature=1.0, seed=0, group_barrier=barrier)
    engine.trace = []
    rng = random.Random(0)
    tokens, queued = 0, 0
    t0 = time.process_time()
    while queued < iterations or engine.has_work():
        if queued < iterations and engine.num_waiting() == 0:
            engine.add(_iteration(queued, rng, per_iteration))
            queued += 1
        tokens += sum(len(r.output_tokens) for r in engine.step())
    cpu = time.process_time() - t0
    return {
        "cpu_s": round(cpu, 3),
        "tokens": tokens,
        "us_per_token": round(cpu / tokens * 1e6, 1),
        "steps": len(engine.trace),
        "mean_rows": round(sum(engine.trace) / len(engine.trace), 1),
    }


def train_seconds(*, rows: int, tokens: int | None, repeats: int) -> float:
    rng = random.Random(1)
    samples = []
    for i in range(128):
        n = _length(rng, cap=256)
        samples.append(Sample(f"p{i // 8}", PROMPT, [10] * n, [-0.1] * n, rng.random()))
    torch.manual_seed(0)
    learner = GrpoLearner(
        TinyGPT(), GrpoAlgorithm(kind="grpo", lr=1e-6), micro_batch_samples=rows, micro_batch_tokens=tokens
    )
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        learner.step(samples)
        times.append(time.process_time() - t0)
    return statistics.median(times)


def run(*, quick: bool) -> dict[str, Any]:
    torch.set_num_threads(1)
    tokens_per_size, repeats = (2 * 128, 3) if quick else (10 * 128, 5)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="rlctl-bench-batching-") as tmp:
        TinyGPT().save_pretrained(tmp)
        model = TinyGPT.from_pretrained(tmp).eval()
    engine: dict[str, Any] = {"max_batch_size": 64}
    for per_iteration in (64, 128):
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in GROUP_BARRIERS}
        for _ in range(2):  # alternated: load on the machine drifts; the better of two is kept
            for mode in GROUP_BARRIERS:
                runs[mode].append(
                    engine_cpu_per_token(
                        model, barrier=mode, iterations=tokens_per_size // per_iteration, per_iteration=per_iteration
                    )
                )
        best = {m: min(v, key=lambda r: r["us_per_token"]) for m, v in runs.items()}
        us = {m: best[m]["us_per_token"] for m in GROUP_BARRIERS}
        engine[str(per_iteration)] = {
            **best,
            "never_over_always": round(us["never"] / us["always"], 3),
            "auto_over_best": round(us["auto"] / min(us["always"], us["never"]), 3),
        }
    rows_s = train_seconds(rows=32, tokens=None, repeats=repeats)
    budget_s = train_seconds(rows=32, tokens=1024, repeats=repeats)
    return {
        "engine": engine,
        "train": {
            "samples": 128,
            "rows_32_s": round(rows_s, 4),
            "tokens_1024_s": round(budget_s, 4),
            "rows_over_tokens": round(rows_s / budget_s, 3),
        },
    }


def summary(result: dict[str, Any]) -> str:
    e, t = result["engine"], result["train"]
    lines = ["engine, long-tailed requests, batch 64, µs CPU per token (rows per step):"]
    for n in ("64", "128"):
        r = e[n]
        lines.append(
            f"  {n:>3} per iteration: always {r['always']['us_per_token']:.1f} ({r['always']['mean_rows']})   "
            f"never {r['never']['us_per_token']:.1f} ({r['never']['mean_rows']})   auto "
            f"{r['auto']['us_per_token']:.1f}   never/always {r['never_over_always']:.2f}   "
            f"auto/best {r['auto_over_best']:.2f}"
        )
    lines.append(
        f"train step, {t['samples']} samples: 32-row cuts {t['rows_32_s']:.3f} s   1024-token cuts "
        f"{t['tokens_1024_s']:.3f} s   ratio {t['rows_over_tokens']:.2f}"
    )
    return "\n".join(lines)
