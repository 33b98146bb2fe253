"""A run whose rollout units are lost and replaced for weeks holds the agents it has: a gone agent (lost or stopped)
is listed once, in the first metrics row after it went, then leaves the controller's peers, the status reply's list
and /metrics; summary.json and the status reply still count it, and a lost unit that says hello again under its name
is still told to stop."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client import generate_latest

from rlctl.agents.books import LEFT_KEPT
from rlctl.agents.ledger import State
from rlctl.agents.messages import make
from rlctl.agents.views import agent_gauges, status
from rlctl.commands.status import gone_line
from rlctl.errors import PeerClosed
from rlctl.transport import Connection
from tests.unit.controller_harness import HandledController, small_job


class Running(HandledController):
    """`HandledController` of a 6-iteration job, with what these tests do to it."""

    def __init__(self, root: Path, name: str) -> None:
        super().__init__(root, small_job("gone", iterations=6), listen=f"inproc://{name}")

    def tell(self, who: str, kind: str, header: dict[str, Any], tensors: list[torch.Tensor] | None = None) -> None:
        self.feed(who, make(kind, header, tensors or []))

    def lose(self, name: str) -> None:
        """`name`'s connection ended in order (its process ended)."""
        peer = self.ctl.peers[name]
        self.ctl._handle("closed", name, (peer.conn, PeerClosed("closed by peer"), time.monotonic()))

    def gauges(self) -> None:
        """What the loop does each turn: the agents' gauges."""
        agent_gauges(self.ctl.metrics, self.ctl.core, self.ctl.peers, self.ctl.sites, now=time.monotonic())

    def train(self, *, violations: int = 0) -> dict[str, Any]:
        """Every sample the units were sent comes back (scored at once: the digits verifier), the trainer trains the
        iteration it is at (finding `violations` of them staler than η) and every live unit applies the version it
        published: its metrics row."""
        for e in self.ctl.core.ledger.in_state(State.DISPATCHED):
            tensors = [torch.zeros(2, dtype=torch.int32), torch.zeros(2)]
            version = self.ctl.core.units[str(e.agent)].version
            header = {"sample_id": e.sample_id, "version": version, "finish_reason": "eos", "num_output_tokens": 2}
            self.tell(str(e.agent), "sample", header, tensors)
        it = self.ctl.core.trainer_version
        ids = sorted(
            e.sample_id
            for e in self.ctl.core.ledger.entries.values()
            if e.state is State.DELIVERED and e.iteration == it
        )
        trained = {
            "iteration": it,
            "version": it + 1,
            "sample_ids": ids,
            "reward_mean": 0.0,
            "train_s": 0.1,
            "tokens": 1,
            "loss": 0.0,
            "staleness_violations": violations,
            "busy_s": 0.1,
        }
        self.tell("trainer-0", "trained", trained)
        assert self.ctl.core.trainer_version == it + 1, self.ctl.core.failed
        for u in self.ctl.core.live_units:
            self.tell(u.name, "weights_applied", {"version": it + 1})
        return self.jd.read_lines(self.jd.metrics)[-1]


@pytest.fixture
def running(tmp_path: Path, request: pytest.FixtureRequest):
    r = Running(tmp_path, f"gone-{request.node.name}")
    yield r
    r.close()


def _series(r: Running, name: str) -> list[str]:
    """The /metrics lines that name agent `name`."""
    return [line for line in generate_latest(r.ctl.metrics.registry).decode().splitlines() if f'name="{name}"' in line]


def _hello_again(r: Running, name: str) -> Connection:
    """Unit `name`'s hello on a link it re-established (it says `again`), on a new connection, handled by the
    controller (what came in before it first): that connection's end."""
    end = r.transport.connect(r.ctl.listener.address, timeout_s=5)
    r.ends[name] = end
    hello = {"role": "rollout", "name": name, "address": f"inproc://{name}", "weights": f"w-{name}", "again": True}
    end.send(make("hello", hello))
    while (handled := r.ctl.inbox.get(timeout=10))[0] != "hello":
        r.ctl._handle(*handled)
    r.ctl._handle(*handled)
    return end


