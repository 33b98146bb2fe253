"""A silent agent is unreachable before it is lost: its work goes to the others (or the job pauses), it rejoins
when it speaks again, on its connection or a new one; past the job's bound it is lost. Agents bound their wait
on a silent controller the same way, and a rollout unit whose link breaks says hello again."""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from typing import Any

import pytest
import torch

from rlctl.agents import controller as controller_mod
from rlctl.agents import controller_members
from rlctl.agents.common import AgentContext, ControllerLink
from rlctl.agents.controller import ControllerAgent
from rlctl.agents.core import ControllerCore
from rlctl.agents.coretypes import CoreConfig, PromptSpec
from rlctl.agents.flight import FlightRecord
from rlctl.agents.ledger import State
from rlctl.agents.messages import Heartbeat, Hello, SampleDone, make
from rlctl.config.job import JobFile
from rlctl.errors import TransportError
from rlctl.launch.jobdir import JobDir
from rlctl.transport import Connection, InprocTransport, Message

# -- the core ---------------------------------------------------------------------------------------------


def core_with(units: int) -> ControllerCore:
    cfg = CoreConfig(
        iterations=3,
        prompts_per_iteration=2,
        samples_per_prompt=2,
        max_new_tokens=4,
        mode="async",
        eta=1,
        min_units=units,
    )
    core = ControllerCore(cfg, prompts=lambda it: [PromptSpec(f"p{it}-{k}", [1, 2], 2) for k in range(2)])
    core.join("trainer-0", role="trainer", version=0)
    for i in range(units):
        core.join(f"rollout-{i}", role="rollout", version=0)
    return core


def dispatched(core: ControllerCore, name: str) -> list[str]:
    return sorted(e.sample_id for e in core.ledger.in_state(State.DISPATCHED) if e.agent == name)


def test_an_unreachable_unit_leaves_dispatch_and_the_broadcast_and_its_work_goes_to_the_other() -> None:
    core = core_with(2)
    held = dispatched(core, "rollout-1")
    assert held
    outs = core.unreachable("rollout-1")
    assert outs[0].kind == "members" and list(outs[0].header["rollouts"]) == ["rollout-0"]
    assert [u.name for u in core.live_units] == ["rollout-0"]
    assert set(held) <= set(dispatched(core, "rollout-0"))  # requeued and handed to the reachable unit
    assert core.unreachable("rollout-1") == []  # once


def test_with_no_unit_left_dispatch_pauses_and_resumes_when_it_rejoins() -> None:
    core = core_with(1)
    held = dispatched(core, "rollout-0")
    core.unreachable("rollout-0")
    assert dispatched(core, "rollout-0") == [] and core.pump() == []  # paused: nothing to dispatch to
    assert sorted(e.sample_id for e in core.ledger.in_state(State.QUEUED)) == held
    # a late result of requeued work is refused, never delivered
    assert core.sample("rollout-0", sample_id=held[0], version=0, output_tokens=2, payload=None, reward=0.5) == []
    assert core.ledger.refused == 1
    outs = core.rejoin("rollout-0", version=0, requeue=False)
    assert outs[0].kind == "members" and {o.kind for o in outs[1:]} == {"generate"}  # one per iteration (η = 1)
    assert dispatched(core, "rollout-0") == held
    # the same sample handed back to it: its result counts once, whichever generation finishes first
    core.sample("rollout-0", sample_id=held[0], version=0, output_tokens=2, payload=None, reward=0.5)
    assert core.ledger.entries[held[0]].state is State.FINISHED and core.ledger.refused == 1  # its group: not yet
    core.sample("rollout-0", sample_id=held[0], version=0, output_tokens=2, payload=None, reward=0.5)
    assert core.ledger.refused == 2
    assert held[1].startswith(held[0].split("/")[0])  # its sibling: once in, the group goes on to training
    core.sample("rollout-0", sample_id=held[1], version=0, output_tokens=2, payload=None, reward=0.5)
    assert {core.ledger.entries[s].state for s in held[:2]} == {State.DELIVERED}


def test_rejoining_on_a_new_connection_requeues_what_it_was_sent_on_the_old_one() -> None:
    core = core_with(1)
    held = dispatched(core, "rollout-0")
    requeued = core.ledger.requeued
    outs = core.rejoin("rollout-0", version=1, requeue=True)
    assert core.ledger.requeued == requeued + len(held)
    assert outs[0].kind == "members" and {o.kind for o in outs[1:]} == {"generate"}
    assert dispatched(core, "rollout-0") == held
    assert core.units["rollout-0"].version == 1


