"""Start the ranks of a gloo group as processes of a rank script (one thread each, the repository importable):
`script RANK WORLD TP PP RENDEZVOUS [extra …] OUT [checkpoint …]`, OUT being `out(rank)`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def spawn_ranks(
    script: Path,
    *,
    world: int,
    tp: int,
    pp: int,
    rendezvous: Path,
    out: Callable[[int], Path],
    checkpoints: list[Path],
    extra: tuple[str, ...] = (),
) -> list[subprocess.Popen[str]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    head = [str(world), str(tp), str(pp), str(rendezvous), *extra]
    return [
        subprocess.Popen(
            [sys.executable, str(script), str(r), *head, str(out(r)), *map(str, checkpoints)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]


def run_rank_script(script: Path, world: int, args: Callable[[int], list[str]], *, timeout_s: float = 150) -> None:
    """Run `script RANK WORLD *args(RANK)` for every rank of a gloo group and wait: each must exit 0 (the tail of
    its stderr in the failure)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), str(world), *args(r)], env=env, stderr=subprocess.PIPE, text=True
        )
        for r in range(world)
    ]
    for p in procs:
        _, err = p.communicate(timeout=timeout_s)
        assert p.returncode == 0, err[-3000:]