def test_a_lost_unit_leaves_the_peers_and_the_status_list_after_the_row_that_lists_it(running: Running) -> None:
    r = running
    r.train()  # a row with rollout-1 running
    r.tell("rollout-1", "heartbeat", {"name": "rollout-1", "state": "running", "busy_s": 2.5})
    r.lose("rollout-1")
    row = r.train()
    assert row["agents"]["rollout-1"]["state"] == "lost"  # once, in the first row after it went
    assert sorted(r.ctl.peers) == ["client-0", "rollout-0", "trainer-0"]
    st = status(r.ctl.snapshot(), now=time.monotonic())
    assert [a["name"] for a in st["agents"]] == ["trainer-0", "rollout-0"]
    assert st["agents_gone"] == {"lost": 1, "stopped": 0} and gone_line(st["agents_gone"]) == "lost 1"
    assert "rollout-1" not in r.train()["agents"]
    # it says hello again under its name: told to stop, as when its Peer was kept
    end = r.hello("rollout-1")
    assert end.recv(timeout_s=5).kind == "stop"
    assert [e["agent"] for e in r.jd.read_lines(r.jd.events) if e["event"] == "rejoin_refused"] == ["rollout-1"]
    assert "rollout-1" not in r.ctl.peers and "rollout-1" in r.ctl.core.left
    r.ctl._shutdown()
    end_summary = r.jd.read_json(r.jd.summary_json)
    assert end_summary["agents"]["rollout-1"] == {"role": "rollout", "busy_s": 2.5}  # what it lists today
    assert sorted(end_summary["agents"]) == ["rollout-0", "rollout-1", "trainer-0"]


def test_a_lost_unit_whose_name_was_let_go_is_still_told_to_stop_when_it_reconnects(running: Running) -> None:
    """rollout-7 is lost while it keeps reconnecting, and more units are lost after it than the controller keeps by
    name (GONE_KEPT, LEFT_KEPT; 2 here): its hello on the link it re-established says so (`again`), and it is told
    to stop, as one whose name is kept, versus taken as a new unit beside its replacement and counted twice
    (num_joined 7 for the 6 units that ever joined)."""
    r = running
    r.ctl.gone.keep = r.ctl.core.left.keep = 2
    for name in ("rollout-7", "rollout-8", "rollout-9", "rollout-10"):
        r.ends[name] = r.hello(name)
        r.lose(name)
        r.train()  # (its record leaves `peers` for `gone`)
    assert not r.ctl.core.known("rollout-7") and r.ctl.gone.get("rollout-7") is None
    assert r.ctl.core.num_joined == 6  # rollout-0, rollout-1 and the 4 lost
    end = _hello_again(r, "rollout-7")
    assert "rollout-7" not in r.ctl.core.units and r.ctl.core.num_joined == 6
    assert end.recv(timeout_s=5).kind == "stop"
    assert [e["agent"] for e in r.jd.read_lines(r.jd.events) if e["event"] == "rejoin_refused"] == ["rollout-7"]


@pytest.mark.parametrize("asked", [True, False])
def test_a_unit_whose_first_hello_was_lost_joins_on_its_next_if_the_job_waits_for_it(
    running: Running, asked: bool
) -> None:
    """rollout-5, asked for by a scale, sent its first hello on a link that broke before the controller read it: its
    next hello says `again` for a name the controller never knew. Taken, as the job waits for it, versus told to stop
    as a unit whose name was let go (then started again as one that never joined); one not asked for is refused."""
    r = running
    if asked:
        r.ctl.scaler.spawn_requested["rollout-5"] = r.ctl.scaler.t0
    _hello_again(r, "rollout-5")
    assert ("rollout-5" in r.ctl.core.units) is asked
    refused = [e["agent"] for e in r.jd.read_lines(r.jd.events) if e["event"] == "rejoin_refused"]
    assert refused == ([] if asked else ["rollout-5"])


def test_a_stopped_unit_leaves_the_peers_and_joins_again_under_its_name(running: Running) -> None:
    r = running
    r.train()
    r.tell("client-0", "scale", {"delta": -1})  # rollout-1 drains: told to stop once its samples are in
    r.train()
    assert "rollout-1" not in r.ctl.core.units and "rollout-1" in r.ctl.core.left
    r.tell("rollout-1", "bye", {"name": "rollout-1", "state": "stopped"})
    assert r.train()["agents"]["rollout-1"]["state"] == "stopped"
    assert "rollout-1" not in r.ctl.peers
    assert status(r.ctl.snapshot(), now=time.monotonic())["agents_gone"] == {"lost": 0, "stopped": 1}
    r.ends["rollout-1"] = r.hello("rollout-1")  # a unit of that name again: it joins, as when its Peer was kept
    assert r.ctl.peers["rollout-1"].state == "running" and r.ctl.core.units["rollout-1"].alive
    assert "rollout-1" not in r.ctl.core.left
    st = status(r.ctl.snapshot(), now=time.monotonic())
    assert st["agents_gone"] == {"lost": 0, "stopped": 0}
    assert [a["name"] for a in st["agents"]] == ["trainer-0", "rollout-0", "rollout-1"]


