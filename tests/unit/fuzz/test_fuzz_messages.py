"""Fuzzing the message codec (`rlctl.agents.messages`): any header and tensors under any kind either pass
`check` or raise ProtocolError naming the peer — never msgspec's, KeyError, TypeError — and the agents'
readers drop such messages (logging the peer) and keep reading.
"""

from __future__ import annotations

import copy
import logging
import queue
import random
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.agents.common import ControllerLink
from rlctl.agents.controller import ControllerAgent
from rlctl.agents.messages import (
    FROM_CONTROLLER,
    HEADERS,
    TO_CONTROLLER,
    Heartbeat,
    SampleDone,
    check,
    make,
    parse,
    recv_checked,
)
from rlctl.errors import ProtocolError
from rlctl.transport import InprocTransport, Message

KINDS = tuple(HEADERS)
NUM_MUTATED = 100_000

VALID: dict[str, tuple[dict[str, Any], list[torch.Tensor]]] = {
    "hello": ({"role": "rollout", "name": "rollout-0", "version": 2, "address": "tcp://h:1", "weight_roots": []}, []),
    "generate": (
        {
            "requests": [
                {"sample_id": "s", "prompt_tokens": [1, 2], "max_new_tokens": 4, "priority": 0.5, "iteration": 0},
                {
                    "sample_id": "t",
                    "prompt_tokens": [1],
                    "max_new_tokens": 4,
                    "priority": 0.5,
                    "iteration": 0,
                    "prefix_tokens": [5, 6],
                    "prefix_logprobs": [-0.5, -0.25],
                    "prefix_versions": [0, 1],
                },
            ]
        },
        [],
    ),
    "sample": (
        {"sample_id": "s", "version": 1, "finish_reason": "eos", "num_output_tokens": 3},
        [torch.arange(3, dtype=torch.int32), torch.zeros(3)],
    ),
    "partial": (
        {"parts": [["s", 0, 2], ["t", 4, 1]]},
        [torch.arange(3, dtype=torch.int32), torch.zeros(3), torch.ones(3, dtype=torch.int32)],
    ),
    "withdrawn": (
        {"parts": [["s", 0, 0], ["t", 0, 2]]},
        [torch.arange(2, dtype=torch.int32), torch.zeros(2), torch.ones(2, dtype=torch.int32)],
    ),
    "withdraw": ({"count": 3}, []),
    "evaluate": ({"version": 4, "requests": [["eval-v4-0", [1, 2], 8], ["eval-v4-1", [3], 8]]}, []),
    "evaluated": (
        {"version": 4, "ids": ["eval-v4-0", "eval-v4-1"], "lengths": [2, 1], "version_min": 4, "version_max": 5},
        [torch.arange(3, dtype=torch.int32)],
    ),
    "weights_applied": (
        {"version": 3, "holder": "tcp://h:2", "encoding": "delta", "wire_bytes": 10, "fetch_s": 0.1},
        [],
    ),
    "weights_skipped": ({"version": 2, "holder": "tcp://h:2", "encoding": "full", "wire_bytes": 10}, []),
    "samples": (
        {
            "samples": [
                {"sample_id": "s", "prompt_id": "p", "iteration": 0, "version": 0, "output_tokens": 2, "reward": 0.5}
            ]
        },
        [torch.arange(2, dtype=torch.int32), torch.zeros(2)],
    ),
    "regroup": ({"groups": ["p2"], "iteration": 1}, []),
    "members": ({"datacenter": "a", "rollouts": {"r0": {"address": "x", "weights": "y", "datacenter": "b"}}}, []),
    "trained": (
        {
            "iteration": 0,
            "version": 1,
            "sample_ids": ["s"],
            "reward_mean": 0.5,
            "train_s": 1.0,
            "tokens": 10,
            "loss": 0.1,
            "staleness_violations": 0,
            "busy_s": 1.0,
        },
        [],
    ),
    "checkpointed": ({"version": 4}, []),
    "checkpoint_written": ({"version": 4, "checkpoint": "ab" * 32}, []),
    "weights_available": ({"version": 2, "holders": ["tcp://h:3"]}, []),
    "heartbeat": ({"name": "rollout-0", "state": "running", "version": 1}, []),
    "stop": ({}, []),
    "ping": ({}, []),
    "bye": ({"name": "rollout-0", "state": "stopped"}, []),
    "status": ({}, []),
    "scale": ({"delta": 1, "site": "local"}, []),
    "shutdown": ({"grace_s": 15.0}, []),
}

