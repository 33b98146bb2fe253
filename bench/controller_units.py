"""Does the controller's cost per iteration grow with its rollout units? Its core (`ControllerCore`) driven through an
async job (η 4; 256 prompts × 8 samples an iteration, prompts of 128 tokens) by 4, 16 and 64 units, answered in
process at once as in `bench.controller_age`, so that only the controller's own work is timed.

Each unit's `weights_applied` runs a dispatch share (`Admission._assign`, balanced with what every unit holds) and a
migration look (`Migrating.migrate(now=True)`): a weight version brings as many of each as there are units, and each
read every sample in flight. Per unit count:

- `core_cpu_ms_per_iteration`: the core's CPU time per iteration, over `iterations` iterations after two to warm up;
- `weights_applied_ms`: its CPU time per `weights_applied` (the share, the look), over the same iterations;
- `in_flight`: the samples dispatched and not finished when the last iteration was trained.

`per_iteration_growth` = the most units' figure ÷ the fewest's (1.0: flat). Here the units finish their work at once,
so they are idle at each version: the migration looks weigh splitting work with them (the costlier case).
"""

from __future__ import annotations

import random
import time
from typing import Any

from bench.controller_age import _Job, _prompts
from rlctl.agents.core import ControllerCore
from rlctl.agents.coretypes import CoreConfig

SAMPLES, ETA = 8, 4


def run(*, quick: bool = False) -> dict[str, Any]:
    if quick:
        return measure((4, 16), prompts=32, iterations=3)
    return measure((4, 16, 64), prompts=256, iterations=6)


def measure(units: tuple[int, ...], *, prompts: int, iterations: int) -> dict[str, Any]:
    """The core driven by each count of `units` through `iterations` iterations of `prompts` × SAMPLES samples."""
    rows = [_drive(n, prompts=prompts, iterations=iterations) for n in units]
    first, last = rows[0], rows[-1]
    return {
        "samples_per_iteration": prompts * SAMPLES,
        "eta": ETA,
        "iterations": iterations,
        "per_iteration_growth": round(last["core_cpu_ms_per_iteration"] / first["core_cpu_ms_per_iteration"], 2),
        "units": rows,
    }


def _drive(units: int, *, prompts: int, iterations: int) -> dict[str, Any]:
    cfg = CoreConfig(
        iterations=2 + iterations + 2 * ETA,  # rounds still created through the iterations timed
        prompts_per_iteration=prompts,
        samples_per_prompt=SAMPLES,
        max_new_tokens=512,
        mode="async",
        eta=ETA,
        dispatch="skew_aware",
        min_units=units,
    )
    core = ControllerCore(cfg, prompts=_prompts(random.Random(0), prompts), predict=lambda specs: [64.0] * len(specs))
    applied = [0.0, 0]  # CPU seconds in weights_applied, calls
    timed = core.weights_applied

    def weights_applied(name: str, version: int) -> Any:
        t0 = time.process_time()
        try:
            return timed(name, version)
        finally:
            applied[0] += time.process_time() - t0
            applied[1] += 1

    job = _Job(core, units=units)
    job.todo += core.join("trainer-0", role="trainer", version=0)
    for unit in job.version:
        job.todo += core.join(unit, role="rollout", version=0)
    job.until(2)  # the first rounds dispatched, every unit at work
    core.weights_applied = weights_applied  # type: ignore[method-assign]
    cpu0 = time.process_time()
    job.until(2 + iterations)
    cpu = time.process_time() - cpu0
    return {
        "units": units,
        "core_cpu_ms_per_iteration": round(cpu * 1000 / iterations, 1),
        "weights_applied_ms": round(applied[0] * 1000 / max(applied[1], 1), 3),
        "in_flight": sum(1 for _ in core.ledger.all_running()),
    }


def summary(result: dict[str, Any]) -> str:
    lines = [
        f"controller core, {result['samples_per_iteration']:,} samples an iteration (η {result['eta']}), "
        f"{result['iterations']} iterations per unit count:"
    ]
    for r in result["units"]:
        lines.append(
            f"  {r['units']:3d} units: {r['core_cpu_ms_per_iteration']:8.1f} ms of CPU an iteration, "
            f"{r['weights_applied_ms']:7.3f} ms a weights_applied, {r['in_flight']:,} in flight"
        )
    lines.append(f"  growth, most units over fewest: {result['per_iteration_growth']}×")
    return "\n".join(lines)
