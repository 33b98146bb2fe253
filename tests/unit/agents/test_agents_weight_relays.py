"""Relays of the job's weight plane stay put across membership changes: a unit that joins attaches below
its datacenter's units (no second copy across the inter-DC link, even for the version in flight), a lost
relay is replaced by the next unit, names sort numerically, the inventory's links shape the tree (a version
they cannot carry is routed around them alone, said once), and a delta-mode node keeps the versions an
on-demand delta for a unit one version behind needs."""

from __future__ import annotations

import logging

import torch

from rlctl.agents.weights import Target, WeightPublisher, natural_key, plan_version, weight_node
from rlctl.config.runtime import WeightSync
from rlctl.errors import PlanError
from rlctl.transport import Connection, InprocTransport, Listener, Transport
from rlctl.weights.plan import BroadcastPlan

ROOTS = ["tcp://t0:1"]


def _target(name: str, dc: str, host: str) -> Target:
    return Target(f"tcp://{host}:1", f"tcp://{host}:2/{name}", dc)  # one weight node per unit, on `host`


def _chain(plan: BroadcastPlan, top: str) -> list[str]:
    out = [top]
    while kids := plan.children(out[-1]):
        assert len(kids) == 1
        out.append(kids[0])
    return out


DC_B = {"rollout-0": ("dc-b", "h1"), "rollout-1": ("dc-b", "h1"), "rollout-2": ("dc-b", "h2")}
JOINERS = {"rollout-10": ("dc-b", "h1"), "rollout-9": ("dc-b", "h0")}  # h0 sorts before every host


def _targets(spec: dict[str, tuple[str, str]]) -> dict[str, Target]:
    return {n: _target(n, dc, h) for n, (dc, h) in spec.items()}


def test_names_and_hosts_sort_numerically():
    assert sorted(["rollout-10", "rollout-2", "rollout-1"], key=natural_key) == ["rollout-1", "rollout-2", "rollout-10"]
    plan = plan_version(ROOTS, "dc-a", _targets({n: ("dc-b", "h1") for n in ["rollout-10", "rollout-2", "rollout-1"]}))
    assert _chain(plan, "rollout-1") == ["rollout-1", "rollout-2", "rollout-10"]
    plan = plan_version(ROOTS, "dc-a", _targets({"rollout-0": ("dc-b", "node10"), "rollout-1": ("dc-b", "node9")}))
    assert plan.inter_dc_edges() == [("trainer-0", "rollout-1")]  # node9 < node10


def test_newcomers_attach_below_their_datacenter_and_the_relay_stays():
    first = plan_version(ROOTS, "dc-a", _targets(DC_B))
    assert first.inter_dc_edges() == [("trainer-0", "rollout-0")]
    second = plan_version(ROOTS, "dc-a", _targets(DC_B | JOINERS), previous=first)
    assert second.inter_dc_edges() == [("trainer-0", "rollout-0")]  # not rollout-9, whose host sorts first
    # one copy into each host: rollout-10 below its host's units, rollout-9 (a host of its own) after h2's relay
    assert _chain(second, "rollout-1") == ["rollout-1", "rollout-10"] and second.parent["rollout-1"] == "rollout-0"
    assert _chain(second, "rollout-2") == ["rollout-2", "rollout-9"] and second.parent["rollout-2"] == "rollout-0"
    assert second.fallbacks["rollout-9"][0] == "rollout-0"  # same-DC holders before any other datacenter's


def test_a_lost_relay_is_replaced_by_the_next_unit_of_its_datacenter():
    first = plan_version(ROOTS, "dc-a", _targets(DC_B | JOINERS))  # h0's unit first: rollout-9 is the relay
    assert first.inter_dc_edges() == [("trainer-0", "rollout-9")]
    alive = {n: t for n, t in _targets(DC_B | JOINERS).items() if n != "rollout-9"}
    second = plan_version(ROOTS, "dc-a", alive, previous=first)
    assert second.inter_dc_edges() == [("trainer-0", "rollout-0")]
    assert {n: second.parent[n] for n in ("rollout-1", "rollout-10", "rollout-2")} == {
        "rollout-1": "rollout-0",  # h1's units below the relay, on its host
        "rollout-10": "rollout-1",
        "rollout-2": "rollout-0",  # h2's copy: one, from the relay's host
    }
    # a unit that joins the relay's host later still goes below it
    third = plan_version(ROOTS, "dc-a", alive | _targets({"rollout-3": ("dc-b", "h0")}), previous=second)
    assert third.inter_dc_edges() == [("trainer-0", "rollout-0")]


def test_the_inventory_links_shape_the_tree_over_three_datacenters():
    spec = {f"rollout-{i}": (dc, "h1") for i, dc in enumerate(["dc-b", "dc-b", "dc-c", "dc-c"])}
    links = {frozenset(("dc-a", "dc-b")), frozenset(("dc-b", "dc-c"))}  # dc-c only through dc-b
    plan = plan_version(ROOTS, "dc-a", _targets(spec), dc_links=links)
    dc = {n: d for n, (d, _) in spec.items()} | {"trainer-0": "dc-a"}
    assert sorted((dc[p], dc[c]) for p, c in plan.inter_dc_edges()) == [("dc-a", "dc-b"), ("dc-b", "dc-c")]


