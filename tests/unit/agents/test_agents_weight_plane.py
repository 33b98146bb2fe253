"""The job's weight plane follows the broadcast plan: the trainer's publisher tells every unit whom to
pull from, one copy crosses into a remote datacenter and is relayed there, one copy goes into each
host, and the controller's book counts copies per inter-DC link."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
import torch

from rlctl.agents.weightbook import WeightBook
from rlctl.agents.weights import Target, WeightPublisher, fetch_weights, holders_for, plan_version, weight_node
from rlctl.config.runtime import WeightSync
from rlctl.errors import PeerClosed
from rlctl.transport import InprocTransport, Message


def _targets(spec: dict[str, tuple[str, str]]) -> dict[str, Target]:
    """name → (datacenter, host): addresses carry the host, as tcp addresses do."""
    return {n: Target(f"tcp://{h}:1", f"tcp://{h}:{100 + i}", dc) for i, (n, (dc, h)) in enumerate(spec.items())}


def test_one_copy_enters_a_remote_datacenter_and_each_host_is_visited_once():
    targets = _targets(
        {
            "rollout-0": ("dc-b", "h2"),
            "rollout-1": ("dc-b", "h1"),
            "rollout-2": ("dc-b", "h2"),
            "rollout-3": ("dc-b", "h1"),
            "rollout-4": ("dc-a", "t1"),
        }
    )
    plan = plan_version(["tcp://t0:1", "tcp://t0:2"], "dc-a", targets)
    dc = {n: t.datacenter for n, t in targets.items()} | {"trainer-0": "dc-a", "trainer-1": "dc-a"}
    crossing = [(p, c) for c, p in plan.parent.items() if dc[p] != dc[c]]
    assert len(crossing) == 1 and crossing[0][0].startswith("trainer-")
    # one copy into each host: dc-b's relay (h1's first unit) takes h1's other unit and sends h2 its one copy
    host = {n: t.weights.split("//")[1].split(":")[0] for n, t in targets.items()} | {
        "trainer-0": "t0",
        "trainer-1": "t0",
    }
    into = Counter(host[c] for c, p in plan.parent.items() if host[p] != host[c])
    assert into == Counter({"h1": 1, "h2": 1, "t1": 1}) and crossing[0][1] == "rollout-1"
    assert plan.parent["rollout-3"] == "rollout-1" and plan.parent["rollout-0"] == "rollout-1"
    assert plan.parent["rollout-2"] == "rollout-0"
    # the dc-a unit hangs below a trainer root; the remote copy comes from the other (less loaded) root
    assert plan.parent["rollout-4"] != crossing[0][0]
    # holders: the planned parent first, the trainer's roots always among the fallbacks
    h = holders_for(plan, "rollout-2")
    assert h[0] == targets["rollout-0"].weights and {"tcp://t0:1", "tcp://t0:2"} <= set(h)


def test_a_running_publisher_sends_one_copy_per_version_into_the_remote_datacenter():
    transport = InprocTransport(secret=b"k" * 16)
    sync = WeightSync(mode="delta", chunk_bytes=4096)
    pub = WeightPublisher(transport, listen="inproc://", sync=sync, timeout_s=10)
    names = ["rollout-0", "rollout-1", "rollout-2"]
    units = {}
    for n in names:
        listener = transport.listen("inproc://")
        units[n] = (listener, weight_node(transport, "inproc://", sync, timeout_s=10))
    book = WeightBook()
    book.node(pub.node.address, agent="trainer-0", datacenter="dc-a")
    for n, (_, node) in units.items():
        book.node(node.address, agent=n, datacenter="dc-b")
    got: dict[str, list[Message]] = {n: [] for n in names}

    def unit(name: str, versions: int) -> None:
        listener, node = units[name]
        conn = listener.accept(timeout_s=10)
        while True:
            msg = conn.recv(10)
            got[name].append(fetch_weights(node, msg))
            if int(msg.header["version"]) == versions:
                return

    threads = [threading.Thread(target=unit, args=(n, 3), daemon=True) for n in names]
    for t in threads:
        t.start()
    pub.set_targets({n: Target(units[n][0].address, units[n][1].address, "dc-b") for n in names}, datacenter="dc-a")
    torch.manual_seed(0)
    w = {"a": torch.randn(5000), "b": torch.randn(300)}
    for v in (1, 2, 3):
        w = {k: x + 1e-3 * torch.randn_like(x) * (torch.rand_like(x) < 0.05) for k, x in w.items()}
        pub.publish(v, w)
        for t in threads:
            t.join(timeout=0)
        while not all(any(int(m.header["version"]) >= v for m in got[n]) for n in names):
            threads[0].join(timeout=0.05)
    for t in threads:
        t.join(timeout=30)
    for n in names:
        last = got[n][-1]
        assert last.header["version"] == 3
        assert all(torch.equal(x, w[k]) for k, x in zip(last.header["names"], last.tensors, strict=True))
        for m in got[n]:
            base = m.header["base_version"]  # a delta names the version it applied onto
            assert (base is not None and base < int(m.header["version"])) == (m.header["encoding"] == "delta")
            book.applied(
                n,
                datacenter="dc-b",
                version=int(m.header["version"]),
                holder=m.header["holder"],
                encoding=m.header["encoding"],
                wire_bytes=m.header["wire_bytes"],
                fetch_s=m.header["fetch_s"],
            )
    # per version exactly one unit pulled from the trainer; the others from a relay in dc-b
    for v in (1, 2, 3):
        rec = book.versions[v]
        assert rec.units == 3 and rec.links["dc-a->dc-b"]["copies"] == 1, rec.view()
    assert book.totals["dc-a->dc-b"]["copies"] == 3
    assert book.versions[3].encodings.get("delta") == 3  # steady state travels as deltas, relays included
    pub.close()
    for listener, node in units.values():
        listener.close()
        node.close()


def test_the_book_times_a_version_until_the_last_live_unit_has_it_even_when_units_skip_versions():
    book = WeightBook()
    book.published(1, 10.0)
    book.published(2, 11.0)
    live = {"u0", "u1"}
    assert book.reached("u0", 1, live, 10.5) == []
    assert book.reached("u1", 2, live, 11.5) == [1.5]  # u1 skipped v1: holding v2 it has v1 too
    assert book.reached("u0", 2, live, 12.0) == [1.0]
    assert book.versions[1].last_unit_s == 1.5 and book.versions[2].last_unit_s == 1.0


def test_the_book_delivers_a_version_when_the_unit_it_waited_on_is_lost_or_rejoins_holding_it():
    book = WeightBook()
    book.published(1, 10.0)
    book.published(2, 11.0)
    assert book.reached("u0", 2, {"u0", "u1", "u2"}, 11.5) == []
    assert book.settle({"u0", "u2"}, 12.0) == []  # u1 lost: u2 has neither yet
    assert book.reached("u2", 1, {"u0", "u2"}, 12.5) == [2.5]  # v1: every live unit
    assert book.settle({"u0"}, 13.0) == [2.0]  # u2 lost too: v2 waited on it alone
    assert book.versions[2].last_unit_s == 2.0 and book.settle(set(), 14.0) == []
    book.published(3, 20.0)
    assert book.settle({"u0"}, 20.5) == []  # nobody has v3 yet: not delivered to an empty set of units
    assert book.reached("u0", 3, {"u0", "u3"}, 21.0) == []
    assert book.reached("u3", 3, {"u0", "u3"}, 22.0) == [2.0]  # u3 (re)joined holding v3


def test_the_publisher_closes_its_connection_to_a_unit_that_left_its_targets():
    """A trainer whose units are replaced for weeks holds a connection per live unit, not per unit it ever told."""
    transport = InprocTransport(secret=b"k" * 16)
    sync = WeightSync(mode="full", chunk_bytes=4096)
    pub = WeightPublisher(transport, listen="inproc://", sync=sync, timeout_s=10)
    listeners = {n: transport.listen("inproc://") for n in ("rollout-0", "rollout-1")}
    targets = {n: Target(lst.address, f"inproc://none-{n}") for n, lst in listeners.items()}
    pub.set_targets(targets)
    pub.publish(1, {"a": torch.zeros(4)})
    conns = {n: lst.accept(timeout_s=10) for n, lst in listeners.items()}
    for conn in conns.values():
        assert conn.recv(10).header["version"] == 1
    pub.set_targets({"rollout-0": targets["rollout-0"]})  # rollout-1 left
    with pytest.raises(PeerClosed):
        conns["rollout-1"].recv(5)
    pub.set_targets(targets)  # … and came back: told the newest version again
    again = listeners["rollout-1"].accept(timeout_s=10)
    assert again.recv(10).header["version"] == 1
    pub.close()
    for lst in listeners.values():
        lst.close()


def test_a_gone_relays_address_is_kept_while_a_version_it_had_is_open_so_a_late_transfer_from_it_crosses_its_link():
    # r1 (dc-a) relayed v1 to r2 (dc-b) and was lost; its address went at the next metrics row, and r2's
    # weights_applied naming it as holder, come after that, added no bytes to the dc-a->dc-b link
    book = WeightBook()
    book.node("w-r1", agent="r1", datacenter="dc-a")
    book.published(1, 10.0)
    assert book.reached("r1", 1, {"r1", "r2"}, 11.0) == []  # r2 still pulls it: v1 open
    book.forget("r1")
    link = book.applied("r2", datacenter="dc-b", version=1, holder="w-r1", encoding="raw", wire_bytes=100, fetch_s=0.5)
    assert link == "dc-a->dc-b" and book.totals == {"dc-a->dc-b": {"bytes": 100, "copies": 1}}
    assert book.reached("r2", 1, {"r2"}, 12.0) == [2.0]  # every live unit has v1: no open version names r1
    assert "w-r1" not in book.nodes


def test_a_gone_trainer_ranks_address_is_kept_while_a_version_it_published_is_open_then_goes():
    # trainer-0 (dc-a) published v1, r2 (dc-b) pulled it from its root, and trainer-0 went before r2 reported: its
    # address went at once (no version's had_it names a trainer rank), and r2's weights_applied naming it added no
    # bytes to the dc-a->dc-b link
    book = WeightBook(keep_versions=2)
    book.node("w-t0", agent="trainer-0", datacenter="dc-a", root=True)
    book.node("w-r2", agent="r2", datacenter="dc-b")
    book.published(1, 10.0)
    book.forget("trainer-0")
    link = book.applied("r2", datacenter="dc-b", version=1, holder="w-t0", encoding="raw", wire_bytes=100, fetch_s=0.5)
    assert link == "dc-a->dc-b" and book.totals == {"dc-a->dc-b": {"bytes": 100, "copies": 1}}
    assert book.reached("r2", 1, {"r2"}, 12.0) == [2.0]  # every live unit has v1: the root held no open version
    assert "w-t0" not in book.nodes and "w-r2" in book.nodes
    # bounded: one that held a version no unit ever reports goes once the book lets that version go
    book.node("w-t1", agent="trainer-1", datacenter="dc-a", root=True)
    book.published(2, 20.0)
    book.forget("trainer-1")
    book.published(3, 30.0)  # a new trainer's versions: v2 is open still, and the book keeps it (2 versions)
    assert "w-t1" in book.nodes
    book.published(4, 40.0)  # v2 let go
    assert "w-t1" not in book.nodes and sorted(book.versions) == [3, 4]


def test_every_rank_root_the_trainer_s_hello_said_is_kept_while_a_version_is_open_then_goes_with_it():
    # the trainer (rank 0's hello) said two ranks' roots; it went while v1 was open, and r2 reported late that it
    # pulled v1 from rank 1's root: booked on dc-a->dc-b, and both roots go once v1 is delivered
    book = WeightBook()
    for rank in (0, 1):
        book.node(f"w-t{rank}", agent=f"trainer-{rank}", datacenter="dc-a", root=True, owner="trainer-0")
    book.node("w-r2", agent="r2", datacenter="dc-b")
    book.published(1, 10.0)
    book.forget("trainer-0")
    assert sorted(book.nodes) == ["w-r2", "w-t0", "w-t1"]
    link = book.applied("r2", datacenter="dc-b", version=1, holder="w-t1", encoding="raw", wire_bytes=100, fetch_s=0.5)
    assert link == "dc-a->dc-b" and book.totals == {"dc-a->dc-b": {"bytes": 100, "copies": 1}}
    assert book.reached("r2", 1, {"r2"}, 12.0) == [2.0]
    assert sorted(book.nodes) == ["w-r2"]


def test_a_root_gone_already_keeps_what_it_held_when_a_new_trainer_of_its_name_goes():
    # trainer-0 went while v1 was open (its root kept for v1); a new trainer-0 at another address published v2 and
    # went too: the first root still goes once v1 is delivered, not kept for v2 as well
    book = WeightBook()
    book.node("w-t0", agent="trainer-0", datacenter="dc-a", root=True)
    book.published(1, 10.0)
    book.forget("trainer-0")
    book.node("w-t0b", agent="trainer-0", datacenter="dc-a", root=True)
    book.published(2, 20.0)
    book.forget("trainer-0")
    assert sorted(book.nodes) == ["w-t0", "w-t0b"]
    assert book.reached("r2", 1, {"r2"}, 21.0) == [11.0]
    assert sorted(book.nodes) == ["w-t0b"]  # was: w-t0 too, held v2 (said twice)
    assert book.reached("r2", 2, {"r2"}, 22.0) == [2.0]
    assert book.nodes == {}
