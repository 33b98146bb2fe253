"""Weight broadcast over real sockets and processes: chunk corruption, relay death, re-parenting."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import threading

import pytest
import torch

from bench.netem.bcast_agent import SECRET_ENV, AgentProcess, agent_argv, synthetic_weights
from bench.netem.lab import REPO_ROOT
from rlctl.transport import Message, TcpTransport
from rlctl.weights import chunks
from rlctl.weights.node import WeightNode
from rlctl.weights.plan import Endpoint, plan_broadcast
from rlctl.weights.versions import HeldVersion, WeightSyncConfig, full_payload

SECRET = b"broadcast-test-secret"
CFG = WeightSyncConfig(chunk_bytes=64 << 10, bucket_bytes=128 << 10, chunk_timeout_s=10, max_chunk_retries=2)


def _fake_parent(corrupt: dict[int, int], events: list[str]):
    """A parent speaking the wire protocol by hand: corrupts chunk i the first corrupt[i] times it sends it."""
    sd = synthetic_weights(512 << 10, version=1, seed=5, change_frac=0.0)
    layout = chunks.layout_of(sd)
    flat = chunks.flatten(sd, layout)
    hv = HeldVersion(1, layout, chunks.checksum(flat), flat, complete=True)
    pl = full_payload(flat, CFG, have=True)
    lst = TcpTransport(secret=SECRET).listen("tcp://127.0.0.1:0")

    def send(conn, i):
        r = pl.refs[i]
        data = flat[r.offset : r.offset + r.length].clone()
        if corrupt.get(i, 0) > 0:
            corrupt[i] -= 1
            data[17] ^= 0x40
        conn.send(
            Message(
                "chunk",
                {
                    "version": 1,
                    "bucket": r.bucket,
                    "index": i,
                    "offset": r.offset,
                    "length": r.length,
                    "xxh3": pl.sums[i],
                },
                [data],
            )
        )

    def serve():
        conn = lst.accept(timeout_s=30)
        events.append(conn.recv(timeout_s=10).kind)
        conn.send(Message("manifest", pl.manifest(hv, CFG)))
        for i in range(len(pl.refs)):
            send(conn, i)
        while True:
            try:
                msg = conn.recv(timeout_s=10)
            except Exception:  # noqa: BLE001 - the child hanging up ends the fake
                events.append("hangup")
                break
            events.append(f"{msg.kind} {msg.header.get('index', '')}".strip())
            if msg.kind != "resend":
                break
            send(conn, msg.header["index"])
        conn.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    return lst, th, sd


def test_corrupted_chunk_is_detected_and_sent_again():
    events: list[str] = []
    lst, th, sd = _fake_parent({3: 1}, events)
    with WeightNode(TcpTransport(secret=SECRET), "tcp://127.0.0.1:0", CFG) as node:
        node.fetch(1, [lst.address])
        th.join(timeout=30)
        version, got = node.current()
    lst.close()
    assert events == ["subscribe", "resend 3", "complete"]
    assert version == 1 and all(torch.equal(got[k], sd[k]) for k in sd)


def test_a_parent_that_keeps_corrupting_is_abandoned_for_the_next_holder():
    events: list[str] = []
    lst, th, sd = _fake_parent({2: 99}, events)
    t = TcpTransport(secret=SECRET)
    with WeightNode(t, "tcp://127.0.0.1:0", CFG) as root, WeightNode(t, "tcp://127.0.0.1:0", CFG) as node:
        root.publish(1, sd)
        node.fetch(1, [lst.address, root.address])
        th.join(timeout=30)
        assert node.current()[0] == 1 and node.store.current.weights_xxh3 == root.store.current.weights_xxh3
    lst.close()
    assert events == ["subscribe", "resend 2", "resend 2", "hangup"]  # max_chunk_retries=2, then re-attach


@pytest.fixture
def agents():
    """start({name: options}) → {name: AgentProcess}; the processes start (import torch) in parallel."""
    env = {**os.environ, SECRET_ENV: secrets.token_hex(16)}
    started: dict[str, AgentProcess] = {}

    def start(options: dict[str, dict]) -> dict[str, AgentProcess]:
        procs = {
            name: subprocess.Popen(
                agent_argv("tcp://127.0.0.1:0", chunk_bytes=256 << 10, **opts),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
                cwd=REPO_ROOT,  # `python -m bench.netem.bcast_agent` resolves from the repository root
            )
            for name, opts in options.items()
        }
        started.update({name: AgentProcess(p) for name, p in procs.items()})
        return started

    yield start
    for a in started.values():
        if a.proc.poll() is None:
            a.command(cmd="quit")
    for a in started.values():
        a.quit()


def test_relay_killed_mid_broadcast_children_reattach_and_all_survivors_agree(agents):
    """root → relay → leaf1 → leaf2 (the planner's chain); the relay dies mid-transfer."""
    plan = plan_broadcast([Endpoint("root", "dc")], [Endpoint(n, "dc") for n in ("relay", "leaf1", "leaf2")])
    assert plan.parent == {"relay": "root", "leaf1": "relay", "leaf2": "leaf1"}
    # the root paces its sends (8 MiB in ~2 s), so the relay can be killed mid-way
    nodes = agents({"root": {"pace_bytes_per_s": 4 << 20}, "relay": {}, "leaf1": {}, "leaf2": {}})
    root = nodes["root"]
    root.command(cmd="publish", version=1, bytes=8 << 20, seed=11)
    want = root.wait("published")["xxh3"]
    for name in ("relay", "leaf1", "leaf2"):
        holders = [plan.parent[name], *plan.fallbacks[name]]
        nodes[name].command(cmd="fetch", version=1, holders=[nodes[h].address for h in holders])
    while True:  # leaf1 has some chunks, through the relay, but not all
        ev = nodes["leaf1"].wait("progress", timeout_s=60)
        if ev["chunks"] >= 3:
            assert ev["chunks"] < ev["of"], "broadcast finished before the relay could be killed"
            break
    os.kill(nodes["relay"].proc.pid, signal.SIGKILL)
    nodes["relay"].proc.wait()
    done = {n: nodes[n].wait("current", timeout_s=120) for n in ("leaf1", "leaf2")}
    assert {n: (d["version"], d["xxh3"]) for n, d in done.items()} == {"leaf1": (1, want), "leaf2": (1, want)}
    # leaf1 lost its parent and re-attached to the root; leaf2's parent (leaf1) never failed
    tried = [(addr, "ok" if res == "ok" else "failed") for addr, res in done["leaf1"]["attempts"]]
    assert tried == [(nodes["relay"].address, "failed"), (root.address, "ok")]
    assert done["leaf2"]["attempts"] == [[nodes["leaf1"].address, "ok"]]


def test_a_unit_that_skipped_a_version_gets_an_on_demand_delta_and_both_sides_count_the_bytes(agents):
    """No periodic anchors: after the first full copy, every fetch is a delta — against the version
    the unit holds, encoded on demand when it skipped one — and the root's served log agrees."""
    nodes = agents({"root": {"keep_versions": 3}, "steady": {}, "skipper": {}})
    root, steady, skipper = nodes["root"], nodes["steady"], nodes["skipper"]
    got: dict[str, list[tuple[int, str, int]]] = {"steady": [], "skipper": []}
    for v in (1, 2, 3):
        root.command(cmd="publish", version=v, bytes=2 << 20, seed=4, change_frac=0.01)
        want = root.wait("published")["xxh3"]
        for name, node in (("steady", steady), ("skipper", skipper)):
            if name == "skipper" and v == 2:
                continue
            node.command(cmd="fetch", version=v, holders=[root.address])
            ev = node.wait("current")
            assert (ev["version"], ev["xxh3"]) == (v, want)
            got[name].append((v, ev["received_encoding"], ev["received_bytes"]))
    assert [e for _, e, _ in got["steady"]] == ["full", "delta", "delta"]
    assert [(v, e) for v, e, _ in got["skipper"]] == [(1, "full"), (3, "delta")]
    assert got["skipper"][1][2] < 0.1 * got["skipper"][0][2]
    root.command(cmd="served")
    served = root.wait("served")["served"]
    by_child = {(v, child): (enc, base, n) for v, enc, base, child, n in served}
    assert by_child[(3, skipper.address)] == ("delta", 1, got["skipper"][1][2])
    assert by_child[(3, steady.address)] == ("delta", 2, got["steady"][2][2])