ODD_VALUES: list[Any] = [
    None,
    True,
    -1,
    0,
    2**63,
    2**64 - 1,
    -(2**63),
    1e308,
    float("nan"),
    float("inf"),
    "",
    "é漢字\u202e\x00",
    "x" * 5000,
    b"\x80\xff",
    [],
    [None],
    {},
    {"": None},
    msgspec.msgpack.Ext(5, b"\x80"),
]


def wire(msg: Message) -> Message:
    """`msg` as a receiver sees it: the header through the real msgpack codec (tuples become lists, etc.)."""
    return Message(msg.kind, msgspec.msgpack.decode(msgspec.msgpack.encode(msg.header)), msg.tensors)


def only_documented(msg: Message) -> str:
    try:
        check(msg, peer="peer-x", kinds=KINDS)
        return "ok"
    except ProtocolError as e:
        assert str(e).startswith("peer-x: "), e
        return "refused"


def test_valid_messages_pass_and_convert() -> None:
    for kind, (header, tensors) in VALID.items():
        assert check(wire(Message(kind, header, tensors)), peer="p", kinds=KINDS).kind == kind
        parse(Message(kind, header), HEADERS[kind])


# -- seeded mutations -------------------------------------------------------------------------------------
def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _odd(r: random.Random) -> Any:
    """One of ODD_VALUES, a copy: a later mutation must not change (or nest) the shared list's containers."""
    return copy.deepcopy(r.choice(ODD_VALUES))


def _mutate(r: random.Random, header: dict[str, Any]) -> dict[str, Any]:
    h: Any = msgspec.msgpack.decode(msgspec.msgpack.encode(header))  # a deep copy
    for _ in range(r.choice([1, 1, 2, 3])):
        path = r.choice(_paths(h))
        if not path:
            h = r.choice([{}, {"unknown": 1}, h])
            continue
        parent = h
        for p in path[:-1]:
            parent = parent[p]
        last, what = path[-1], r.randrange(4)
        if what == 0 and isinstance(parent, dict):
            del parent[last]
        elif what == 0 and isinstance(parent, list):
            parent.pop(last)
        elif what == 1:
            parent[last] = _odd(r)
        elif what == 2 and isinstance(parent, dict):
            parent[r.choice(["extra", "version", "name", "", "\u00e9"])] = _odd(r)
        else:
            parent[last] = [parent[last]] * r.randint(0, 3) if r.random() < 0.5 else str(parent[last])
    return h


