"""Whether SLURM jobs that take their nodes whole (sbatch's `--exclusive`: a site's `scheduler.exclusive`) fit a
site's nodes at once: each job's share of a node on a node of its own with room for it in every figure compared.

    rooms  (one per node: GPUs, or GPUs, cores, MiB) ─┐
    shares (one per job and node it takes)           ├─▶ whole_nodes_hold() ─▶ True / False

The one rule `check` (`rlctl.ops.noderoom.fit(whole=True)`: GPUs, cores and memory) and the controller's scale
(`rlctl.agents.placement.Placement.whole_node_slots`: GPUs alone) ask; here, below both (the agents may not import
the operator side). Each caller gives the figures it compares.

A bipartite matching (shares to nodes), exact and never given up: shares alike and nodes alike are counted together,
and a share with no node left moves shares already placed to other nodes that fit them (an augmenting path), so a
packing found only off the largest-first path is found.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from rlctl.launch.slurm import SlurmResources


def node_tasks(res: SlurmResources) -> list[int]:
    """A SLURM job's tasks on each of its nodes: `tasks_per_node` on each, the rest on the last (as
    `SlurmResources.for_spec` lays them out, SLURM's block distribution)."""
    per, tasks = max(1, res.tasks_per_node), res.ntasks
    return [per] * (tasks // per) + ([tasks % per] if tasks % per else [])


def whole_nodes_hold(rooms: Sequence[Sequence[int]], shares: Sequence[Sequence[int]]) -> bool:
    """Whether every share fits a node of its own at once: share `s` on a node of room `r` when each figure of `s`
    is at most `r`'s (both the same figures, in the same order)."""
    if len(shares) > len(rooms):
        return False
    need = Counter(tuple(s) for s in shares)
    have = Counter(tuple(r) for r in rooms)
    kinds, nodes = list(need), list(have)
    fits = [[all(w <= r for w, r in zip(s, room, strict=True)) for room in nodes] for s in kinds]
    free = [have[n] for n in nodes]  # empty nodes of each room
    on = [[0] * len(nodes) for _ in kinds]  # on[a][b]: shares of kind a placed on nodes of room b

    def make_room(b: int, seen: set[int]) -> bool:
        """Take a node of room `b`: an empty one, else one whose share moves to a node of another room."""
        seen.add(b)
        if free[b]:
            free[b] -= 1
            return True
        for a in range(len(kinds)):
            if not on[a][b]:
                continue
            for b2 in range(len(nodes)):
                if fits[a][b2] and b2 not in seen and make_room(b2, seen):
                    on[a][b] -= 1
                    on[a][b2] += 1
                    return True
        return False

    for a, kind in enumerate(kinds):
        for _ in range(need[kind]):
            seen: set[int] = set()
            b = next((b for b in range(len(nodes)) if fits[a][b] and b not in seen and make_room(b, seen)), None)
            if b is None:
                return False
            on[a][b] += 1
    return True