# -- the controller ---------------------------------------------------------------------------------------


def test_a_sample_handed_back_to_the_silent_unit_still_running_it_answers_for_the_version_it_began_with() -> None:
    """A unit that went silent holding a sample goes on generating it; handed back to it once it has newer weights,
    its own generation, begun on the old ones, answers the dispatch (`rollout._admit`). The group's reservation must
    be due by the old version's bound: reserved at the unit's new version, a later group took the only entry the
    sample's version allows, and the group was thrown away and generated again (`stale_requeued`)."""
    cfg = CoreConfig(iterations=3, prompts_per_iteration=1, samples_per_prompt=1, max_new_tokens=4, mode="async", eta=1)
    core = ControllerCore(cfg, prompts=lambda it: [PromptSpec(f"p{it}", [1, 2], 2)])
    core.join("trainer-0", role="trainer", version=0)
    core.join("rollout-0", role="rollout", version=0)
    assert dispatched(core, "rollout-0") == ["p0/0", "p1/0"]  # rounds 0 and 1, at v0
    core.sample("rollout-0", sample_id="p0/0", version=0, output_tokens=2, payload=None, reward=1.0, attempt=1)
    core.trained(iteration=0, version=1, sample_ids=["p0/0"], stats={})
    core.unreachable("rollout-0")  # silent before it said it applied v1; p1/0 goes on in its engine, begun at v0
    core.rejoin("rollout-0", version=1, requeue=False)  # it applied v1 meanwhile
    assert dispatched(core, "rollout-0") == ["p1/0", "p2/0"]
    assert core.ledger.entries["p1/0"].dispatch_version == 0
    # the fresh round finishes first and takes the earliest entry the other reservation leaves it …
    core.sample("rollout-0", sample_id="p2/0", version=1, output_tokens=2, payload=None, reward=1.0, attempt=1)
    # … and the old generation answers the second dispatch of p1/0 with its version, 0: buffer 1 is its last
    core.sample("rollout-0", sample_id="p1/0", version=0, output_tokens=2, payload=None, reward=1.0, attempt=2)
    assert core.ledger.stale_requeued == 0 and core.ledger.discarded_tokens == 0
    assert core.buffers.where == {"p1": 1, "p2": 2}


def test_a_sample_whose_first_version_on_a_unit_is_too_old_for_any_buffer_still_goes_to_it_at_its_weights() -> None:
    """The unit that went silent holding a sample comes back on a new connection (its engine may never have got the
    sample) after the trainer passed the bound of the version it was sent the sample at: the sample goes to it at its
    weights now, not held back for ever waiting for a unit that could answer for that old version."""
    cfg = CoreConfig(
        iterations=4, prompts_per_iteration=2, samples_per_prompt=1, max_new_tokens=4, mode="async", eta=1, min_units=2
    )
    core = ControllerCore(cfg, prompts=lambda it: [PromptSpec(f"p{it}-{k}", [1, 2], 2) for k in range(2)])
    core.join("trainer-0", role="trainer", version=0)
    core.join("A", role="rollout", version=0)
    core.join("B", role="rollout", version=0)
    assert (dispatched(core, "A"), dispatched(core, "B")) == (["p0-0/0", "p1-0/0"], ["p0-1/0", "p1-1/0"])

    def finish(unit: str, sid: str, version: int) -> None:
        attempt = core.ledger.entries[sid].attempts
        core.sample(unit, sample_id=sid, version=version, output_tokens=2, payload=None, reward=1.0, attempt=attempt)

    finish("A", "p0-0/0", 0)
    finish("B", "p0-1/0", 0)
    core.trained(iteration=0, version=1, sample_ids=["p0-0/0", "p0-1/0"], stats={})
    core.weights_applied("B", 1)
    finish("B", "p1-1/0", 0)
    core.drain("B")  # it takes no new work: round 2's it holds, A's p1-0/0 waits
    core.unreachable("A")
    assert dispatched(core, "B") == ["p2-0/0", "p2-1/0"] and dispatched(core, "A") == []
    finish("B", "p2-0/0", 1)
    finish("B", "p2-1/0", 1)
    core.trained(iteration=1, version=2, sample_ids=["p1-1/0", "p2-0/0"], stats={})
    core.rejoin("A", version=2, requeue=True)  # v0 + η is past: p1-0/0 goes to it at v2
    assert dispatched(core, "A") == ["p1-0/0", "p3-0/0", "p3-1/0"]
    assert core.ledger.entries["p1-0/0"].dispatch_version == 2


