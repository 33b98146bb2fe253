"""Start the ranks of a gloo group as processes of a rank script (one thread each, the repository importable):
`script RANK WORLD TP PP RENDEZVOUS [extra …] OUT [checkpoint …]`, OUT being `out(rank)`.

Each rank is forked from the session's zygote, which imported torch and megatron-core once (`zygote.py`), or is
a process of its own where the zygote cannot fork; either way `python script ARGS` with its own environment."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.unit.trainers.zygote import ForkedRank, ForkedRanks

ROOT = Path(__file__).resolve().parents[3]
# PYTHONFAULTHANDLER: a rank killed by a signal (a segfault in a gloo or publisher thread) leaves every
# thread's stack in its stderr, which the failing test prints
ENV = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"}
FORKED = ForkedRanks(env={**os.environ, **ENV})

Rank = subprocess.Popen[str] | ForkedRank


def start_rank(script: Path, argv: list[str], env: dict[str, str]) -> Rank:
    """`python script ARGV` with `env`: a fork of the zygote, else a process (stderr readable by `communicate`)."""
    forked = FORKED.start(script, argv, env)
    if forked is not None:
        return forked
    return subprocess.Popen([sys.executable, str(script), *argv], env=env, stderr=subprocess.PIPE, text=True)


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
) -> list[Rank]:
    env = {**os.environ, **ENV}
    head = [str(world), str(tp), str(pp), str(rendezvous), *extra]
    return [start_rank(script, [str(r), *head, str(out(r)), *map(str, checkpoints)], env) for r in range(world)]


def run_rank_script(script: Path, world: int, args: Callable[[int], list[str]], *, timeout_s: float = 150) -> None:
    """Run `script RANK WORLD *args(RANK)` for every rank of a gloo group and wait: each must exit 0 (the tail of
    its stderr in the failure)."""
    env = {**os.environ, **ENV}
    procs = [start_rank(script, [str(r), str(world), *args(r)], env) for r in range(world)]
    for p in procs:
        _, err = p.communicate(timeout=timeout_s)
        assert p.returncode == 0, err[-3000:]
