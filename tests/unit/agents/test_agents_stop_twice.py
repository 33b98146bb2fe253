"""A controller that ends on `rlctl stop` still answers clients while it waits for the checkpoint the trainer
reached: a second `rlctl stop` joins that wait (the grace left, the checkpoint) instead of hearing nothing and
killing every agent, the checkpoint's write with them; `rlctl status` is answered too."""

from __future__ import annotations

import threading
from pathlib import Path

from rlctl.agents import controller, controller_stop, messages
from rlctl.agents.messages import Hello, make
from rlctl.transport import Message
from tests.unit.controller_harness import HandledController, small_job


def test_a_second_stop_while_the_first_waits_for_a_checkpoint_joins_that_wait(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(controller, "BYE_WAIT_S", 0.0)
    h = HandledController(tmp_path, small_job("twice", iterations=6), listen="inproc://stop-twice")
    try:
        h.ctl.writing[2] = ({}, "[]", 0)  # the trainer writes its part of iter-2 (its `trained` came)
        h.feed("client-0", make("shutdown", {}))
        first = h.ends["client-0"].recv(timeout_s=5).header
        assert (first["checkpoint"], first["grace_s"]) == (
            2,
            messages.STOP_GRACE_S + controller_stop.STOP_CHECKPOINT_WAIT_S,
        )
        h.drain()
        ending = threading.Thread(target=h.ctl._shutdown, daemon=True)
        ending.start()  # it waits for the trainer's write (its bye comes after it)
        second = h.transport.connect(h.ctl.listener.address, timeout_s=5)
        second.send(make("hello", Hello(role="client", name="rlctl-shutdown")))
        answer = second.request(Message("shutdown", {}), timeout_s=5).header  # before: no answer (a forced stop)
        assert answer["ok"] and answer["stopping"] and answer["checkpoint"] == 2
        assert first["grace_s"] - 5 < answer["grace_s"] <= first["grace_s"]  # the grace left of the first stop's
        assert second.request(Message("status", {}), timeout_s=5).header["iteration"] == 0
        assert ending.is_alive()
        h.ends["trainer-0"].send(make("bye", {"name": "trainer-0", "state": "stopped"}))
        ending.join(timeout=10)
        assert not ending.is_alive()
        assert h.jd.read_json(h.jd.summary_json)["state"] == "stopped"
        events = [e["event"] for e in h.jd.read_lines(h.jd.events)]
        assert events.count("stop_requested") == 1 and "stop_requested_again" in events
        second.close()
    finally:
        h.close()


def test_while_it_stops_a_scale_is_refused_at_once_and_the_launchers_failure_is_kept(
    tmp_path: Path, monkeypatch
) -> None:
    """While it ends on a stop: `rlctl scale` got no answer (it waited out its timeout), and the launcher's
    `shutdown {failed}` (a trainer rank gone before it joined) was answered as a second stop, its reason dropped."""
    monkeypatch.setattr(controller, "BYE_WAIT_S", 0.0)
    h = HandledController(tmp_path, small_job("scaled", iterations=6), listen="inproc://stop-scale")
    try:
        h.ctl.writing[2] = ({}, "[]", 0)  # it waits for the trainer's checkpoint: clients are answered meanwhile
        h.feed("client-0", make("shutdown", {}))
        h.ends["client-0"].recv(timeout_s=5)
        h.drain()
        ending = threading.Thread(target=h.ctl._shutdown, daemon=True)
        ending.start()
        client = h.transport.connect(h.ctl.listener.address, timeout_s=5)
        client.send(make("hello", Hello(role="client", name="rlctl-scale")))
        answer = client.request(Message("scale", {"delta": 1}), timeout_s=5).header
        assert answer == {"error": "the job is stopping: no rollout units are added or removed"}
        failed = client.request(Message("shutdown", {"failed": "trainer-1 exited with 1"}), timeout_s=5).header
        assert failed["ok"] and "stopping" not in failed
        h.ends["trainer-0"].send(make("bye", {"name": "trainer-0", "state": "stopped"}))
        ending.join(timeout=10)
        assert not ending.is_alive()
        assert h.jd.read_json(h.jd.summary_json)["state"] == "failed: trainer-1 exited with 1"
        client.close()
    finally:
        h.close()


def test_a_controller_that_ends_on_a_stop_exits_0(tmp_path: Path, monkeypatch) -> None:
    """`rlctl stop` is not a failure: the controller exited 1 (every stopped job's `rlctl status` said
    `controller-0 exited 1`); the launcher's `failed` is still 1."""
    monkeypatch.setattr(controller, "BYE_WAIT_S", 0.0)
    h = HandledController(tmp_path, small_job("stopped", iterations=6), listen="inproc://stop-exit")
    try:
        h.feed("client-0", make("shutdown", {}))
        assert h.ctl.run() == 0
        assert h.jd.read_json(h.jd.summary_json)["state"] == "stopped"
    finally:
        h.close()
    h = HandledController(tmp_path / "f", small_job("failed", iterations=6), listen="inproc://stop-exit-failed")
    try:
        h.feed("client-0", make("shutdown", {"failed": "trainer-1 exited with 1"}))
        assert h.ctl.run() == 1
        assert h.jd.read_json(h.jd.summary_json)["state"].startswith("failed")
    finally:
        h.close()
