"""Whether SLURM jobs that take their nodes whole (sbatch's `--exclusive`: a site's `scheduler.exclusive`) fit a
site's nodes at once: each job's share of a node on a node of its own with room for it in every figure compared.

    rooms  (node_room: GPUs, cores, MiB per host)        ─┐
    shares (node_shares: one per job and node it takes) ├─▶ whole_nodes_hold() ─▶ True / False

The one rule `check` (`rlctl.ops.noderoom.fit(whole=True)`) and the controller's scale
(`rlctl.agents.placement.Placement.whole_node_slots`) ask, both with the figures of `node_room` and `node_shares`
(GPUs, cores and memory); here, below both (the agents may not import the operator side). Where they do not fit,
`figures_short` says which figures keep them out (by the same rule, those figures left out): scale's refusal names
them.

A bipartite matching (shares to nodes), exact and never given up: shares alike and nodes alike are counted together,
and a share with no node left moves shares already placed to other nodes that fit them (an augmenting path), so a
packing found only off the largest-first path is found.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import combinations

from rlctl.config.inventory import Site
from rlctl.launch.slurm import SlurmResources

UNBOUNDED = 1 << 62  # a figure the inventory leaves out: not compared
FIGURES = ("GPUs", "cores", "MiB")  # what node_room and node_shares give, in their order
FIGURE = ("GPU", "core", "MiB")  # one of each


def figure_said(count: int, index: int) -> str:
    """`count` of figure `index` (as in FIGURES), its noun as the count asks: '1 GPU', '8 GPUs', '1 core',
    '2,048 MiB'."""
    return f"{count:,} {(FIGURE if count == 1 else FIGURES)[index]}"


def node_room(site: Site) -> list[tuple[int, int, int]]:
    """Each host's (GPUs, cores, MiB); a figure some node leaves out is unbounded on all (not compared)."""
    cpus = all(n.cpus is not None for n in site.nodes)
    mem = all(n.memory_gb is not None for n in site.nodes)
    return [
        (
            n.gpus,
            n.cpus if cpus and n.cpus is not None else UNBOUNDED,
            int(n.memory_gb * 1e9 / 2**20) if mem and n.memory_gb is not None else UNBOUNDED,
        )
        for n in site.nodes
        for _ in n.hosts
    ]


def node_tasks(res: SlurmResources) -> list[int]:
    """A SLURM job's tasks on each of its nodes: `tasks_per_node` on each, the rest on the last (as
    `SlurmResources.for_spec` lays them out, SLURM's block distribution)."""
    per, tasks = max(1, res.tasks_per_node), res.ntasks
    return [per] * (tasks // per) + ([tasks % per] if tasks % per else [])


def node_shares(res: SlurmResources) -> list[tuple[int, int, int]]:
    """What one SLURM job takes of each of its nodes (GPUs, cores, MiB; `node_tasks`). On a `gpu_request: gres`
    site every node is asked `--gres=gpu:gpus_per_task×tasks_per_node`, the last one too however few tasks it holds
    (counted by its tasks, a check passed a job SLURM could not place)."""
    per = max(1, res.tasks_per_node)
    gres = res.gpu_request == "gres"
    return [
        (
            (per if gres else n) * res.gpus_per_task,
            n * res.cpus_per_task,
            n * res.cpus_per_task * (res.mem_per_cpu_mb or 0),
        )
        for n in node_tasks(res)
    ]


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


def figures_short(rooms: Sequence[Sequence[int]], shares: Sequence[Sequence[int]]) -> list[tuple[int, ...]] | None:
    """Which of the figures `whole_nodes_hold` compares keep `shares` from fitting `rooms`: the smallest sets of them
    (indexes, as in FIGURES) each of which, left out of the comparison, lets them fit (cores alone: [(1,)]; GPUs
    or cores, no node left with both: [(0,), (1,)]); [] where they fit; None where nothing left out does (more
    shares than nodes: each takes a node of its own)."""
    if whole_nodes_hold(rooms, shares):
        return []
    width = len(rooms[0]) if rooms else 0
    for size in range(1, width + 1):
        found = []
        for out in combinations(range(width), size):
            keep = [i for i in range(width) if i not in out]
            if whole_nodes_hold([[r[i] for i in keep] for r in rooms], [[s[i] for i in keep] for s in shares]):
                found.append(out)
        if found:
            return found
    return None
