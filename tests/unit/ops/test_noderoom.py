"""`rlctl.ops.noderoom.fit`: SLURM jobs' node shares placed on a site's nodes, each job's on distinct nodes."""

from __future__ import annotations

from rlctl.launch.slurm import SlurmResources
from rlctl.launch.wholenodes import UNBOUNDED
from rlctl.ops.noderoom import Share, fit, shares_of


def test_a_jobs_shares_take_distinct_nodes_and_the_rest_goes_on_its_last() -> None:
    res = SlurmResources(nodes=2, tasks_per_node=4, cpus_per_task=2, gpus_per_task=1, mem_per_cpu_mb=10, tasks=6)
    assert shares_of(3, res) == [Share(3, 4, 8, 80), Share(3, 2, 4, 40)]
    two_nodes = [(8, 16, UNBOUNDED), (8, 16, UNBOUNDED)]
    assert fit(two_nodes, shares_of(3, res)) is True
    assert fit(two_nodes[:1], shares_of(3, res)) is False  # one node would hold both of its shares: not SLURM's


def test_a_gres_jobs_last_node_is_asked_as_many_gpus_as_every_other() -> None:
    # `--gres=gpu:gpus_per_task×tasks_per_node` is per node, the partly filled last one too: its 2 tasks were counted
    # as 2 GPUs, and a node with 2 GPUs free passed the check for a job SLURM could not place
    res = SlurmResources(nodes=2, tasks_per_node=4, cpus_per_task=2, gpus_per_task=1, tasks=6, gpu_request="gres")
    assert shares_of(3, res) == [Share(3, 4, 8, 0), Share(3, 4, 4, 0)]
    assert fit([(8, 16, UNBOUNDED), (2, 16, UNBOUNDED)], shares_of(3, res)) is False
    assert fit([(8, 16, UNBOUNDED), (4, 16, UNBOUNDED)], shares_of(3, res)) is True


def test_a_packing_found_only_off_the_greedy_path_is_found() -> None:
    """Largest first onto the first node with room: 5 + 4 cores on node 1, 4 + 3 + 2 on node 2, and the last 2 has
    no node (1 core left on each); 5 + 3 + 2 and 4 + 4 + 2 fit."""
    nodes = [(8, 10, UNBOUNDED), (8, 10, UNBOUNDED)]
    shares = [Share(k, 1, cores, 0) for k, cores in enumerate((5, 4, 4, 3, 2, 2))]
    assert fit(nodes, shares) is True
    assert fit(nodes, [*shares, Share(9, 0, 1, 0)]) is False


def test_the_search_gives_up_rather_than_guess() -> None:
    nodes = [(1, 10 + k, UNBOUNDED) for k in range(12)]  # no two alike: every node tried for every share
    shares = [Share(k, 1, 1, 0) for k in range(13)]  # one more than there are GPUs
    assert fit(nodes, shares, budget=1000) is None
    assert fit(nodes[:3], shares[:4]) is False


def test_whole_nodes_are_told_where_the_search_gave_up() -> None:
    """One share a node (an exclusive site) is a matching that never gives up: the search gave up (None, and check
    passed) on 13 shares for 12 unlike nodes past its budget, and on more than MAX_SHARES shares."""
    nodes = [(1, 10 + k, UNBOUNDED) for k in range(12)]
    shares = [Share(k, 1, 1, 0) for k in range(13)]
    assert fit(nodes, shares, whole=True, budget=1000) is False
    assert fit(nodes, shares[:12], whole=True, budget=1000) is True
    many = [(8, 64, UNBOUNDED)] * 450
    assert fit(many, [Share(k, 2, 8, 0) for k in range(450)], whole=True) is True
    assert fit(many, [Share(k, 2, 8, 0) for k in range(451)], whole=True) is False
