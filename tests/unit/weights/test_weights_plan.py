"""Broadcast planner: one copy per inter-DC link, load spread across roots, cycle-free fallbacks."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from rlctl.config.inventory import load_inventory
from rlctl.errors import PlanError
from rlctl.weights.plan import Endpoint, plan_broadcast, plan_from_inventory


def _descendants(plan, name):
    out, todo = set(), [name]
    while todo:
        for c in plan.children(todo.pop()):
            out.add(c)
            todo.append(c)
    return out


def _check_tree(plan):
    names = [e.name for e in (*plan.roots, *plan.receivers)]
    assert sorted(plan.order) == sorted(names)
    for r in plan.receivers:
        assert plan.order.index(plan.parent[r.name]) < plan.order.index(r.name)
        assert not set(plan.fallbacks[r.name]) & _descendants(plan, r.name)
        assert r.name not in plan.fallbacks[r.name] and plan.parent[r.name] not in plan.fallbacks[r.name]


def test_bench_topology_sends_one_copy_across_and_chains_inside():
    plan = plan_broadcast(
        [Endpoint("root", "A")], [Endpoint(n, "A" if n == "a1" else "B") for n in ["a1", "b1", "b2", "b3"]]
    )
    assert plan.parent == {"a1": "root", "b1": "root", "b2": "b1", "b3": "b2"}
    assert plan.inter_dc_edges() == [("root", "b1")]
    assert plan.fallbacks["b3"][:1] == ["b1"]  # same-DC ancestor first: no second crossing
    _check_tree(plan)


@pytest.mark.parametrize("num_roots,num_local", [(1, 5), (2, 5), (4, 9), (3, 2)])
def test_local_chains_spread_over_roots(num_roots, num_local):
    roots = [Endpoint(f"r{i}", "A") for i in range(num_roots)]
    recv = [Endpoint(f"a{i}", "A") for i in range(num_local)]
    plan = plan_broadcast(roots, recv)
    chain_len = Counter()
    for r in recv:
        top = r.name
        while plan.parent[top] not in {x.name for x in roots}:
            top = plan.parent[top]
        chain_len[plan.parent[top]] += 1
    sizes = [chain_len[r.name] for r in roots]
    assert sum(sizes) == num_local and max(sizes) - min(sizes) <= 1
    assert all(len(plan.children(n.name)) <= 1 for n in recv)  # chains: every relay sends once
    _check_tree(plan)


def test_one_copy_per_inter_dc_link_over_a_chain_of_datacenters():
    roots = [Endpoint("r0", "A"), Endpoint("r1", "A")]
    recv = [Endpoint(f"{dc}{i}", dc) for dc in "ABCD" for i in range(3)]
    links = {frozenset("AB"), frozenset("BC"), frozenset("BD")}
    plan = plan_broadcast(roots, recv, dc_links=links)
    dc = {e.name: e.datacenter for e in (*roots, *recv)}
    crossings = Counter(frozenset((dc[p], dc[c])) for p, c in plan.inter_dc_edges())
    assert crossings == Counter({frozenset("AB"): 1, frozenset("BC"): 1, frozenset("BD"): 1})
    _check_tree(plan)


def test_a_datacenter_listed_before_its_parent_datacenter_picks_its_sender_after_the_parents_chains():
    """Datacenters are planned in BFS order whatever the receivers' order: C's copy comes from B's least-loaded
    holder, counted after B's own chain (b0 → b1 → b2) is planned, not from b0, which already feeds b1."""
    links = {frozenset("AB"), frozenset("BC")}
    for order in (["b0", "b1", "b2", "c0"], ["c0", "b0", "b1", "b2"]):
        plan = plan_broadcast([Endpoint("root", "A")], [Endpoint(n, n[0].upper()) for n in order], dc_links=links)
        assert plan.parent["c0"] == "b2" and plan.children("b0") == ["b1"], order
        _check_tree(plan)


def test_trees_with_fanout():
    plan = plan_broadcast([Endpoint("r", "A")], [Endpoint(f"b{i}", "B") for i in range(7)], fanout=2)
    assert len(plan.inter_dc_edges()) == 1
    assert max(len(plan.children(f"b{i}")) for i in range(7)) == 2
    assert max(plan.depth(f"b{i}") for i in range(7)) == 3
    _check_tree(plan)


def test_unreachable_datacenter_and_no_root_are_plan_errors():
    with pytest.raises(PlanError, match=r"no inter-DC link path .* C"):
        plan_broadcast([Endpoint("r", "A")], [Endpoint("c", "C")], dc_links={frozenset("AB")})
    with pytest.raises(PlanError, match="at least one root"):
        plan_broadcast([], [Endpoint("c", "C")])


def test_plan_from_inventory_uses_sites_datacenters_and_links(tmp_path: Path):
    f = tmp_path / "inv.yaml"
    f.write_text(
        """
apiVersion: rlctl/v1
kind: Inventory
sites:
  h800: {datacenter: dc-a, scheduler: {kind: local}, gpu: H800, nodes: [{host: "t-[1-2]", gpus: 8}]}
  h20:  {datacenter: dc-b, scheduler: {kind: local}, gpu: H20, nodes: [{host: "r-[1-3]", gpus: 8}]}
links:
  - {between: [h800, h20], bandwidth_gbps: 80}
"""
    )
    inv = load_inventory([f])
    plan = plan_from_inventory(
        inv,
        [("t0", "h800", "tcp://t-1:1"), ("t1", "h800", "tcp://t-2:1")],
        [(f"r{i}", "h20", f"tcp://r-{i}:1") for i in range(1, 4)],
    )
    assert plan.inter_dc_edges() == [("t0", "r1")] and plan.endpoint("r2").address == "tcp://r-2:1"
    with pytest.raises(PlanError, match="unknown site 'h2O'"):
        plan_from_inventory(inv, [("t0", "h800", "")], [("x", "h2O", "")])


def test_receivers_are_planned_in_the_given_order_the_first_of_a_datacenter_relays():
    """Callers keep the order across versions to keep their relays (rlctl.agents.weights.receiver_order)."""
    recv = [Endpoint(n, "B") for n in ["b9", "b1", "b5"]]
    plan = plan_broadcast([Endpoint("r", "A")], recv)
    assert plan.parent == {"b9": "r", "b1": "b9", "b5": "b1"}
    assert [e.name for e in plan.receivers] == ["b9", "b1", "b5"]
    _check_tree(plan)


@pytest.mark.parametrize("chains", [2, 3])
def test_a_relay_feeds_several_chains_so_a_slow_unit_holds_back_only_its_own(chains):
    receivers = [Endpoint(f"b{i}", "B") for i in range(1, 8)]
    plan = plan_broadcast([Endpoint("root", "A")], receivers, dc_chains=chains)
    assert plan.inter_dc_edges() == [("root", "b1")]  # still one copy across
    assert sorted(plan.children("b1")) == [f"b{i}" for i in range(2, 2 + chains)]
    below_b2 = _descendants(plan, "b2")  # a slow b2 delays these only
    assert len(below_b2) == len(range(2 + chains, 8, chains)) and len(below_b2) < len(receivers) - 2
    depths = Counter(plan.depth(r.name) for r in receivers if r.name != "b1")
    assert max(depths) - 1 == -(-6 // chains)  # chain length: the 6 others dealt over `chains` chains
    _check_tree(plan)
    one = plan_broadcast([Endpoint("root", "A")], receivers, dc_chains=1)
    assert _descendants(one, "b2") == {f"b{i}" for i in range(3, 8)}  # one chain: everyone after b2
