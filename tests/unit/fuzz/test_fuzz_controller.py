"""The controller survives well-formed but wrong messages from its job's peers: a message that passes the codec
(`messages.check`) but is not the sender's to send, names a sample, version or iteration the job does not have,
or comes out of turn is logged in one line naming the peer and dropped; the controller goes on and a good
message after it is still handled.

Hypothesis draws sequences of (sender, kind, header) over every kind the controller reads, with fields drawn
from the job's own ids and versions (and a few beyond them), and feeds them to the controller's real handler.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlctl.agents import controller, controller_stop, messages
from rlctl.agents.appliedlog import unit_rows
from rlctl.agents.ledger import State
from rlctl.agents.messages import TO_CONTROLLER, check, make
from rlctl.errors import PeerClosed, ProtocolError
from rlctl.transport import Message
from tests.unit.controller_harness import PEERS, HandledController, small_job

IDS = st.sampled_from(["", "s", "x", "p0", "it0-p0-s0", "it0-p0-s1", "it1-p1-s0", "rollout-0", "trainer-0"])
INTS = st.integers(0, 6) | st.sampled_from([2**31, 2**63 - 1])
FLOATS = st.floats(allow_nan=True, allow_infinity=True)


def _headers() -> dict[str, st.SearchStrategy[dict[str, Any]]]:
    transfer = st.fixed_dictionaries(
        {"version": INTS},
        optional={
            "holder": st.none() | IDS,
            "encoding": st.none() | st.sampled_from(["full", "delta", "?"]),
            "base_version": st.none() | INTS,
            "wire_bytes": st.none() | INTS,
            "fetch_s": st.none() | FLOATS,
        },
    )
    return {
        "sample": st.fixed_dictionaries(
            {"sample_id": IDS, "version": INTS, "finish_reason": st.sampled_from(["eos", "length", ""])},
            optional={"num_output_tokens": INTS},
        ),
        "weights_applied": transfer,
        "weights_skipped": transfer,
        "trained": st.fixed_dictionaries(
            {
                "iteration": INTS,
                "version": INTS,
                "sample_ids": st.lists(IDS, max_size=4),
                "reward_mean": FLOATS,
                "train_s": FLOATS,
                "tokens": st.integers(-5, 2**40),
                "loss": FLOATS,
                "staleness_violations": st.integers(-2, 5),
                "busy_s": FLOATS,
            },
            optional={
                "kl": FLOATS,
                "grad_norm": FLOATS,
                "lr": FLOATS,
                "clip_frac": FLOATS,
                "entropy": FLOATS,
                "no_signal_frac": FLOATS,
                "checkpointing": st.booleans(),
            },
        ),
        "checkpoint_written": st.fixed_dictionaries(
            {"version": INTS},
            optional={"checkpoint": st.sampled_from(["", "ab" * 32]), "error": st.sampled_from(["", "disk full"])},
        ),
        "heartbeat": st.fixed_dictionaries(
            {"name": IDS, "state": st.sampled_from(["running", "stopped", "?"])},
            optional={"version": st.integers(-3, 2**40), "busy_s": FLOATS, "running": INTS, "waiting": INTS},
        ),
        "bye": st.fixed_dictionaries({"name": IDS, "state": st.sampled_from(["stopped", "running"])}),
        "status": st.just({}),
        "scale": st.fixed_dictionaries(
            {"delta": st.integers(-3, 3) | st.sampled_from([2**31, -(2**31)])},
            optional={"site": st.none() | st.sampled_from(["local", "nowhere", ""])},
        ),
    }


HEADER_STRATEGIES = _headers()
MESSAGES = st.lists(
    st.tuples(st.sampled_from(PEERS), st.sampled_from(sorted(HEADER_STRATEGIES))).flatmap(
        lambda pk: st.tuples(st.just(pk[0]), st.just(pk[1]), HEADER_STRATEGIES[pk[1]])
    ),
    min_size=1,
    max_size=12,
)


class Running(HandledController):
    """`HandledController` of a 3-iteration job, the `n`-th of its test."""

    def __init__(self, root: Path, n: int) -> None:
        super().__init__(root / f"{n}", small_job("fuzz", iterations=3), listen=f"inproc://controller-fuzz-{n}")


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Callable[[], Running]]:
    made: list[Running] = []

    def make_one() -> Running:
        made.append(Running(tmp_path, len(made)))
        return made[-1]

    yield make_one
    for r in made:
        r.close()


def _tensors(kind: str, header: dict[str, Any]) -> list[torch.Tensor]:
    if kind != "sample":
        return []
    n = header.get("num_output_tokens", 2)
    n = n if isinstance(n, int) and 0 <= n <= 64 else 2
    return [torch.arange(n, dtype=torch.int32), torch.zeros(n)]


@settings(
    settings.get_profile("rlctl-fuzz"), max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(messages=MESSAGES)
def test_wrong_messages_from_job_peers_are_dropped_and_the_controller_goes_on(
    running: Callable[[], Running], fuzz_count: Callable[[str, int], None], messages: list[tuple[str, str, Any]]
) -> None:
    r = running()
    for who, kind, header in messages:
        msg = Message(kind, header, _tensors(kind, header))
        try:
            check(msg, peer=who, kinds=TO_CONTROLLER)
        except ProtocolError:
            continue  # the reader drops these before the controller sees them (test_fuzz_messages.py)
        try:
            r.feed(who, msg)
        except Exception as e:  # the test: any exception out of the handler fails it, with the input
            raise AssertionError(f"{who} sent {kind} {header!r:.300}: {type(e).__name__}: {e}") from e
    assert r.ctl.core.failed is None or "checkpoint" in r.ctl.core.failed
    r.feed("client-0", make("status"))  # still answering
    r.drain()
    fuzz_count("controller: well-formed messages from job peers, hypothesis sequences", len(messages))


def test_a_message_not_the_senders_is_dropped_naming_it(
    running: Callable[[], Running], caplog: pytest.LogCaptureFixture
) -> None:
    r = running()
    wrong = [
        ("rollout-0", make("trained", {**_trained(0, 1), "sample_ids": []})),  # only the trainer trains
        ("client-0", make("weights_applied", {"version": 1})),  # only a unit applies weights
        ("trainer-0", make("trained", _trained(2, 3))),  # iteration 2 before 0
        ("trainer-0", make("trained", _trained(0, 1))),  # iteration 0 before its samples were delivered
        (
            "rollout-1",
            make(
                "sample",
                {"sample_id": "nope", "version": 0, "finish_reason": "eos", "num_output_tokens": 1},
                [torch.zeros(1, dtype=torch.int32), torch.zeros(1)],
            ),
        ),
        ("rollout-0", make("weights_applied", {"version": 7})),  # a version the trainer never published
        ("rollout-1", make("weights_skipped", {"version": 9})),  # nor fetched
        ("trainer-0", make("scale", {"delta": 1})),  # a client's request
    ]
    with caplog.at_level(logging.WARNING, logger="rlctl.agents"):
        for who, msg in wrong:
            r.feed(who, msg)
    lines = [rec.getMessage() for rec in caplog.records if "dropped" in rec.getMessage()]
    assert len(lines) == len(wrong), lines
    for (who, msg), line in zip(wrong, lines, strict=True):
        assert who in line and msg.kind in line, line
    assert r.ctl.core.trainer_version == 0 and r.ctl.core.failed is None


def _finish_all(r: Running) -> list[str]:
    """Every sample the units were sent comes back (scored at once: the digits verifier): the iterations they
    fill go to the trainer. Their ids, in delivery order."""
    for e in r.ctl.core.ledger.in_state(State.DISPATCHED):
        tensors = [torch.zeros(2, dtype=torch.int32), torch.zeros(2)]
        header = {"sample_id": e.sample_id, "version": 0, "finish_reason": "eos", "num_output_tokens": 2}
        r.feed(str(e.agent), make("sample", header, tensors))
    delivered = [e for e in r.ctl.core.ledger.entries.values() if e.state is State.DELIVERED]
    return [e.sample_id for e in sorted(delivered, key=lambda e: (e.iteration, e.sample_id))]


def _trained(iteration: int, version: int) -> dict[str, Any]:
    return {
        "iteration": iteration,
        "version": version,
        "sample_ids": ["s"],
        "reward_mean": 0.0,
        "train_s": 0.1,
        "tokens": 1,
        "loss": 0.0,
        "staleness_violations": 0,
        "busy_s": 0.1,
    }


def _stop_with(r: Running, trainer_says: list[Message]) -> None:
    """`rlctl stop` (its shutdown request, with the stop's grace), then the controller's end: the trainer's ending
    messages are queued (its `bye` last, as it says it once its write is done), the units say bye."""
    r.feed("client-0", make("shutdown", {"grace_s": 60.0}))
    assert r.ctl.stop_requested  # (the loop ends here: `run`)
    for msg in trainer_says:
        r.ends["trainer-0"].send(msg)
    for name in PEERS[1:3]:
        r.ends[name].send(make("bye", {"name": name, "state": "stopped"}))
    r.ctl._shutdown()


@pytest.mark.parametrize("writing", [False, True])
def test_a_stop_without_grace_gets_the_default_one_and_the_checkpoint_wait_while_a_checkpoint_is_coming(
    running: Callable[[], Running], writing: bool
) -> None:
    """`rlctl stop` without --grace: the controller's end may take STOP_GRACE_S, and STOP_CHECKPOINT_WAIT_S more
    while a checkpoint is being written (or the trainer holds an iteration whose version checkpoints); the event
    (and the answer, `_stop_asked`) say so and name it. Before, it gave a stop the operator's 15 s, and waited at
    most 14 s for the checkpoint."""
    r = running()
    if writing:
        ids = _finish_all(r)
        r.feed("trainer-0", make("trained", {**_trained(0, 1), "sample_ids": ids[:4], "checkpointing": True}))
    t0 = time.monotonic()
    r.feed("client-0", make("shutdown", {}))
    wait = messages.STOP_GRACE_S + (controller_stop.STOP_CHECKPOINT_WAIT_S if writing else 0.0)
    assert r.ctl.stop_requested and t0 + wait <= r.ctl.stop_by <= time.monotonic() + wait
    asked = [e for e in r.jd.read_events() if e["event"] == "stop_requested"]
    assert [(e["grace_s"], e["checkpoint"]) for e in asked] == [(wait, 1 if writing else None)]


def test_a_stop_waits_for_the_checkpoint_being_written_whose_part_the_controller_writes_when_told(
    running: Callable[[], Running], caplog: pytest.LogCaptureFixture
) -> None:
    r = running()
    ids = _finish_all(r)
    r.feed("trainer-0", make("trained", {**_trained(0, 1), "sample_ids": ids[:4], "checkpointing": True}))
    assert list(r.ctl.writing) == [1] and not (r.jd.checkpoints / "latest.json").exists()
    written = [
        make("checkpoint_written", {"version": 2, "checkpoint": "ab" * 32}),  # not being written
        make("checkpoint_written", {"version": 1, "checkpoint": "ab" * 32}),
        make("bye", {"name": "trainer-0", "state": "stopped"}),
    ]
    with caplog.at_level(logging.WARNING, logger="rlctl.agents"):
        _stop_with(r, written)
    assert any("dropped checkpoint_written from trainer-0" in rec.getMessage() for rec in caplog.records)
    assert r.ctl.writing == {}
    assert json.loads((r.jd.checkpoints / "latest.json").read_text())["version"] == 1
    assert r.ctl.core.failed is None and r.jd.read_json(r.jd.summary_json)["state"] == "stopped"


def test_a_stop_gives_up_on_a_checkpoint_not_written_by_its_deadline_and_says_which_a_resume_takes(
    running: Callable[[], Running], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(controller, "BYE_WAIT_S", 0.2)
    monkeypatch.setattr(controller_stop, "STOP_CHECKPOINT_WAIT_S", 0.5)
    r = running()
    ids = _finish_all(r)
    r.feed("trainer-0", make("trained", {**_trained(0, 1), "sample_ids": ids[:4], "checkpointing": True}))
    with caplog.at_level(logging.WARNING, logger="rlctl.agents"):
        _stop_with(r, [])  # the trainer's write never ends
    assert "checkpoint iter-1 not complete when the stop ended; a resume takes none" in caplog.text
    (e,) = [e for e in r.jd.read_lines(r.jd.events) if e["event"] == "checkpoint_abandoned"]
    assert (e["versions"], e["latest"]) == ([1], None)
    assert not (r.jd.checkpoints / "latest.json").exists()


def test_a_skipped_version_is_booked_as_a_transfer_not_as_the_unit_s_version(running: Callable[[], Running]) -> None:
    """`weights_skipped`: the unit's weight node fetched the version (its bytes crossed whatever link lay between
    it and its holder) and its engine went on to a newer one: booked and written, never taken as applied."""
    r = running()
    r.feed("rollout-0", make("weights_skipped", {"version": 1, "holder": "w-trainer-0", "wire_bytes": 100}))
    (rec,) = r.ctl.book.view()
    assert (rec["version"], rec["units"], rec["bytes"]) == (1, 1, 100)
    r.ctl.applied.flush_all()  # (rollout-1 has not reported v1: its row waits for it, or for the controller's end)
    (e,) = [e for e in unit_rows(r.jd.read_lines(r.jd.events)) if e["event"] == "weights_skipped"]
    assert (e["agent"], e["version"], e["bytes"]) == ("rollout-0", 1, 100)
    assert r.ctl.core.units["rollout-0"].version == 0


def test_a_bye_no_stop_asked_for_is_dropped_and_the_unit_is_still_watched(
    running: Callable[[], Running], caplog: pytest.LogCaptureFixture
) -> None:
    # marked stopped, it was never watched again: its samples stayed dispatched to it for ever
    r = running()
    held = [e.sample_id for e in r.ctl.core.ledger.in_state(State.DISPATCHED) if e.agent == "rollout-0"]
    assert held
    with caplog.at_level(logging.WARNING, logger="rlctl.agents"):
        r.feed("rollout-0", make("bye", {"name": "rollout-0", "state": "stopped"}))
    assert "dropped bye from rollout-0: it was not told to stop" in caplog.text
    peer = r.ctl.peers["rollout-0"]
    assert peer.state == "running"
    r.ctl._handle("closed", "rollout-0", (peer.conn, PeerClosed("closed by peer"), time.monotonic()))  # it left
    assert peer.state == "lost" and "rollout-0" not in r.ctl.core.units and "rollout-0" in r.ctl.core.left
    assert not [e for e in r.ctl.core.ledger.in_state(State.DISPATCHED) if e.agent == "rollout-0"]