def test_a_drained_unit_told_to_stop_is_still_shown_draining_until_its_bye(running: Running) -> None:
    """A unit retired by a scale-in (its samples in, told to stop) leaves `core.units`: `rlctl status` showed it as a
    unit that runs (`running`, no "(draining)") until its bye, for good when it never says one."""
    r = running
    r.train()
    r.tell("client-0", "scale", {"delta": -1})  # rollout-1 drains: told to stop once its samples are in
    r.train()
    assert "rollout-1" in r.ctl.core.left and r.ctl.peers["rollout-1"].state == "running"
    draining = {a["name"]: a["draining"] for a in status(r.ctl.snapshot(), now=time.monotonic())["agents"]}
    assert draining == {"trainer-0": False, "rollout-0": False, "rollout-1": True}  # was: rollout-1 False
    r.lose("rollout-0")  # a unit lost is not one draining
    (lost,) = [a for a in status(r.ctl.snapshot(), now=time.monotonic())["agents"] if a["name"] == "rollout-0"]
    assert (lost["state"], lost["draining"]) == ("lost", False)


def test_a_drained_unit_is_shown_draining_and_its_bye_taken_however_many_units_left_since(running: Running) -> None:
    """rollout-7 is retired after a scale-in and told to stop, stays connected, and more units leave than the core
    keeps by name (LEFT_KEPT; 2 here) before its bye: status still shows it draining and its bye is taken, versus
    shown running and its bye refused as 'not told to stop' (it was then counted lost once its connection ended)."""
    r = running
    r.ends["rollout-7"] = r.hello("rollout-7")
    r.train()
    r.tell("client-0", "scale", {"delta": -1})  # the newest, rollout-7, drains: told to stop once its samples are in
    r.train()
    assert "rollout-7" not in r.ctl.core.units and r.ctl.peers["rollout-7"].state == "running"
    r.ctl.core.left.keep = 2
    for name in ("rollout-8", "rollout-9", "rollout-10"):
        r.ends[name] = r.hello(name)
        r.lose(name)
    r.train()
    assert "rollout-7" not in r.ctl.core.left  # (let go)
    (unit,) = [a for a in status(r.ctl.snapshot(), now=time.monotonic())["agents"] if a["name"] == "rollout-7"]
    assert (unit["state"], unit["draining"]) == ("running", True)
    r.tell("rollout-7", "bye", {"name": "rollout-7", "state": "stopped"})
    assert r.ctl.peers["rollout-7"].state == "stopped"
    r.train()
    assert "rollout-7" not in r.ctl.peers and not r.ctl.core.told_to_stop  # let go with its record


def test_a_gone_unit_s_gauges_are_removed_with_it(running: Running) -> None:
    r = running
    r.train()
    r.gauges()
    assert _series(r, "rollout-1")  # up, heartbeat age, phase
    r.lose("rollout-1")
    r.gauges()
    assert any(line.startswith("rlctl_agent_up") and line.endswith(" 0.0") for line in _series(r, "rollout-1"))
    r.train()
    r.gauges()
    assert _series(r, "rollout-1") == []
    assert _series(r, "rollout-0")


def test_a_unit_that_joins_and_goes_between_two_rows_is_in_the_next_row_once(running: Running) -> None:
    r = running
    r.train()
    r.ends["rollout-2"] = r.hello("rollout-2")
    r.lose("rollout-2")
    row = r.train()
    assert row["agents"]["rollout-2"]["state"] == "lost"
    assert "rollout-2" not in r.train()["agents"]


