"""The generation microbenchmark of `rlctl profile --source measured`, run where the site's engines run.

    rlctl profile ──backend(site).start──▶ python -m rlctl.profiler.probe --model M --kv-capacity-tokens N --out F
                  ◀── F (JSON: one GenerationEntry) on storage the site shares with the operator ──

A local site runs it in-process; a SLURM or SSH site through its launch backend, like an agent.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from rlctl.errors import RlctlError
from rlctl.modelcatalog import BUILTIN_MODELS, ModelArch
from rlctl.profiler.measure import LOCAL_BATCHES, LOCAL_CONTEXTS, embedded_engine_factory, measure_generation
from rlctl.profiler.profile import GenerationEntry


def measure_here(arch: ModelArch, *, kv_capacity_tokens: int) -> GenerationEntry:
    """PTL(BS) and prefill of the embedded engine on this host, one engine thread (one "GPU" slot)."""
    import torch

    torch.set_num_threads(1)
    # CPU time of the (single) engine thread: other work on the machine does not inflate the profile;
    # the embedded engine attends over the batch's max length (padded attention)
    return measure_generation(
        embedded_engine_factory(arch),
        contexts=LOCAL_CONTEXTS,
        batch_sizes=LOCAL_BATCHES,
        kv_capacity_tokens=kv_capacity_tokens,
        clock=time.thread_time,
        padded_attention=True,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlctl.profiler.probe")
    ap.add_argument("--model", required=True, choices=sorted(BUILTIN_MODELS))
    ap.add_argument("--kv-capacity-tokens", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        entry = measure_here(BUILTIN_MODELS[args.model], kv_capacity_tokens=args.kv_capacity_tokens)
    except RlctlError as e:
        sys.stderr.write(f"rlctl profile probe: {e}\n")
        return 1
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps({"host": os.uname().nodename, "generation": entry.model_dump(mode="json")}))
    tmp.replace(args.out)  # whole or absent: the operator never reads half a file
    return 0


if __name__ == "__main__":
    sys.exit(main())
