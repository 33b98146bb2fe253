"""`rlctl.launch.wholenodes`: SLURM jobs that take their nodes whole, each share on a node of its own, the rule both
`check` (`ops.noderoom.fit(whole=True)`) and the controller's scale (`Placement.whole_node_slots`) ask."""

from __future__ import annotations

import itertools
import random

from rlctl.launch.slurm import SlurmResources
from rlctl.launch.wholenodes import node_tasks, whole_nodes_hold


def test_a_jobs_tasks_fill_its_nodes_in_turn_and_the_rest_go_on_its_last() -> None:
    assert node_tasks(SlurmResources(nodes=2, tasks_per_node=4, tasks=6)) == [4, 2]
    assert node_tasks(SlurmResources(nodes=2, tasks_per_node=4)) == [4, 4]
    assert node_tasks(SlurmResources()) == [1]


def test_each_share_takes_a_node_of_its_own_however_small() -> None:
    assert whole_nodes_hold([(8,), (8,)], [(2,), (2,)]) is True
    assert whole_nodes_hold([(8,), (8,)], [(2,), (2,), (0,)]) is False  # the controller's job, no GPU, a node too
    assert whole_nodes_hold([(8,), (2,)], [(4,), (4,)]) is False
    assert whole_nodes_hold([], []) is True


def test_every_figure_is_compared() -> None:
    assert whole_nodes_hold([(8, 16, 100)], [(8, 16, 100)]) is True
    assert whole_nodes_hold([(8, 16, 100)], [(8, 17, 100)]) is False
    assert whole_nodes_hold([(8, 16, 100)], [(8, 16, 101)]) is False


def test_a_share_placed_first_moves_for_one_that_fits_only_its_node() -> None:
    """(4, 5) takes the first node with room, (4, 40); (4, 30) fits only that one: the first moves to (8, 10)."""
    assert whole_nodes_hold([(4, 40), (8, 10)], [(4, 5), (4, 30)]) is True
    assert whole_nodes_hold([(4, 40), (8, 10)], [(4, 5), (4, 30), (1, 1)]) is False


def _brute(rooms: list[tuple[int, ...]], shares: list[tuple[int, ...]]) -> bool:
    return any(
        all(all(w <= r for w, r in zip(s, room, strict=True)) for s, room in zip(shares, pick, strict=True))
        for pick in itertools.permutations(rooms, len(shares))
    )


def test_it_agrees_with_every_placement_tried() -> None:
    rng = random.Random(7)
    for _ in range(400):
        dims = rng.choice((1, 2, 3))
        rooms = [tuple(rng.randint(0, 4) for _ in range(dims)) for _ in range(rng.randint(0, 5))]
        shares = [tuple(rng.randint(0, 4) for _ in range(dims)) for _ in range(rng.randint(0, 5))]
        assert whole_nodes_hold(rooms, shares) is _brute(rooms, shares), (rooms, shares)


def test_gpus_alone_the_i_th_largest_share_fits_the_i_th_largest_node() -> None:
    """The controller's rule before it asked this module (`_whole_nodes_hold`), on many nodes."""
    rng = random.Random(11)
    for _ in range(300):
        hosts = [rng.choice((2, 4, 8)) for _ in range(rng.randint(1, 40))]
        shares = [rng.randint(0, 8) for _ in range(rng.randint(0, 45))]
        sorted_rule = len(shares) <= len(hosts) and all(
            s <= g for s, g in zip(sorted(shares, reverse=True), sorted(hosts, reverse=True), strict=False)
        )
        assert whole_nodes_hold([(g,) for g in hosts], [(s,) for s in shares]) is sorted_rule
