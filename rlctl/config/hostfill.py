"""How a job's GPUs fill a site's hosts: the one rule the planner prices and the launcher's `GpuPool` follows.

    trainer  ranks fill the hosts in inventory order, whole tensor-parallel groups per host: Megatron numbers
             the ranks tp fastest (then dp, then pp: `ParallelConfig.first_replica_ranks`), so a group is tp
             consecutive ranks and its all-reduces stay on one node's NVLink; pp and dp may cross hosts
             (`ranks_per_host`). A host's leftover of fewer than tp GPUs holds none of its groups.
    rollout  units fill the hosts one after the other, each on one host: in inventory order, but from the last
             host on a site the trainer shares, whose ranks fill the first hosts (`rollout_host_order`).

    6-GPU hosts, trainer 8 ranks at tp 4, 4 rollout units of 1 GPU on a shared site:
        host 1  [t t t t · ·]   ranks 0-3      leftover 2: counted as the trainer's slots, units reach it last
        host 2  [t t t t · ·]   ranks 4-7      leftover 2: the rollout's, after hosts 4 and 3
        host 3  [· · · · · ·]
        host 4  [r r r r · ·]   units fill from here

On a SLURM site SLURM places the ranks, `--ntasks-per-node` k of them on each of the job's nodes in order (block
distribution): k a multiple of tp that divides the ranks, so every node is full and no group straddles two
(`slurm_layout`: 12 ranks at tp 4 on 8-GPU nodes are 3 nodes × 4, not 2 × 6 with ranks 4-7 on both); at tp 1
at most k = ⌈ranks / nodes⌉ on each, the nodes counted among those with k GPUs (9 ranks: 2 nodes of ≤ 5). The
trainer's slots there are its ranks: SLURM gives the rest of those nodes to other jobs.

The planner counts a trainer's GPU slots (`trainer_slots`) as the hosts it moved past plus its ranks on the last
one, so that x rollout GPUs are the first x slots of `rollout_host_order`: the launcher puts units exactly there.
A host too small for one tp group (the plan's trainer tp: the job's trainer.tensor_parallel, or the split the planner
chose, priced at its own tp's order) is the rollout's, first in its order: hosts
[2, 8] with 8 ranks at tp 4 on the second leave the first's 2 GPUs to the rollout, and units go there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

PLACEMENT_HINT = (
    "use a trainer GPU count whose tp groups fit the hosts, or a trainer.tensor_parallel that divides their GPUs"
)


def rollout_host_order(
    hosts: Sequence[T], *, shares_trainer: bool, gpus: Sequence[int] | None = None, trainer_tp: int = 1
) -> list[T]:
    """`hosts` (inventory order) in the order rollout units fill them: from the last where the trainer shares the
    site (its ranks fill the first hosts, `ranks_per_host`), so that neither waits on the other's GPUs; there the
    hosts of fewer `gpus` than the trainer's tp come first (its groups pass over them whole: they are the
    rollout's, `trainer_slots`). `trainer_tp`: the plan's trainer tp (the job's trainer.tensor_parallel, or the
    planner's choice)."""
    if not shares_trainer:
        return list(hosts)
    sizes = list(gpus) if gpus is not None else [trainer_tp] * len(hosts)
    back = list(zip(hosts, sizes, strict=True))[::-1]
    return [h for h, g in back if g < trainer_tp] + [h for h, g in back if g >= trainer_tp]


def slurm_layout(host_gpus: Sequence[int], ranks: int, *, tp: int, gpus_per_task: int = 1) -> tuple[int, int] | None:
    """(nodes, tasks per node) of a SLURM job of `ranks` tasks on a site of nodes with `host_gpus` GPUs: the fewest
    nodes of at most k tasks each, k a multiple of tp, that many of the site's nodes holding k tasks (`--gres` asks
    every node for k tasks' GPUs). At tp > 1 k divides the ranks: SLURM takes `--ntasks-per-node` as a maximum and
    may split the tasks unevenly, and only full nodes keep block distribution's tasks i·k … (i+1)·k − 1, a whole
    number of groups, on node i. At tp 1 any split keeps a rank whole: k = ⌈ranks / nodes⌉, the last node(s) may
    hold fewer (9 ranks on 8-GPU nodes: 2 nodes of ≤ 5). None: no such k."""
    if ranks < 1:
        return 1, 1
    slots = [g // max(1, gpus_per_task) for g in host_gpus]
    cap = max(slots, default=0)
    for k in range(cap - cap % tp, 0, -tp):
        if tp > 1 and ranks % k:
            continue
        nodes = -(-ranks // k)
        k = -(-ranks // nodes)  # as even as they go (17 on 8-GPU nodes: 3 of ≤ 6, not 8 + 8 + 1); at tp > 1 k itself
        if nodes <= sum(s >= k for s in slots):
            return nodes, k
    return None


def ranks_per_host(host_gpus: Sequence[int], ranks: int, *, tp: int, slurm: bool = False) -> list[int] | None:
    """Trainer ranks on each host of `host_gpus` (free GPUs, inventory order): as many whole tp groups as a host
    holds before the next; None when the groups do not fit (`placement_error` says why). A last group of fewer
    than tp ranks (a tp that does not divide the ranks: `rlctl check` refuses it) goes where its ranks fit.
    `slurm`: the nodes `slurm_layout` asks for, in order (SLURM chooses which; their sizes are the inventory's)."""
    assert tp >= 1 and ranks >= 0
    if slurm:
        if (lay := slurm_layout(host_gpus, ranks, tp=tp)) is None:
            return None
        nodes, k = lay
        fit = [i for i, g in enumerate(host_gpus) if g >= k][:nodes]
        per = [0] * len(host_gpus)
        left = ranks
        for i in fit:
            per[i] = min(k, left)
            left -= per[i]
        return per if left == 0 else None
    out, left = [], ranks
    for g in host_gpus:
        n = left if left < tp and left <= g else min(left, g // tp * tp)
        out.append(n)
        left -= n
    return out if left == 0 else None


def trainer_slots(
    host_gpus: Sequence[int], ranks: int, *, tp: int, slurm: bool = False, order_tp: int = 1
) -> tuple[int, int] | None:
    """(GPU slots the trainer takes from the site, hosts it uses) with `ranks` at `tp` (`ranks_per_host`): every
    slot of the hosts before its last, leftovers included (rollout reaches them last, the planner not at all),
    plus its ranks on the last. = ranks where tp divides the GPUs of every host it fills. A host its groups pass
    over whole (fewer GPUs than tp) is the rollout's where the rollout reaches it first (`rollout_host_order` at
    `order_tp` = tp), else charged as a leftover. On a SLURM site (`slurm`) its ranks, on the nodes `slurm_layout`
    asks for. None: no placement."""
    per = ranks_per_host(host_gpus, ranks, tp=tp, slurm=slurm)
    if per is None:
        return None
    used = [i for i, n in enumerate(per) if n]
    if not used:
        return 0, 0
    if slurm:
        return ranks, len(used)
    last = used[-1]
    passed = sum(g for g, n in zip(host_gpus[:last], per, strict=False) if not n and g < min(tp, order_tp))
    return sum(host_gpus[:last]) - passed + per[last], len(used)


def placement_error(site: str, host_gpus: Sequence[int], ranks: int, *, tp: int, slurm: bool = False) -> str | None:
    """One line when `ranks` trainer ranks cannot sit at `tp` with each tp group on one host; None when they can."""
    if ranks_per_host(host_gpus, ranks, tp=tp, slurm=slurm) is not None:
        return None
    if slurm and ranks_per_host(host_gpus, ranks, tp=tp) is not None:
        sizes = "/".join(map(str, sorted(set(host_gpus))))
        if tp <= 1:
            return (
                f"site {site}: trainer {ranks} GPU(s) on SLURM ask n nodes for ⌈{ranks} / n⌉ ranks each (one "
                f"--ntasks-per-node, as many GPUs on every node); its {len(host_gpus)} node(s) of {sizes} GPUs hold "
                "no such n"
            )
        per_node = [k for k in range(tp, ranks + 1, tp) if ranks % k == 0]
        return (
            f"site {site}: trainer {ranks} GPU(s) at tp {tp} on SLURM need as many ranks on each node, a multiple of "
            f"tp dividing {ranks} ({', '.join(map(str, per_node))}), so that no tp group spans two nodes; its "
            f"{len(host_gpus)} node(s) of {sizes} GPUs hold none of those"
        )
    groups = sum(g // tp for g in host_gpus)
    counts = ", ".join(map(str, host_gpus))
    return (
        f"site {site}: trainer {ranks} GPU(s) at tp {tp} need {-(-ranks // tp)} tp group(s) of {tp} GPUs, each on one "
        f"host; its hosts have {counts} GPU(s) (free): room for {groups} group(s) ({groups * tp} GPUs)"
    )