class _Unit:
    """A rollout unit's control connection: what the publisher tells it, one announcement at a time."""

    def __init__(self, transport: Transport, name: str, dc: str, host: str) -> None:
        self.listener: Listener = transport.listen("inproc://")
        self.target = Target(self.listener.address, _target(name, dc, host).weights, dc)
        self._conn: Connection | None = None

    def told(self) -> tuple[int, str]:
        """(version, first holder) of the next `weights_available`."""
        if self._conn is None:
            self._conn = self.listener.accept(timeout_s=10)
        msg = self._conn.recv(10)
        assert msg.kind == "weights_available"
        return int(msg.header["version"]), msg.header["holders"][0]


def test_a_publisher_keeps_one_copy_into_the_datacenter_as_units_join_mid_version_and_the_relay_is_lost():
    transport = InprocTransport(secret=b"k" * 16)
    sync = WeightSync(mode="delta", chunk_bytes=4096, chains_per_datacenter=1)  # one chain: who is below whom
    pub = WeightPublisher(transport, listen="inproc://", sync=sync, timeout_s=10)
    trainer = pub.node.address
    units = {n: _Unit(transport, n, dc, h) for n, (dc, h) in (DC_B | JOINERS).items()}
    by_weights = {u.target.weights: n for n, u in units.items()} | {trainer: "trainer"}
    sd = {"w": torch.zeros(1000)}

    def tell(names: list[str]) -> None:
        pub.set_targets({n: units[n].target for n in names}, datacenter="dc-a")

    def parents(names: list[str], version: int) -> dict[str, str]:
        out = {}
        for n in names:
            v, holder = units[n].told()
            assert v == version, (n, v)
            out[n] = by_weights[holder]
        return out

    try:
        tell(list(DC_B))
        pub.publish(1, sd)
        # one copy into each host: h2's unit pulls from the relay's host, not down h1's chain
        assert parents(list(DC_B), 1) == {"rollout-0": "trainer", "rollout-1": "rollout-0", "rollout-2": "rollout-0"}
        # two units join while v1 is in flight: they pull it inside dc-b, not from the trainer again
        tell([*DC_B, *JOINERS])
        assert parents(list(JOINERS), 1) == {"rollout-10": "rollout-1", "rollout-9": "rollout-2"}
        pub.publish(2, {"w": sd["w"] + 1})
        got = parents(list(units), 2)
        assert [n for n, p in got.items() if p == "trainer"] == ["rollout-0"]  # the relay stayed
        # the relay is lost: the next unit of dc-b becomes the one that pulls from the trainer
        tell([n for n in units if n != "rollout-0"])
        pub.publish(3, {"w": sd["w"] + 2})
        got = parents([n for n in units if n != "rollout-0"], 3)
        assert [n for n, p in got.items() if p == "trainer"] == ["rollout-1"]
        assert pub.plan is not None and pub.plan.inter_dc_edges() == [("trainer-0", "rollout-1")]
    finally:
        pub.close()
        for u in units.values():
            u.listener.close()


def test_a_delta_job_node_serves_a_unit_that_skipped_a_version_a_delta():
    transport = InprocTransport(secret=b"k" * 16)
    sync = WeightSync(mode="delta", chunk_bytes=4096)
    root, unit = (weight_node(transport, "inproc://", sync, timeout_s=10) for _ in range(2))
    try:
        torch.manual_seed(0)
        w = torch.randn(20000)
        root.publish(1, {"w": w})
        unit.fetch(1, [root.address])
        for v in (2, 3):
            w = w + 1e-3 * torch.randn_like(w) * (torch.rand_like(w) < 0.05)
            root.publish(v, {"w": w})
        got = unit.fetch(3, [root.address])  # skipped v2: the root still holds v1, its base
        assert got.received_encoding == "delta"
        assert torch.equal(got.weights, root.store.versions[3].weights)
    finally:
        root.close()
        unit.close()
    full = weight_node(transport, "inproc://", WeightSync(mode="full"), timeout_s=10)
    assert full.cfg.keep_versions == 2  # full mode never encodes deltas: no third copy of the weights
    full.close()


def test_links_that_leave_a_datacenter_unreached_do_not_stop_the_publisher(caplog):
    """The inventory links the trainer's datacenter to dc-b only, and a unit sits in dc-c: the plan over those
    links fails, so the publisher says so and routes as if every pair were linked — every unit still hears."""
    transport = InprocTransport(secret=b"k" * 16)
    pub = WeightPublisher(transport, listen="inproc://", sync=WeightSync(mode="full", chunk_bytes=4096), timeout_s=10)
    units = {n: _Unit(transport, n, dc, "h0") for n, dc in (("rollout-0", "dc-b"), ("rollout-1", "dc-c"))}
    try:
        pub.set_targets(
            {n: u.target for n, u in units.items()}, datacenter="dc-a", dc_links={frozenset(("dc-a", "dc-b"))}
        )
        with caplog.at_level(logging.WARNING, logger="rlctl.agents.weights"):
            pub.publish(1, {"w": torch.zeros(100)})
            assert [u.told()[0] for u in units.values()] == [1, 1]
        assert "no inter-DC link path from the trainer datacenter(s) to dc-c" in caplog.text
    finally:
        pub.close()
        for u in units.values():
            u.listener.close()