def job(unreachable_s: float) -> JobFile:
    return JobFile.model_validate(
        {
            "apiVersion": "rlctl/v1",
            "kind": "Job",
            "name": "reach",
            "inventory": ["x.yaml"],
            "model": {"kind": "builtin", "name": "tiny-demo"},
            "task": {"kind": "digits", "median_output_tokens": 6, "max_output_tokens": 16},
            "iterations": 5,
            "batch": {"prompts_per_iteration": 2, "samples_per_prompt": 2, "train_micro_batch_samples": 2},
            "placement": {"trainer": {"site": "local", "gpus": 1}, "rollout": [{"site": "far", "gpus": 1}]},
            "transport": {"kind": "inproc", "timeout_s": 5, "unreachable_timeout_s": unreachable_s},
            "warmup": {"sft_steps": 0},
        }
    )


class Fake:
    """An agent's end of a connection to the controller: what it received, on a reader thread."""

    def __init__(self, transport: InprocTransport, address: str, hello: Hello, *, beat: bool = False) -> None:
        self.conn: Connection = transport.connect(address, timeout_s=5)
        self.got: queue.Queue[Message] = queue.Queue()
        self.conn.send(make("hello", hello))
        self.name = hello.name
        self.beating = threading.Event()
        if beat:
            self.beating.set()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._beat, daemon=True).start()

    def _beat(self) -> None:
        while True:
            self.beating.wait()
            try:
                self.conn.send(make("heartbeat", Heartbeat(name=self.name, state="running")))
            except Exception:  # noqa: BLE001 - the connection closed
                return
            time.sleep(0.1)

    def _read(self) -> None:
        try:
            while True:
                self.got.put(self.conn.recv())
        except Exception:  # noqa: BLE001 - the connection closed: the fake stops listening
            return

    def requests(self) -> list[str]:
        """Sample ids of every `generate` it got until none came for a second. The first may take a while: a loaded
        machine can start the controller's thread, or hand its work back, well over a second late."""
        try:
            msg = self.next("generate", timeout_s=10)
        except queue.Empty:
            raise AssertionError(f"{self.name} got no generate within 10 s") from None
        ids = [r["sample_id"] for r in msg.header["requests"]]
        while True:
            try:
                msg = self.next("generate", timeout_s=1.0)
            except queue.Empty:
                return sorted(ids)
            ids += [r["sample_id"] for r in msg.header["requests"]]

    def next(self, kind: str, timeout_s: float = 10) -> Message:
        deadline = time.monotonic() + timeout_s
        while True:
            msg = self.got.get(timeout=max(0.01, deadline - time.monotonic()))
            if msg.kind == kind:
                return msg


