"""Does the controller's cost grow with the job's age? Its core (`ControllerCore`, the ledger, the sample log) driven
through many iterations of an async job (η = 1; 64 prompts × 8 samples an iteration, prompts of 128 tokens), the
rollout units and the trainer answered in process at once, so that only the controller's own work is timed.

Read at every `every`-th iteration, and compared between the first reading and the last of this run:

- `ledger_entries`: the entries the ledger holds;
- `checkpoint_s`, `checkpoint_bytes`: the ledger's JSON, as the controller takes it when a checkpoint is due
  (`json.dumps(ledger.to_json())`, on the controller's loop);
- `status_s`: what `rlctl status` and the summary read of the ledger (`counts`, each unit's `inflight`);
- `core_cpu_ms_per_iteration`: the core's CPU time per iteration over the last `every` iterations (dispatch,
  results, delivery, acks, retiring);
- `rss_mb`: the process's resident memory.

`*_growth` = last ÷ first (1.0: flat); `rss_mb_added` = last − first. A job of weeks runs 10⁴–10⁵ iterations;
this runs 10³ (`--quick`: 10²).
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from rlctl.agents.core import ControllerCore
from rlctl.agents.coretypes import CoreConfig, Out, PromptSpec
from rlctl.agents.samplelog import SampleLog

PROMPTS, SAMPLES, PROMPT_TOKENS, UNITS = 64, 8, 128, 4


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class _Job:
    """The agents around the core, answering at once: units finish what they are given, the trainer trains an
    iteration as soon as it holds all of it, units apply each version as it comes."""

    def __init__(self, core: ControllerCore, seed: int = 0, *, units: int = UNITS) -> None:
        self.core, self.rng = core, random.Random(seed)
        self.per_iteration = core.cfg.prompts_per_iteration * core.cfg.samples_per_prompt
        self.version = {f"r{k}": 0 for k in range(units)}
        self.held: dict[int, list[str]] = {}
        self.trainer_at = 0
        self.todo: deque[Out] = deque()

    def until(self, iteration: int) -> None:
        """Answer the core's messages until the trainer has trained `iteration` iterations."""
        while self.trainer_at < iteration:
            if not self.todo:
                raise RuntimeError(f"the driven job stopped at iteration {self.trainer_at}")
            o = self.todo.popleft()
            if o.kind == "generate":
                for r in o.header["requests"]:
                    self.todo += self.core.sample(
                        o.to,
                        sample_id=r["sample_id"],
                        version=self.version[o.to],
                        output_tokens=self.rng.randint(16, 512),
                        payload=None,
                        reward=float(self.rng.random() < 0.5),
                        attempt=r["attempt"],
                    )
            elif o.kind == "samples":
                for s in o.header["samples"]:
                    self.held.setdefault(s["iteration"], []).append(s["sample_id"])
            if len(self.held.get(self.trainer_at, ())) == self.per_iteration:
                ids = self.held.pop(self.trainer_at)
                self.trainer_at += 1
                v = self.trainer_at
                self.todo += self.core.trained(iteration=v - 1, version=v, sample_ids=ids, stats={})
                for unit in self.version:
                    self.version[unit] = v
                    self.todo += self.core.weights_applied(unit, v)


def _prompts(rng: random.Random, prompts: int = PROMPTS) -> Any:
    def make(it: int) -> list[PromptSpec]:
        return [
            PromptSpec(f"r{it}-{j}", [rng.randrange(32000) for _ in range(PROMPT_TOKENS)], true_len=64)
            for j in range(prompts)
        ]

    return make


def _reading(core: ControllerCore, it: int, cpu_ms: float) -> dict[str, Any]:
    t = time.perf_counter()
    text = json.dumps(core.ledger.to_json())
    checkpoint_s = time.perf_counter() - t
    t = time.perf_counter()
    core.ledger.counts(completed_iterations=core.trainer_version)
    for unit in core.units:
        core.ledger.inflight(unit)
    status_s = time.perf_counter() - t
    return {
        "iteration": it,
        "ledger_entries": len(core.ledger.entries),
        "checkpoint_bytes": len(text),
        "checkpoint_s": round(checkpoint_s, 5),
        "status_s": round(status_s, 5),
        "core_cpu_ms_per_iteration": round(cpu_ms, 3),
        "rss_mb": round(_rss_mb(), 1),
    }


def run(*, quick: bool = False) -> dict[str, Any]:
    return measure(*((100, 20) if quick else (1000, 100)))


def measure(iterations: int, every: int) -> dict[str, Any]:
    """The core driven through `iterations` iterations, read every `every`."""
    cfg = CoreConfig(
        iterations=iterations + 1,
        prompts_per_iteration=PROMPTS,
        samples_per_prompt=SAMPLES,
        max_new_tokens=512,
        mode="async",
        eta=1,
        dispatch="skew_aware",
        min_units=UNITS,
    )
    rng = random.Random(0)
    core = ControllerCore(cfg, prompts=_prompts(rng), predict=lambda specs: [64.0] * len(specs))
    with tempfile.TemporaryDirectory() as tmp:
        log = SampleLog(Path(tmp) / "samples.jsonl")
        core.on_retire = log.write  # as the controller does
        job = _Job(core)
        job.todo += core.join("trainer-0", role="trainer", version=0)
        for unit in job.version:
            job.todo += core.join(unit, role="rollout", version=0)
        readings = []
        for it in range(every, iterations + 1, every):
            cpu0 = time.process_time()
            job.until(it)
            readings.append(_reading(core, it, (time.process_time() - cpu0) * 1000 / every))
        log_bytes = log.size()
        log.close()
    return _result(readings, iterations=iterations, log_bytes=log_bytes)


def _result(readings: list[dict[str, Any]], *, iterations: int, log_bytes: int) -> dict[str, Any]:
    first, last = readings[0], readings[-1]
    growth = {
        f"{k}_growth": round(last[k] / first[k], 2) if first[k] else None
        for k in ("ledger_entries", "checkpoint_bytes", "checkpoint_s", "status_s", "core_cpu_ms_per_iteration")
    }
    return {
        "iterations": iterations,
        "samples": iterations * PROMPTS * SAMPLES,
        "samples_log_bytes": log_bytes,
        **growth,
        "rss_mb_added": round(last["rss_mb"] - first["rss_mb"], 1),
        "readings": readings,
    }


def summary(result: dict[str, Any]) -> str:
    first, last = result["readings"][0], result["readings"][-1]
    lines = [
        f"controller over {result['iterations']} iterations ({result['samples']:,} samples): "
        f"iteration {first['iteration']} → {last['iteration']}",
    ]
    for k in ("ledger_entries", "checkpoint_bytes", "checkpoint_s", "status_s", "core_cpu_ms_per_iteration", "rss_mb"):
        lines.append(f"  {k:28s} {first[k]:>12} → {last[k]:>12}")
    lines.append(f"  sample log {result['samples_log_bytes'] / 2**20:.1f} MiB on disk")
    return "\n".join(lines)
