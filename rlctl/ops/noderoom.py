"""Whether SLURM jobs fit a site's nodes together: each job's share of a node (GPUs, cores, memory) on a node
that has it left, a job's shares on distinct nodes (its `--nodes`), as SLURM must place them to run them at once.

    nodes (wholenodes.node_room: the inventory's gpus, cpus, memory_gb per host) ─┐
    shares (shares_of: one per job and node it takes)                           ├─▶ fit() ─▶ True / False / None

An exact search: the largest shares first, each tried on every node with room, nodes alike (the same room left,
the same jobs on them) tried once; it gives up (None) past a step budget rather than guess. Whole nodes (a site's
`scheduler.exclusive`: one share a node) are `rlctl.launch.wholenodes`'s matching, which never gives up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlctl.launch.slurm import SlurmResources
from rlctl.launch.wholenodes import node_shares, whole_nodes_hold

STEP_BUDGET = 20_000
MAX_SHARES = 400  # deeper than this the search (one frame a share) is not tried


@dataclass(frozen=True)
class Share:
    """What one SLURM job (`job`) takes of one node."""

    job: int
    gpus: int
    cores: int
    mem_mib: int

    @property
    def size(self) -> tuple[int, int, int]:
        return (self.gpus, self.cores, self.mem_mib)


def shares_of(job: int, res: SlurmResources) -> list[Share]:
    """The node shares of one SLURM job (`launch.wholenodes.node_shares`: its tasks on each of its nodes)."""
    return [Share(job, *size) for size in node_shares(res)]


class _GaveUp(Exception):
    pass


def fit(
    nodes: Sequence[tuple[int, int, int]], shares: Sequence[Share], *, whole: bool = False, budget: int = STEP_BUDGET
) -> bool | None:
    """Whether every share can be placed on `nodes` at once (`whole`: one job's share on a node at most, as
    sbatch's `--exclusive` gives each job its nodes: `launch.wholenodes`, the rule the controller's scale asks too,
    exact and never given up); None when the search gave up (too many shares, or past `budget` steps)."""
    if whole:
        return whole_nodes_hold(nodes, [s.size for s in shares])
    if len(shares) > MAX_SHARES:
        return None
    order = sorted(shares, key=lambda s: s.size, reverse=True)
    free = [list(n) for n in nodes]
    held: list[set[int]] = [set() for _ in nodes]
    steps = 0

    def place(i: int) -> bool:
        nonlocal steps
        if i == len(order):
            return True
        s, tried = order[i], set()
        for j, room in enumerate(free):
            key = (tuple(room), frozenset(held[j]))
            if s.job in held[j] or key in tried or any(r < w for r, w in zip(room, s.size, strict=True)):
                continue
            tried.add(key)
            steps += 1
            if steps > budget:
                raise _GaveUp
            for d, w in enumerate(s.size):
                room[d] -= w
            held[j].add(s.job)
            if place(i + 1):
                return True
            for d, w in enumerate(s.size):
                room[d] += w
            held[j].discard(s.job)
        return False

    try:
        return place(0)
    except _GaveUp:
        return None
