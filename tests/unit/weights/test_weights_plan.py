"""Broadcast planner: one copy per inter-DC link, load spread across roots, cycle-free fallbacks."""

from __future__ import annotations

import random
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
  h800: {datacenter: dc-a, scheduler: {kind: ssh}, gpu: H800, nodes: [{host: "t-[1-2]", gpus: 8}]}
  h20:  {datacenter: dc-b, scheduler: {kind: ssh}, gpu: H20, nodes: [{host: "r-[1-3]", gpus: 8}]}
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


def _host_copies(plan) -> tuple[Counter, Counter]:
    """Copies into and out of each host (the host part of each endpoint's address) over the plan's edges."""
    host = {e.name: e.address.split("//")[1].rsplit(":", 1)[0] for e in (*plan.roots, *plan.receivers)}
    cross = [(host[p], host[c]) for c, p in plan.parent.items() if host[p] != host[c]]
    return Counter(b for _, b in cross), Counter(a for a, _ in cross)


def test_one_copy_reaches_each_host_however_many_ranks_and_units_it_holds():
    """8 trainer ranks on t1 and 16 units on r1 and r2: every rank rooted a chain of units dealt round-robin, so
    all 16 edges crossed hosts (t1 sent 8 copies, r1 took 8 and sent 8). Now one copy goes into each host, whose
    first unit relays it to the next host and down a chain of its own host's units."""
    roots = [Endpoint(f"trainer-{i}", "A", f"tcp://t1:{9000 + i}") for i in range(8)]
    recv = [Endpoint(f"u{i}", "A", f"tcp://r{1 + i // 8}:{9100 + i}") for i in range(16)]
    plan = plan_broadcast(roots, recv)
    into, out_of = _host_copies(plan)
    assert into == Counter({"r1": 1, "r2": 1}) and out_of == Counter({"t1": 1, "r1": 1})
    assert plan.parent["u0"] == "trainer-0" and plan.parent["u8"] == "u0"  # host relays: a chain across hosts
    assert [plan.parent[f"u{i}"] for i in range(1, 8)] == [f"u{i}" for i in range(7)]  # r1's chain, behind u0
    _check_tree(plan)


def test_ranks_on_several_hosts_share_the_other_hosts_and_units_beside_ranks_stay_on_their_host():
    """Ranks on t1 and t2 (shared site: u0, u1 sit on t2 beside its ranks); units on r1…r4: each rank host
    carries two of the other hosts, and t2's own units hang below t2's ranks over the loopback."""
    roots = [Endpoint(f"trainer-{i}", "A", f"tcp://t{1 + i // 2}:{9000 + i}") for i in range(4)]
    recv = [Endpoint("u0", "A", "tcp://t2:9200"), Endpoint("u1", "A", "tcp://t2:9201")]
    recv += [Endpoint(f"v{i}", "A", f"tcp://r{1 + i // 2}:{9100 + i}") for i in range(8)]
    plan = plan_broadcast(roots, recv)
    into, out_of = _host_copies(plan)
    assert into == Counter({f"r{i}": 1 for i in range(1, 5)})
    assert out_of["t1"] + out_of["t2"] == 2 and min(out_of["t1"], out_of["t2"]) == 1
    assert {plan.parent["u0"], plan.parent["u1"]} == {"trainer-2", "trainer-3"}  # round-robin on t2's ranks
    _check_tree(plan)


@pytest.mark.parametrize("chains", [1, 2, 3])
def test_a_relays_chains_are_chains_of_hosts(chains):
    """Another datacenter's relay heads `chains` chains of whole hosts: each host takes one copy (with the units
    dealt round-robin, b2 and b3 took one per chain that crossed them)."""
    recv = [Endpoint(f"b{i}", "B", f"tcp://h{1 + i // 8}:{9100 + i}") for i in range(24)]
    plan = plan_broadcast([Endpoint("root", "A", "tcp://t1:9000")], recv, dc_links={frozenset("AB")}, dc_chains=chains)
    into, out_of = _host_copies(plan)
    assert into == Counter({"h1": 1, "h2": 1, "h3": 1}) and plan.inter_dc_edges() == [("root", "b0")]
    assert out_of["h1"] == min(chains, 2)  # the relay's host sends one copy per chain of other hosts
    _check_tree(plan)


def test_random_plans_take_one_copy_into_each_host_and_one_across_each_link():
    rng = random.Random(7)
    for _ in range(300):
        dcs = "ABC"[: rng.randint(1, 3)]
        hosts = {dc: [f"{dc}{h}" for h in range(rng.randint(1, 4))] for dc in dcs}
        roots = [Endpoint(f"r{i}", "A", f"tcp://{rng.choice(hosts['A'])}:{i}") for i in range(rng.randint(1, 4))]
        recv = [
            Endpoint(f"u{i}", dc, f"tcp://{rng.choice(hosts[dc])}:{100 + i}")
            for i, dc in enumerate(rng.choices(dcs, k=rng.randint(1, 20)))
        ]
        plan = plan_broadcast(roots, recv, fanout=rng.choice([1, 1, 2]), dc_chains=rng.randint(1, 3), dc_links=None)
        _check_tree(plan)
        into, _ = _host_copies(plan)
        assert max(into.values(), default=0) <= 1, into
        used = Counter(
            frozenset((plan.endpoint(p).datacenter, plan.endpoint(c).datacenter)) for p, c in plan.inter_dc_edges()
        )
        assert max(used.values(), default=0) <= 1, used


def test_of_two_equally_short_datacenter_routes_the_tree_takes_one_whatever_order_the_units_joined_in():
    """A reaches D over B or over C (two links each): D's copy comes through B (neighbours in name order), the route
    `planner.weightsync.weight_route` prices, whichever datacenter's units come first in the plan; versus through
    whichever of B and C was listed first (units in D, C, B order: through C)."""
    links = {frozenset(p) for p in ("AB", "AC", "BD", "CD")}
    root = [Endpoint("r", "A")]
    for order in ("DCB", "BCD", "CDB"):
        plan = plan_broadcast(root, [Endpoint(f"u{dc}", dc) for dc in order], dc_links=links)
        assert plan.parent["uD"] == "uB", order
