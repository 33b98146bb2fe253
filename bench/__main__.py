"""Run one benchmark or all of them.

    python -m bench <name> [--json] [--quick]     # one; --json prints exactly one JSON object on stdout
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

# name -> module; imported only when that benchmark runs (some need optional extras or root).
BENCHES = {
    "planner": "bench.planner",
    "paper": "bench.paper",
    "sim-accuracy": "bench.sim_accuracy",
    "rpc": "bench.rpc",
    "broadcast": "bench.broadcast",
    "delta": "bench.delta",
    "pipeline": "bench.pipeline",
    "dispatch": "bench.dispatch",
    "batching": "bench.batching",
    "demo": "bench.demo",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench")
    ap.add_argument("name", choices=[*BENCHES, "all"])
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, for smoke tests")
    args = ap.parse_args(argv)
    names = list(BENCHES) if args.name == "all" else [args.name]
    results = {}
    for name in names:
        t0 = time.monotonic()
        module = importlib.import_module(BENCHES[name])
        result = module.run(quick=args.quick)
        result.setdefault("bench", name)
        result["wall_s"] = round(time.monotonic() - t0, 2)
        results[name] = result
        if not args.json:
            print(f"== {name} ({result['wall_s']:.1f} s)\n{module.summary(result)}\n", flush=True)
    if args.json:
        out = results[names[0]] if len(names) == 1 else results
        sys.stdout.write(json.dumps(out, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