def _mutate_tensors(r: random.Random, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    ts = list(tensors)
    what = r.randrange(5)
    if what == 0 and ts:
        ts.pop(r.randrange(len(ts)))
    elif what == 1:
        ts.append(torch.zeros(r.randint(0, 4), dtype=r.choice([torch.int32, torch.float32, torch.int64])))
    elif what == 2 and ts:
        i = r.randrange(len(ts))
        ts[i] = ts[i].to(r.choice([torch.int64, torch.float16, torch.uint8]))
    elif what == 3 and ts:
        i = r.randrange(len(ts))
        ts[i] = ts[i].reshape(1, -1)
    return ts


def test_mutated_messages_only_protocol_errors(fuzz_count: Callable[[str, int], None]) -> None:
    r = random.Random(2024)
    outcomes = {"ok": 0, "refused": 0}
    for i in range(NUM_MUTATED):
        kind = r.choice(KINDS)
        header, tensors = VALID[kind]
        if r.random() < 0.05:
            kind = r.choice(["", "weights", "x" * 100, "HELLO", kind + "\x00"])  # kinds no reader expects
        msg = Message(kind, _mutate(r, header), _mutate_tensors(r, tensors) if r.random() < 0.3 else tensors)
        try:
            outcomes[only_documented(msg)] += 1
        except Exception as e:  # the test: anything undocumented fails it, with the input
            raise AssertionError(f"input {i}: {type(e).__name__}: {e}; {msg.kind!r} {msg.header!r:.500}") from e
    fuzz_count("codec: messages.check, mutated headers and tensors", NUM_MUTATED)
    assert outcomes["ok"] > NUM_MUTATED // 20 and outcomes["refused"] > NUM_MUTATED // 2


# -- hypothesis: any header under any kind ------------------------------------------------------------------------
values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
field_names = st.sampled_from(sorted({f for t in HEADERS.values() for f in t.__struct_fields__})) | st.text(max_size=6)
tensor_lists = st.lists(
    st.tuples(st.sampled_from([torch.int32, torch.float32, torch.int64]), st.integers(0, 3), st.booleans()).map(
        lambda t: torch.zeros((t[1],) if t[2] else (1, t[1]), dtype=t[0])
    ),
    max_size=4,
)


@settings(settings.get_profile("rlctl-fuzz"), max_examples=400)
@given(
    kind=st.sampled_from(KINDS) | st.text(max_size=8),
    header=st.dictionaries(field_names, values, max_size=8),
    tensors=tensor_lists,
)
def test_any_header_under_any_kind(
    fuzz_count: Callable[[str, int], None], kind: str, header: dict[str, Any], tensors: list[torch.Tensor]
) -> None:
    only_documented(wire(Message(kind, header, tensors)))
    fuzz_count("codec: messages.check, hypothesis headers", 1)


# -- the readers keep reading ---------------------------------------------------------------------------------------
BAD = [
    Message("sample", {"sample_id": 5}),  # wrong type
    Message("sample", {**VALID["sample"][0]}, [torch.zeros(3)]),  # one tensor short
    Message("trained", {"iteration": "one"}),  # missing fields
    Message("no-such-kind", {}),
    Message("generate", VALID["generate"][0]),  # a kind this reader does not take
]


@pytest.fixture
def pair() -> tuple[Any, Any]:
    t = InprocTransport(secret=b"s")
    lst = t.listen("inproc://")
    client = t.connect(lst.address, timeout_s=1)
    server = lst.accept(timeout_s=1)
    lst.close()
    return client, server


def test_recv_checked_drops_malformed_messages_naming_the_peer(pair: Any, caplog: pytest.LogCaptureFixture) -> None:
    client, server = pair
    for m in BAD:
        client.send(m)
    client.send(make("heartbeat", Heartbeat(name="rollout-3", state="running")))
    with caplog.at_level(logging.WARNING, logger="rlctl.agents.messages"):
        got = recv_checked(server, peer="rollout-3", kinds=TO_CONTROLLER, timeout_s=5)
    assert got.kind == "heartbeat"
    dropped = [r.getMessage() for r in caplog.records]
    assert len(dropped) == len(BAD) and all("rollout-3" in d for d in dropped)


def test_controller_reader_survives_malformed_messages(pair: Any) -> None:
    """The controller's per-peer reader (the real method): bad messages dropped, good ones in, close reported."""
    client, server = pair
    inbox: queue.Queue[tuple[str, Any, Any]] = queue.Queue()
    reader = threading.Thread(target=ControllerAgent._read, args=(SimpleNamespace(inbox=inbox), "rollout-3", server))
    reader.start()
    for m in BAD:
        client.send(m)
    client.send(make("sample", SampleDone("s", 1, "eos", 2), [torch.arange(2, dtype=torch.int32), torch.zeros(2)]))
    client.close()
    reader.join(timeout=10)
    events = [inbox.get_nowait() for _ in range(inbox.qsize())]
    assert [(what, who, getattr(p[0], "kind", None)) for what, who, p in events] == [
        ("msg", "rollout-3", "sample"),
        ("closed", "rollout-3", None),
    ]
    assert all(isinstance(p[-1], float) for _, _, p in events)  # when each was heard


def test_controller_refuses_a_malformed_hello_without_crashing(pair: Any) -> None:
    client, server = pair
    inbox: queue.Queue[tuple[str, Any, Any]] = queue.Queue()
    agent = SimpleNamespace(inbox=inbox, job=SimpleNamespace(transport=SimpleNamespace(timeout_s=5)))
    client.send(Message("hello", {"role": "emperor", "name": 7}))
    ControllerAgent._greet(agent, server)  # type: ignore[arg-type]
    assert inbox.empty()


def test_agent_link_reader_survives_malformed_messages(pair: Any) -> None:
    """An agent's reader of its controller link (the real method)."""
    controller, agent_end = pair
    inbox: queue.Queue[Message | None] = queue.Queue()
    link = SimpleNamespace(
        _closed=threading.Event(),
        conn=agent_end,
        inbox=inbox,
        name="rollout-0",
        _poll_s=5.0,
        silence_s=60.0,
        _reconnect=False,
    )
    reader = threading.Thread(target=ControllerLink._read, args=(link,))
    reader.start()
    for m in [
        Message("generate", {"requests": [{"sample_id": 1}]}),
        Message("samples", {"samples": []}, [torch.ones(1)]),
    ]:
        controller.send(m)
    controller.send(make("stop"))
    controller.close()
    reader.join(timeout=10)
    got = [inbox.get_nowait() for _ in range(inbox.qsize())]
    assert [m.kind if m is not None else None for m in got] == ["stop", None]
    assert "stop" in FROM_CONTROLLER
