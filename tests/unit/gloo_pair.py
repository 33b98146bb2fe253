"""Two ranks of a gloo group as spawned processes of this test's own functions (versus `trainers/ranks.py`: rank
scripts, forked from a zygote)."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from pathlib import Path
from typing import Any


def spawned_pair(
    target: Callable[..., None], rendezvous: Path, *args: Any, results: int, timeout_s: float
) -> list[Any]:
    """Run `target(rank, init, *args, out)` in two spawned processes (`init`: a file rendezvous at `rendezvous`) and
    return the first `results` items they put on the queue `out`; each must exit 0. Spawned, not forked: a fork of a
    threaded pytest worker can deadlock in the child."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init = f"file://{rendezvous}"
    procs = [ctx.Process(target=target, args=(r, init, *args, out), daemon=True) for r in (0, 1)]
    for p in procs:
        p.start()
    got = [out.get(timeout=timeout_s) for _ in range(results)]
    for p in procs:
        p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0, 0]
    return got