def wait_event(jd: JobDir, kind: str, timeout_s: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        hits = [e for e in jd.read_lines(jd.events) if e["event"] == kind]
        if hits:
            return hits[-1]
        time.sleep(0.05)
    raise AssertionError(f"no {kind} event within {timeout_s} s")


@pytest.fixture
def running(tmp_path, monkeypatch):
    """A real controller (inproc) with a fake trainer and a fake rollout unit on site `far`."""
    # the fakes beat every 0.1 s: 5 s of silence is a unit that stopped, not a thread a loaded machine delayed (at
    # 1.5 s, a trainer's beats 1.6 s late made its site unreachable too: the job paused for 'far' and 'local')
    monkeypatch.setattr(controller_members, "HEARTBEAT_TIMEOUT_S", 5.0)
    monkeypatch.setattr(controller_mod, "BYE_WAIT_S", 0.2)  # the fakes say no bye
    made: list[tuple[ControllerAgent, threading.Thread, Connection]] = []

    def start(unreachable_s: float) -> tuple[ControllerAgent, JobDir, InprocTransport, Fake, Connection]:
        jd = JobDir.create("reach", explicit=tmp_path / "job")
        spec = job(unreachable_s)
        jd.write_job(spec, source="test")
        jd.write_json(jd.plan_json, {"rollout": [{"site": "far", "units": 1}], "trainer": {"site": "local"}})
        transport = InprocTransport(secret=jd.secret())
        ctl = ControllerAgent(jd, spec, transport, listen="inproc://reach")
        ctl.sites["rollout-0"] = "far"
        Fake(transport, ctl.listener.address, Hello(role="trainer", name="trainer-0"), beat=True)
        unit = Fake(transport, ctl.listener.address, Hello(role="rollout", name="rollout-0", address="x", weights="y"))
        client = transport.connect(ctl.listener.address, timeout_s=5)
        client.send(make("hello", Hello(role="client", name="test")))
        t = threading.Thread(target=ctl.run, daemon=True)
        t.start()
        made.append((ctl, t, client))
        return ctl, jd, transport, unit, client

    yield start
    for ctl, t, client in made:
        ctl.stop_requested = True
        t.join(timeout=20)
        client.close()


def status(client: Connection) -> dict[str, Any]:
    return dict(client.request(Message("status", {}), timeout_s=10).header)


def test_a_silent_unit_pauses_the_job_and_its_heartbeat_brings_it_back(running) -> None:
    _, jd, _, unit, client = running(60.0)
    work = unit.requests()
    gone = wait_event(jd, "agent_unreachable", timeout_s=30)  # it never heartbeats
    assert gone["agent"] == "rollout-0" and gone["site"] == "far" and gone["requeued"] == len(work)
    paused = wait_event(jd, "job_paused")
    assert paused["sites"] == ["far"]
    st = status(client)
    assert st["state"] == "paused" and st["resilience"]["paused"].startswith("paused: site far unreachable since ")
    assert {a["name"]: a["state"] for a in st["agents"]}["rollout-0"] == "unreachable"
    unit.beating.set()  # the link is back
    back = wait_event(jd, "agent_rejoined")
    assert back["how"] == "its connection"
    wait_event(jd, "job_resumed")
    assert unit.requests() == work  # requeued, handed back
    done = SampleDone(sample_id=work[0], version=0, finish_reason="eos", num_output_tokens=1)
    unit.conn.send(make("sample", done, [torch.tensor([1], dtype=torch.int32), torch.tensor([0.0])]))
    st = status(client)
    assert st["state"] == "running" and st["resilience"]["paused"] is None


def test_past_the_bound_it_is_lost_and_a_late_hello_is_told_to_stop(running) -> None:
    ctl, jd, transport, unit, _ = running(1.0)
    unit.next("generate")
    lost = wait_event(jd, "agent_lost", timeout_s=30)
    assert lost["agent"] == "rollout-0" and lost["reason"].startswith("unreachable for ")
    late = Fake(transport, ctl.listener.address, Hello(role="rollout", name="rollout-0", address="x", weights="y"))
    late.next("stop")
    assert wait_event(jd, "rejoin_refused")["agent"] == "rollout-0"


def test_a_unit_saying_hello_again_rejoins_on_its_new_connection(running) -> None:
    ctl, jd, transport, unit, _ = running(60.0)
    unit.beating.set()
    work = unit.requests()
    ctl.book.published(1, time.monotonic())  # v1 went out while it was away; it comes back holding it
    # its link broke while down: the new hello reaches the controller before the old connection's end does
    hello = Hello(role="rollout", name="rollout-0", address="x", weights="y", version=1)
    again = Fake(transport, ctl.listener.address, hello, beat=True)
    back = wait_event(jd, "agent_rejoined")
    unit.conn.close()
    assert back["how"] == "a new connection"
    assert ctl.book.versions[1].last_unit_s is not None  # its only unit has v1: delivered
    assert again.requests() == work
    assert not [e for e in jd.read_lines(jd.events) if e["event"] == "agent_lost"]


# -- the agent's side -------------------------------------------------------------------------------------


def test_an_agent_leaves_when_its_controller_says_nothing_for_the_bound(tmp_path, caplog) -> None:
    jd = JobDir.create("reach", explicit=tmp_path / "job")
    spec = job(1.0)
    transport = InprocTransport(secret=jd.secret())
    silent = transport.listen("inproc://")  # a name of its own: a fixed one stays taken if the test ends early
    ctx = AgentContext(jd, spec, transport, silent.address)
    link = ControllerLink(
        ctx, Hello(role="rollout", name="rollout-0"), figures=lambda: Heartbeat(name="rollout-0", state="running")
    )
    server = silent.accept(timeout_s=5)  # accepts, reads the hello, then never answers
    assert server.recv(timeout_s=5).kind == "hello"
    assert link.inbox.get(timeout=30) is None  # the agent's loop is told to leave
    said = [r.getMessage() for r in caplog.records if "leaving" in r.getMessage()]
    assert said == [f"rollout-0: controller {silent.address} said nothing (no work, no ping) for 1 s: leaving"], said
    link.close()
    silent.close()


def test_a_rollout_unit_whose_link_breaks_says_hello_again(tmp_path) -> None:
    jd = JobDir.create("reach", explicit=tmp_path / "job")
    spec = job(30.0)
    transport = InprocTransport(secret=jd.secret())
    listener = transport.listen("inproc://")
    ctx = AgentContext(jd, spec, transport, listener.address)
    version = [3]
    link = ControllerLink(
        ctx,
        Hello(role="rollout", name="rollout-0"),
        figures=lambda: Heartbeat(name="rollout-0", state="running", version=version[0]),
        reconnect=True,
    )
    first = listener.accept(timeout_s=5)
    said = first.recv(timeout_s=5).header
    assert said["version"] == 3 and not said["again"]
    version[0] = 4
    first.close()  # the link breaks
    second = listener.accept(timeout_s=10)
    hello = second.recv(timeout_s=5)
    assert hello.kind == "hello" and hello.header["name"] == "rollout-0" and hello.header["version"] == 4
    assert hello.header["again"]  # (a controller that let its name go tells it to stop: `_hello`)
    link.send(make("heartbeat", Heartbeat(name="rollout-0", state="running")))  # sends go on the new connection
    assert link.reconnects == 1
    link.close()
    listener.close()


# -- a failed send and the reader's end of the same connection ------------------------------------------------


def controller_with_a_unit(tmp_path, name: str, *, pid: int = 0) -> tuple[ControllerAgent, JobDir, Connection]:
    """A controller (its loop not running: the test hands it each event) that has greeted rollout-0 (`pid`: the
    process its hello names)."""
    jd = JobDir.create("reach", explicit=tmp_path / "job")
    spec = job(60.0)
    jd.write_job(spec, source="test")
    jd.write_json(jd.plan_json, {"rollout": [{"site": "far", "units": 1}], "trainer": {"site": "local"}})
    transport = InprocTransport(secret=jd.secret())
    ctl = ControllerAgent(jd, spec, transport, listen=f"inproc://{name}")
    unit = transport.connect(ctl.listener.address, timeout_s=5)
    unit.send(make("hello", Hello(role="rollout", name="rollout-0", address="x", weights="y", pid=pid)))
    what, who, payload = ctl.inbox.get(timeout=10)
    assert what == "hello"
    ctl._handle(what, who, payload)
    return ctl, jd, unit


def handle_until_closed(ctl: ControllerAgent) -> None:
    """Hand the controller each event until (and with) a connection's end."""
    while True:
        ev = ctl.inbox.get(timeout=10)
        ctl._handle(*ev)
        if ev[0] == "closed":
            return


def test_a_unit_whose_stream_ended_in_order_is_lost_in_order_though_a_ping_failed_before_the_loop_heard_it(
    tmp_path,
) -> None:
    """The reader heard the unit's stream end in order and closed the connection; the loop pinged it before it read
    that event, and the ping failed. The loss is the reader's: in order (seen once in five runs of the fault suite,
    which then counted the kill as a reset)."""
    ctl, jd, unit = controller_with_a_unit(tmp_path, "race")
    unit.close()
    ended = ctl.inbox.get(timeout=10)
    assert ended[0] == "closed"
    ctl._pinged = float("-inf")
    ctl._watch(time.monotonic())  # the ping fails: the connection is closed
    assert ctl.peers["rollout-0"].state == "running" and ctl.peers["rollout-0"].broken is not None
    ctl._handle(*ended)
    lost = wait_event(jd, "agent_lost")
    assert lost["in_order"] is True and lost["reason"].endswith("connection closed by peer"), lost
    ctl._shutdown()


def test_a_unit_a_send_failed_on_whose_reader_says_nothing_is_lost_for_the_send(tmp_path, monkeypatch) -> None:
    ctl, jd, _unit = controller_with_a_unit(tmp_path, "stuck")
    peer = ctl.peers["rollout-0"]

    def stalled(msg: Message) -> None:
        raise TransportError("tcp://x: message stalled for 30s")

    monkeypatch.setattr(peer.conn, "send", stalled)
    ctl._pinged = float("-inf")
    now = time.monotonic()
    ctl._watch(now)
    ctl._watch(now + controller_members.BROKEN_GRACE_S / 2)  # its reader may still say how the stream ended
    assert peer.state == "running"
    ctl._watch(now + controller_members.BROKEN_GRACE_S + 1)
    lost = wait_event(jd, "agent_lost")
    assert lost["in_order"] is False and lost["reason"] == "ping failed: tcp://x: message stalled for 30s", lost
    assert lost["unsent_tokens"] is None  # not in order: what its record says may still have arrived
    ctl._shutdown()


def test_a_broken_unit_is_lost_for_the_send_though_it_also_went_silent(tmp_path, monkeypatch) -> None:
    ctl, jd, _unit = controller_with_a_unit(tmp_path, "broken-and-silent")
    peer = ctl.peers["rollout-0"]
    ctl._broken(peer, "send failed: tcp://x: message stalled for 30s", since=time.monotonic())
    ctl._watch(time.monotonic() + controller_members.HEARTBEAT_TIMEOUT_S + 1)
    assert wait_event(jd, "agent_lost")["reason"] == "send failed: tcp://x: message stalled for 30s"
    assert not [e for e in jd.read_lines(jd.events) if e["event"] == "agent_unreachable"]
    ctl._shutdown()


@pytest.mark.parametrize("host", ["here", "elsewhere"])
def test_a_unit_that_ended_in_order_here_is_charged_what_its_flight_record_says(tmp_path, monkeypatch, host) -> None:
    """Its record (this process's pid, written on this host) says 3 tokens were generated and not sent: the loss
    event and the summary's partials carry them. A record written on another host is not read."""
    ctl, jd, unit = controller_with_a_unit(tmp_path, f"flight-{host}", pid=os.getpid())
    if host == "elsewhere":
        monkeypatch.setattr(socket, "gethostname", lambda: "another-host")
    rec = FlightRecord(jd.flight("rollout-0"))
    monkeypatch.undo()
    rec.stepped(5)
    rec.wrote(2)
    unit.close()
    handle_until_closed(ctl)
    lost = wait_event(jd, "agent_lost")
    assert lost["in_order"] is True
    partials = ctl.core.ledger.partials
    if host == "here":
        assert lost["unsent_tokens"] == 3
        assert (partials.lost_units_measured, partials.interrupted_lost_tokens_measured) == (1, 3)
    else:
        assert lost["unsent_tokens"] is None and partials.lost_units_measured == 0
    rec.close()
    ctl._shutdown()


def test_a_send_that_fails_over_tcp_loses_the_unit_not_in_order_and_says_why(tmp_path) -> None:
    """A reset on the controller's send closes the TCP connection; its reader, woken by that close, says the
    stream ended on this side (not in order), and the loss names the failed send."""
    from rlctl.transport import TcpTransport

    jd = JobDir.create("reach", explicit=tmp_path / "job")
    spec = job(60.0)
    jd.write_job(spec, source="test")
    jd.write_json(jd.plan_json, {"rollout": [{"site": "far", "units": 1}], "trainer": {"site": "local"}})
    transport = TcpTransport(secret=jd.secret())
    ctl = ControllerAgent(jd, spec, transport, listen="tcp://127.0.0.1:0")
    unit = transport.connect(ctl.listener.address, timeout_s=5)
    unit.send(make("hello", Hello(role="rollout", name="rollout-0", address="x", weights="y")))
    what, who, payload = ctl.inbox.get(timeout=10)
    ctl._handle(what, who, payload)
    peer = ctl.peers["rollout-0"]
    peer.conn._sock = _Resets(peer.conn._sock)  # type: ignore[attr-defined]
    ctl._pinged = float("-inf")
    ctl._watch(time.monotonic())
    handle_until_closed(ctl)
    lost = wait_event(jd, "agent_lost")
    assert lost["in_order"] is False and lost["reason"].startswith("ping failed: "), lost
    assert "reset" in lost["reason"], lost
    unit.close()
    ctl._shutdown()


class _Resets:
    """A socket whose sends fail as after the peer's reset, and whose descriptor closes a moment after the
    shutdown that wakes the reader (so the reader reads the end, as it may on a loaded machine)."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock

    def sendall(self, *_: object) -> None:
        raise ConnectionResetError(104, "Connection reset by peer")

    def close(self) -> None:
        time.sleep(0.3)
        self.sock.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)
