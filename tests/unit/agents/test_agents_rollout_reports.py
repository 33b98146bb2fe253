"""A rollout unit's messages, read by a stand-in controller over a real in-process link: each progress report's
free rows leave out the rows of the samples the same step finished and the unit sends right after it (the
controller counts a row for each sample that arrives after a report), its flight record ends with every
token it generated written, and every version its weight node fetched is reported, applied or skipped."""

from __future__ import annotations

import threading
import time

import torch

from rlctl.agents.common import AgentContext
from rlctl.agents.flight import read_flight
from rlctl.agents.messages import Generate, Partial, Request, make, parse
from rlctl.agents.rollout import RolloutAgent
from rlctl.agents.weights import announce
from rlctl.config.job import JobFile
from rlctl.launch.jobdir import JobDir
from rlctl.models.tinygpt import TinyGPT
from rlctl.transport import Connection, InprocTransport, Message
from rlctl.weights.node import WeightNode
from rlctl.weights.versions import WeightSyncConfig

ROWS = 4


def _unit(tmp_path, *, before: list[Message] = ()) -> tuple[JobDir, RolloutAgent, Connection, threading.Thread]:
    """A rollout unit on its thread, joined to a stand-in controller (its hello read); `before` are in its inbox
    when its loop starts."""
    job = JobFile.model_validate(
        {
            "apiVersion": "rlctl/v1",
            "kind": "Job",
            "name": "reports",
            "inventory": ["x.yaml"],
            "model": {"kind": "builtin", "name": "tiny-demo"},
            "task": {"kind": "digits", "median_output_tokens": 6, "max_output_tokens": 16},
            "batch": {"prompts_per_iteration": 2, "samples_per_prompt": 2, "train_micro_batch_samples": 2},
            "placement": {"trainer": {"site": "local", "gpus": 1}, "rollout": [{"site": "local", "gpus": 1}]},
            "rollout": {"max_batch_size": ROWS, "partial_report_s": 0, "partial_report_steps": 1},
            "transport": {"kind": "inproc", "timeout_s": 10},
            "warmup": {"sft_steps": 0},
        }
    )
    jd = JobDir.create("reports", explicit=tmp_path / "job")
    jd.write_job(job, source="test")
    torch.manual_seed(0)
    TinyGPT().save_pretrained(jd.init_model)
    transport = InprocTransport(secret=jd.secret())
    controller = transport.listen(f"inproc://reports-{tmp_path.name}")
    unit = RolloutAgent(AgentContext(jd, job, transport, controller.address), replica=0)
    for msg in before:
        unit.inbox.put(msg)
    thread = threading.Thread(target=unit.run, daemon=True)
    thread.start()
    conn = controller.accept(timeout_s=10)
    assert conn.recv(timeout_s=10).kind == "hello"
    return jd, unit, conn, thread


def _next(conn: Connection) -> Message:
    """The unit's next message but its heartbeats (one a second on the same connection: a slow start sees one)."""
    while (msg := conn.recv(timeout_s=30)).kind == "heartbeat":
        pass
    return msg


def test_a_report_s_free_rows_leave_out_the_samples_sent_after_it(tmp_path) -> None:
    jd, _, conn, thread = _unit(tmp_path)
    lengths = [3, 5, 6, 8, 9, 12]  # more than its rows: the later ones wait for rows to free
    requests = [Request(f"s{i}", [1, 3 + i], n, priority=0.0, iteration=0) for i, n in enumerate(lengths)]
    conn.send(make("generate", Generate(requests)))
    events: list[tuple[str, object]] = []
    while sum(kind == "sample" for kind, _ in events) < len(requests):
        msg = conn.recv(timeout_s=30)
        if msg.kind == "partial":
            events.append(("partial", parse(msg, Partial)))
        elif msg.kind == "sample":
            events.append(("sample", msg.header["sample_id"]))
    conn.send(make("stop", {}))
    thread.join(timeout=30)
    assert not thread.is_alive()
    reports = [i for i, (kind, _) in enumerate(events) if kind == "partial"]
    assert len(reports) >= 3
    before: set[str] = set()  # the generations the previous report named (one report a step while any runs)
    with_finished = 0  # reports whose step finished samples (what the test is about)
    for at, nxt in zip(reports, [*reports[1:], len(events)], strict=True):
        report = events[at][1]
        assert isinstance(report, Partial)
        named = {p.sample_id for p in report.parts}
        # the samples this step finished: named last step, not now, and sent right after this report
        finished = (before - named) & {sid for kind, sid in events[at + 1 : nxt] if kind == "sample"}
        # every running generation made a token this step, so the report names each; the other rows are free,
        # but for those of the samples still to be sent
        assert report.free_rows == ROWS - len(named) - len(finished), (at, events)
        before, with_finished = named, with_finished + bool(finished)
    assert with_finished >= 2
    flight = read_flight(jd.flight("rollout-0"))
    assert flight is not None and flight.generated_tokens == flight.sent_tokens > 0
    assert flight.dropped_tokens == 0


