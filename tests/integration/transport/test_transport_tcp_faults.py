"""TCP transport over real loopback sockets and processes: auth, timeouts, dying and stalling peers."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from rlctl.errors import AuthError, PeerClosed, PeerTimeout, PeerUnreachable
from rlctl.transport import Message, TcpConfig, TcpTransport
from rlctl.transport.auth import HELLO, NONCE_BYTES, VERDICT_BYTES

SECRET = b"per-job-secret"


@pytest.fixture
def listener():
    lst = TcpTransport(secret=SECRET, config=TcpConfig(stall_timeout_s=1.0)).listen("tcp://127.0.0.1:0")
    yield lst
    lst.close()


def _refusals(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "does not hold this job's secret" in r.getMessage()]


def test_wrong_secret_is_refused_on_both_sides(listener, caplog):
    """The client is told; the listener logs the refusal naming the peer, and accept() never returns it."""
    with caplog.at_level(logging.WARNING, logger="rlctl.transport.tcp"):
        with pytest.raises(AuthError, match=listener.address):
            TcpTransport(secret=b"not-the-secret").connect(listener.address, timeout_s=5)
        with pytest.raises(PeerTimeout):
            listener.accept(timeout_s=0.5)
    (line,) = _refusals(caplog)
    assert line.startswith(f"{listener.address}: tcp://127.0.0.1:")


def test_unauthenticated_bytes_are_never_read_as_a_message(listener, caplog):
    """A peer that skips the handshake and sends a frame is refused after the fixed-size proof."""
    host, port = listener.address.removeprefix("tcp://").rsplit(":", 1)
    with caplog.at_level(logging.WARNING, logger="rlctl.transport.tcp"):
        with socket.create_connection((host, int(port)), timeout=5) as s:
            hello = s.recv(len(HELLO) + NONCE_BYTES, socket.MSG_WAITALL)
            assert hello.startswith(HELLO)
            s.sendall(b"RLM1" + b"\x00" * 60 + b"payload" * 1000)  # a 'message' instead of a proof
            verdict = s.recv(VERDICT_BYTES, socket.MSG_WAITALL)
        with pytest.raises(PeerTimeout):
            listener.accept(timeout_s=0.5)
    assert verdict[:2] == b"NO" and len(_refusals(caplog)) == 1


def test_connect_refused_and_handshake_timeout_name_the_peer():
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    with pytest.raises(PeerUnreachable, match=f"tcp://127.0.0.1:{port}"):
        TcpTransport(secret=SECRET).connect(f"tcp://127.0.0.1:{port}", timeout_s=2)
    silent = socket.socket()  # accepts at the kernel level but never says hello
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    addr = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
    with pytest.raises(PeerTimeout, match=addr):
        TcpTransport(secret=SECRET).connect(addr, timeout_s=0.3)
    silent.close()


def test_read_timeout_names_the_peer_and_the_connection_survives(listener):
    accepted = []
    th = threading.Thread(target=lambda: accepted.append(listener.accept(timeout_s=5)))
    th.start()
    client = TcpTransport(secret=SECRET).connect(listener.address, timeout_s=5)
    th.join()
    server = accepted[0]
    with pytest.raises(PeerTimeout, match=server.peer):
        server.recv(timeout_s=0.1)
    client.send(Message("hello", {"n": 1}, [torch.ones(3)]))
    assert server.recv(timeout_s=5).header == {"n": 1}
    client.close()
    server.close()


# A peer process that authenticates, announces a 64 MiB tensor (its header tagged, as a real sender's), sends 1 MiB
# of it, then waits.
_HALF_SENDER = textwrap.dedent(
    """
    import sys, torch
    from rlctl.transport import Message, TcpTransport
    from rlctl.transport.framing import PREAMBLE, encode_header, wire_tensors
    conn = TcpTransport(secret=bytes.fromhex(sys.argv[2])).connect(sys.argv[1], timeout_s=10)
    msg = Message("weights", {}, wire_tensors([torch.zeros(64 << 20, dtype=torch.uint8)]))
    head = encode_header(msg, msg.tensors)
    head += conn._out.next().header(head[: PREAMBLE.size], head[PREAMBLE.size :])
    conn._sock.sendall(head + bytes(1 << 20))
    print("sent", flush=True)
    sys.stdin.read()
    """
)


def _half_sender(address: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _HALF_SENDER, address, SECRET.hex()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_peer_killed_mid_message_is_peer_unreachable(listener):
    proc = _half_sender(listener.address)
    try:
        server = listener.accept(timeout_s=30)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "sent"
        proc.kill()
        with pytest.raises(PeerUnreachable, match="closed mid-message"):
            server.recv(timeout_s=30)
    finally:
        proc.kill()
        proc.wait()


def test_peer_stalling_mid_message_times_out(listener):
    proc = _half_sender(listener.address)
    try:
        server = listener.accept(timeout_s=30)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "sent"
        with pytest.raises(PeerTimeout, match="stalled"):
            server.recv(timeout_s=30)  # the message started; the stall bound (1 s) applies
        with pytest.raises(PeerUnreachable):
            server.recv(timeout_s=0.1)  # a half-read stream is closed, never reused
    finally:
        proc.kill()
        proc.wait()


# A peer that sends 64 KiB messages from a thread until it is killed, with a message from the listener unread (a
# close would reset the stream): it prints how many sends had returned, then kills itself.
_KILLED_SENDER = textwrap.dedent(
    """
    import os, signal, sys, threading, time, torch
    from rlctl.transport import Message, TcpTransport
    conn = TcpTransport(secret=bytes.fromhex(sys.argv[2])).connect(sys.argv[1], timeout_s=10)
    if sys.argv[3] == "keep":
        conn.end_in_order_on_exit()
    sent = [0]
    def pump():
        for i in range(10_000):
            conn.send(Message("part", {"i": i}, [torch.full((16384,), float(i))]))
            sent[0] = i + 1
    threading.Thread(target=pump, daemon=True).start()
    time.sleep(1.0)
    print(sent[0], flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "not-kept"])