def test_a_lost_unit_is_replaced_and_a_late_report_of_it_is_taken_once_its_unit_is_gone(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its `Unit` leaves the core as it is lost (`ControllerCore._forget_unit`): the replacement is still asked for
    (the controller reads whether it was draining before), and a late `weights_applied` of it is still booked."""
    r = running
    asked: list[str] = []
    monkeypatch.setattr(r.ctl.scaler, "replace", lambda name, *, now: asked.append(name))
    r.train()
    r.lose("rollout-1")
    assert asked == ["rollout-1"] and "rollout-1" not in r.ctl.core.units and r.ctl.core.known("rollout-1")
    assert r.ctl._wrong(r.ctl.peers["rollout-1"], make("weights_applied", {"version": 1})) is None
    r.ctl.core.weights_applied("rollout-1", 1)  # (a no-op, versus a KeyError)


def test_every_rank_of_a_gone_trainer_and_a_replaced_trainer_s_old_roots_leave_the_weight_book(
    running: Running,
) -> None:
    """The trainer's hello names each rank's root (`trainer-{i}` in the book): every one goes with the trainer, and
    those of a trainer record a new hello replaced (never pruned) go then; only `trainer-0`'s went, when pruned."""
    r = running
    r.train()  # v1: every live unit has it, no version is open
    nodes = r.ctl.book.nodes
    r.ends["trainer-0"] = r.hello("trainer-0", version=1, weight_roots=("w-t0", "w-t1"))  # its record replaced
    assert sorted(nodes) == ["w-rollout-0", "w-rollout-1", "w-t0", "w-t1"]  # was: w-trainer-0 too
    assert [(nodes[a].agent, nodes[a].datacenter) for a in ("w-t0", "w-t1")] == [("trainer-0", ""), ("trainer-1", "")]
    r.ends["trainer-0"] = r.hello("trainer-0", version=1, weight_roots=("w-t0b", "w-t1b"))
    assert sorted(nodes) == ["w-rollout-0", "w-rollout-1", "w-t0b", "w-t1b"]  # was: w-t0 and w-t1 too
    r.lose("trainer-0")
    r.ctl._prune()  # (what the next metrics row does)
    assert sorted(nodes) == ["w-rollout-0", "w-rollout-1"]  # was: w-t1b too


def test_the_names_of_units_gone_kept_are_the_plans_and_the_latest(running: Running) -> None:
    """The plan's rollout-0 is lost, then LEFT_KEPT + 10 units join and are lost: the core keeps rollout-0's name and
    the latest LEFT_KEPT others' (a late message of one of them is still its unit's: `known`, its bye taken), and
    counts them all (`num_joined`), versus one name kept for every unit the job ever lost (1,035 here). rollout-0
    stays no planned unit that has not joined (the scaler would ask its site about it, then replace it)."""
    r = running
    core = r.ctl.core
    core.lost("rollout-0")
    names = [f"rollout-{100 + i}" for i in range(LEFT_KEPT + 10)]
    for name in names:
        core.join(name, role="rollout", version=0)
        core.lost(name)
    assert len(core.left) == LEFT_KEPT + 1 and core.num_joined == 2 + len(names)
    assert core.known("rollout-0") and r.ctl.scaler._planned_unjoined() == []
    assert all(core.known(n) and r.ctl._told_to_stop(n) for n in names[10:])
    assert not any(core.known(n) for n in names[:10])  # let go (they went 1,024 units ago)


def test_a_lost_trainer_whose_name_a_new_hello_takes_is_still_counted_gone_once(running: Running) -> None:
    """A trainer record lost (or lost as "replaced": it joined twice) that a new hello of its name replaces, before or
    after the metrics row that would prune it, counts as a lost agent (the status reply's agents_gone, summary.json's
    agents_unlisted), once; versus overwritten in `peers` (or uncounted from `gone`) and never counted."""
    r = running
    r.lose("trainer-0")  # lost, still in `peers` (no row since)
    r.ends["trainer-0"] = r.hello("trainer-0")  # a new trainer-0 replaces its record
    r.ends["trainer-0"] = r.hello("trainer-0")  # and joins twice: the one before is lost as "replaced"
    assert [e["reason"] for e in r.jd.read_lines(r.jd.events) if e["event"] == "agent_lost"][-1] == "replaced"

    def gone() -> dict[str, int]:
        return status(r.ctl.snapshot(), now=time.monotonic())["agents_gone"]

    assert gone() == {"lost": 2, "stopped": 0}  # was: 0 (both records overwritten)
    r.lose("trainer-0")
    r.ctl._prune()  # (what the next metrics row does): the third is gone by name
    assert gone() == {"lost": 3, "stopped": 0}
    r.ends["trainer-0"] = r.hello("trainer-0")  # a fourth takes its name
    assert gone() == {"lost": 3, "stopped": 0}  # was: 0 (the named one uncounted too)
    r.ctl._prune()
    r.ctl._shutdown()
    s = r.jd.read_json(r.jd.summary_json)
    assert sorted(s["agents"]) == ["rollout-0", "rollout-1", "trainer-0"]  # by name: the one that runs
    assert s["agents_unlisted"] == 3  # was: absent