def test_a_version_overtaken_before_the_safe_point_is_reported_skipped_with_its_transfer(tmp_path) -> None:
    """Versions the unit's weight node fetched while the engine stepped: the newest is applied, each one it
    overtook (older, or arrived after a newer one) goes back as `weights_skipped` with what crossed the wire for
    it, so that the controller books every copy a link carried (the relay served it to the units below it)."""
    sd = TinyGPT().state_dict()

    def weights(version: int, wire_bytes: int) -> Message:
        header = {"version": version, "names": list(sd), "wire_bytes": wire_bytes, "encoding": "full"}
        return make("weights", {**header, "holder": "tcp://trainer:1"}, list(sd.values()))

    _, unit, conn, thread = _unit(tmp_path, before=[weights(2, 20), weights(1, 10), weights(3, 30)])
    got = [_next(conn) for _ in range(3)]
    conn.send(make("stop", {}))
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert [(m.kind, m.header["version"], m.header["wire_bytes"]) for m in got] == [
        ("weights_skipped", 1, 10),  # older than the one waiting
        ("weights_skipped", 2, 20),  # overtaken by v3
        ("weights_applied", 3, 30),
    ]
    assert all(m.header["holder"] == "tcp://trainer:1" for m in got) and unit.engine.version == 3


def test_announcements_on_two_weights_connections_are_fetched_by_one_fetcher(tmp_path) -> None:
    """The trainer reconnects to a unit (its last announcement failed) while the unit still reads the old
    connection: the same version announced on both is pulled once, by the unit's one fetcher (one per connection
    pulled it twice: the root served it twice, its bytes crossing the link twice)."""
    _, unit, conn, thread = _unit(tmp_path)
    root = WeightNode(unit.node.transport, "inproc://", WeightSyncConfig(delta=False))
    root.publish(1, TinyGPT().state_dict())
    first, second = (unit.node.transport.connect(unit.listener.address, timeout_s=10) for _ in range(2))
    announce(first, 1, [root.address])
    announce(second, 1, [root.address])
    applied = _next(conn)
    assert (applied.kind, applied.header["version"]) == ("weights_applied", 1)
    time.sleep(0.5)  # (a second fetch would have started by now)
    assert [s.version for s in root.served] == [1], root.served
    conn.send(make("stop", {}))
    thread.join(timeout=30)
    assert not thread.is_alive()
    first.close()
    second.close()
    root.close()


def test_a_sample_handed_back_while_held_answers_the_latest_dispatch(tmp_path) -> None:
    # the controller requeued it (the unit went silent), another unit's result was taken (attempt 2) and then
    # thrown away (its reward hung: the round was regenerated), and it came back here as attempt 3: a result
    # saying attempt 1 was refused as a second copy, and the sample stayed dispatched here for ever
    first = Request("s0", [1, 3], 12, priority=0.0, iteration=0, attempt=1)
    again = Request("s0", [1, 3], 12, priority=0.0, iteration=0, attempt=3)
    _, _, conn, thread = _unit(
        tmp_path, before=[make("generate", Generate([first])), make("generate", Generate([again]))]
    )
    samples = []
    while not samples:
        msg = conn.recv(timeout_s=30)
        if msg.kind == "sample":
            samples.append(msg.header)
    conn.send(make("stop", {}))
    thread.join(timeout=30)
    assert [(s["sample_id"], s["attempt"]) for s in samples] == [("s0", 3)]  # one generation, the latest dispatch
