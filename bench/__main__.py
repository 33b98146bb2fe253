"""Run one benchmark or all of them.

    python -m bench <name> [--json] [--quick]     # one; --json prints exactly one JSON object on stdout
    python -m bench sim-accuracy --modes async --units 2,3   # a subset of its cases (default: all)
    python -m bench sim-accuracy --dp 2                      # … those whose trainer runs at dp 2
    python -m bench all [--quick]                 # every benchmark, human summaries

Each benchmark module exposes `run(*, quick: bool) -> dict` (the JSON object, including the
baselines it was compared with in the same run) and `summary(result: dict) -> str`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from rlctl.planner.simjob import MODES

# name -> module; imported only when that benchmark runs (some need optional extras or root).
BENCHES = {
    "planner": "bench.planner",
    "paper": "bench.paper",
    "sim-accuracy": "bench.sim_accuracy",
    "rpc": "bench.rpc",
    "broadcast": "bench.broadcast",
    "delta": "bench.delta",
    "checkpoint": "bench.checkpoint",
    "reward": "bench.reward",
    "pipeline": "bench.pipeline",
    "pipeline-parallel": "bench.pipeline_parallel",
    "dispatch": "bench.dispatch",
    "batching": "bench.batching",
    "demo": "bench.demo",
    "staleness": "bench.staleness",
    "staging": "bench.staging",
    "controller-age": "bench.controller_age",
    "controller-units": "bench.controller_units",
    "gpu-check": "bench.gpu_check",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench")
    ap.add_argument("name", choices=[*BENCHES, "all"])
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, for smoke tests")
    ap.add_argument("--modes", help="sim-accuracy: only these pipeline modes, e.g. async or sync,stream")
    ap.add_argument("--units", help="sim-accuracy: only cases with these rollout units, e.g. 2,3")
    ap.add_argument("--dp", help="sim-accuracy: only cases whose trainer has these data-parallel ranks, e.g. 2")
    args = ap.parse_args(argv)
    names = list(BENCHES) if args.name == "all" else [args.name]
    filters: dict[str, Any] = {}  # the subset options, for the one benchmark that has them
    if args.modes or args.units or args.dp:
        if names != ["sim-accuracy"]:
            ap.error("--modes, --units and --dp select sim-accuracy's cases; run `python -m bench sim-accuracy`")
        if args.modes:
            filters["modes"] = _choices(ap, "--modes", args.modes.split(","), MODES)
        if args.units:
            filters["units"] = [int(u) for u in _choices(ap, "--units", args.units.split(","), ("1", "2", "3"))]
        if args.dp:
            filters["dps"] = [int(d) for d in _choices(ap, "--dp", args.dp.split(","), ("1", "2"))]
    results = {}
    for name in names:
        t0 = time.monotonic()
        module = importlib.import_module(BENCHES[name])
        result = module.run(quick=args.quick, **filters)
        result.setdefault("bench", name)
        result["wall_s"] = round(time.monotonic() - t0, 2)
        results[name] = result
        if not args.json:
            print(f"== {name} ({result['wall_s']:.1f} s)\n{module.summary(result)}\n", flush=True)
    if args.json:
        out = results[names[0]] if len(names) == 1 else results
        sys.stdout.write(json.dumps(out, indent=2, default=str) + "\n")
    return 1 if any(r.get("failed") for r in results.values()) else 0  # a check that failed (gpu-check's `failed`)


def _choices(ap: argparse.ArgumentParser, flag: str, given: list[str], valid: Sequence[str]) -> list[str]:
    bad = [g for g in given if g not in valid]
    if bad:
        ap.error(f"{flag}: unknown {', '.join(map(repr, bad))}; valid: {', '.join(valid)}")
    return given


if __name__ == "__main__":
    sys.exit(main())