def test_a_killed_peer_with_a_keeper_ends_in_order_after_every_message_it_sent(listener, keep):
    """Killed while the listener does not read (its window full, the rest in the sender's queue) and with bytes it
    has not read: with a keeper (`Connection.end_in_order_on_exit`) every message whose send returned arrives, in
    order, then PeerClosed; without one the kill's close resets the stream and its queued messages are lost."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_SENDER, listener.address, SECRET.hex(), "keep" if keep else "no"],
        stdout=subprocess.PIPE,
        text=True,
    )
    server = listener.accept(timeout_s=30)
    try:
        server.send(Message("ping"))  # never read by the sender: its close with it unread is a reset
        assert proc.stdout is not None
        sent = int(proc.stdout.readline())
        proc.wait(timeout=30)
        got, end = [], None
        while end is None:
            try:
                got.append(server.recv(timeout_s=30))
            except PeerUnreachable as e:
                end = e
        assert [m.header["i"] for m in got] == list(range(len(got)))
        assert all(float(m.tensors[0][0]) == m.header["i"] for m in got)
        if keep:
            assert len(got) >= sent and isinstance(end, PeerClosed), (len(got), sent, end)
        else:  # what the keeper is for (if this fails, the kernel no longer resets such a close)
            assert len(got) < sent and not isinstance(end, PeerClosed), (len(got), sent, end)
    finally:
        proc.kill()
        proc.wait()
        server.close()


@pytest.fixture
def patient_listener():
    """The default stall bound: hashing and sending 12 MB frames on a loaded 2-core machine can stall a stripe
    stream past the 1 s bound the stall tests use."""
    lst = TcpTransport(secret=SECRET).listen("tcp://127.0.0.1:0")
    yield lst
    lst.close()


def test_striped_connection_round_trips_and_interleaves_with_plain_clients(patient_listener):
    """num_streams=3: large frames are split over three sockets; small ones and headers use the main one."""
    listener = patient_listener
    striped = TcpTransport(secret=SECRET, config=TcpConfig(num_streams=3, stripe_min_bytes=1 << 20))
    plain = TcpTransport(secret=SECRET)
    accepted = []

    def accept_two():
        accepted.extend(listener.accept(timeout_s=20) for _ in range(2))

    th = threading.Thread(target=accept_two)
    th.start()
    a = striped.connect(listener.address, timeout_s=20)
    b = plain.connect(listener.address, timeout_s=20)
    th.join()
    servers = {len(c._extra): c for c in accepted}
    assert sorted(servers) == [0, 2]  # the stripe streams joined the striped connection, not the plain one
    tensors = [torch.randn(3_000_001), torch.arange(10), torch.randint(0, 255, (5 << 20,), dtype=torch.uint8)]

    def echo():
        s = servers[2]
        for _ in range(2):
            req = s.recv(timeout_s=20)
            s.reply(req, Message("echo", req.header, req.tensors))

    th = threading.Thread(target=echo)
    th.start()
    for i in range(2):
        reply = a.request(Message("big", {"i": i}, tensors), timeout_s=20)
        assert reply.header == {"i": i} and all(torch.equal(x, y) for x, y in zip(tensors, reply.tensors, strict=True))
    th.join()
    b.send(Message("plain"))
    assert servers[0].recv(timeout_s=20).kind == "plain"
    for c in (a, b, *accepted):
        c.close()