LINKS_ABC = {frozenset(("dc-a", "dc-b")), frozenset(("dc-b", "dc-c"))}  # dc-c only through dc-b


def test_a_relay_datacenter_empty_for_one_version_then_back_routes_the_next_over_the_declared_links(monkeypatch):
    """dc-c is linked through dc-b only. dc-b's unit is lost and v2 is published: v2 cannot go through dc-b, so it
    alone goes to dc-c straight from the trainer. dc-b's replacement joins while v2 is being planned (the members
    message lands on the trainer's thread meanwhile): v3 goes trainer → dc-b → dc-c again, versus every later
    version routed as if every pair of datacenters were linked (trainer → dc-c, a link the job did not declare)."""
    transport = InprocTransport(secret=b"k" * 16)
    pub = WeightPublisher(transport, listen="inproc://", sync=WeightSync(mode="full", chunk_bytes=4096), timeout_s=10)
    spec = {"rollout-0": ("dc-b", "h1"), "rollout-1": ("dc-c", "h2"), "rollout-2": ("dc-b", "h3")}
    units = {n: _Unit(transport, n, dc, h) for n, (dc, h) in spec.items()}
    by_weights = {u.target.weights: n for n, u in units.items()} | {pub.node.address: "trainer"}
    real_plan = plan_version
    joined: list[str] = []

    def tell(names: list[str]) -> None:
        pub.set_targets({n: units[n].target for n in names}, datacenter="dc-a", dc_links=LINKS_ABC)

    def plan_while_the_relay_joins(*args, **kwargs):  # rollout-2 (dc-b) joins as the first plan of v2 fails
        try:
            return real_plan(*args, **kwargs)
        except PlanError:
            if not joined:
                joined.append("rollout-2")
                tell(["rollout-1", "rollout-2"])
            raise

    def told(name: str, version: int) -> str:
        v, holder = units[name].told()
        assert v == version, (name, v)
        return by_weights[holder]

    try:
        tell(["rollout-0", "rollout-1"])
        pub.publish(1, {"w": torch.zeros(100)})
        assert (told("rollout-0", 1), told("rollout-1", 1)) == ("trainer", "rollout-0")
        tell(["rollout-1"])  # dc-b's only unit is lost
        monkeypatch.setattr("rlctl.agents.weights.plan_version", plan_while_the_relay_joins)
        pub.publish(2, {"w": torch.ones(100)})
        assert told("rollout-1", 2) == "trainer"  # this version only: dc-b has no one to relay it
        assert joined == ["rollout-2"] and told("rollout-2", 2) == "trainer"
        pub.publish(3, {"w": torch.full((100,), 2.0)})
        assert (told("rollout-2", 3), told("rollout-1", 3)) == ("trainer", "rollout-2")
        assert pub.plan is not None and pub.plan.inter_dc_edges() == [
            ("trainer-0", "rollout-2"),
            ("rollout-2", "rollout-1"),
        ]
    finally:
        pub.close()
        for u in units.values():
            u.listener.close()


def test_a_datacenter_unreached_over_the_declared_links_is_said_once_per_version(caplog):
    """While dc-b has no unit, every version dc-c gets is routed around it, and each is said in one line however
    often it is re-announced (a unit joining dc-c re-plans it), versus a line for the first version only."""
    transport = InprocTransport(secret=b"k" * 16)
    pub = WeightPublisher(transport, listen="inproc://", sync=WeightSync(mode="full", chunk_bytes=4096), timeout_s=10)
    units = {n: _Unit(transport, n, "dc-c", h) for n, h in (("rollout-1", "h2"), ("rollout-3", "h4"))}

    def tell(names: list[str]) -> None:
        pub.set_targets({n: units[n].target for n in names}, datacenter="dc-a", dc_links=LINKS_ABC)

    try:
        with caplog.at_level(logging.WARNING, logger="rlctl.agents.weights"):
            tell(["rollout-1"])
            pub.publish(2, {"w": torch.zeros(100)})
            assert units["rollout-1"].told()[0] == 2
            tell(["rollout-1", "rollout-3"])  # joins while v2 is the newest: v2 is planned again
            assert units["rollout-3"].told()[0] == 2
            pub.publish(3, {"w": torch.ones(100)})
            assert [u.told()[0] for u in units.values()] == [3, 3]
        lines = [r.getMessage() for r in caplog.records if "as if every pair" in r.getMessage()]
        assert [line.split(":")[0] for line in lines] == ["weights v2", "weights v3"]
        assert "no inter-DC link path from the trainer datacenter(s) to dc-c" in lines[0]
    finally:
        pub.close()
        for u in units.values():
            u.listener.close()
