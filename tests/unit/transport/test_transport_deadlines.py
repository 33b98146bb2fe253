"""One deadline per exchange: `handshake_timeout_s` bounds a listener's whole handshake with a peer (a main stream's
wait for its stripe streams included) and `connect(timeout_s)` the client's, however the peer paces its bytes; a
stripe stream joins its connection however soon it comes."""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time
from dataclasses import replace
from typing import Any

import pytest
import torch

from rlctl.errors import PeerTimeout
from rlctl.transport import Message, TcpConfig, TcpTransport, auth, tcp
from rlctl.transport.auth import HELLO, NONCE_BYTES, VERDICT_BYTES

SECRET = b"deadline-test"


def _addr(lst: Any) -> tuple[str, int]:
    host, port = lst.address.removeprefix("tcp://").rsplit(":", 1)
    return host, int(port)


def _dropped(sock: socket.socket, *, drip_every_s: float, most: int) -> bool:
    """Send one byte every `drip_every_s` (at most `most`) until the other end closes `sock`: whether it did."""
    for _ in range(most):
        if select.select([sock], [], [], drip_every_s)[0]:
            try:
                return sock.recv(1) == b""
            except ConnectionResetError:
                return True
        try:
            sock.send(b"x")
        except OSError:
            return True
    return False


def _handshakes_ended(socks: list[socket.socket], *, timeout_s: float) -> bool:
    """Whether the listener's handshake threads for these (client) sockets ended within `timeout_s`."""
    names = {"handshake tcp://{}:{}".format(*s.getsockname()[:2]) for s in socks}
    deadline = time.monotonic() + timeout_s
    while any(t.name in names for t in threading.enumerate()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_peer_dripping_its_handshake_loses_its_slot_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer that sends a byte of its 64-byte answer every 0.1 s is dropped at handshake_timeout_s all the same,
    and the slot it held goes to a client with the secret."""
    monkeypatch.setattr(tcp, "MAX_HANDSHAKES", 1)  # one slot, which the dripper takes
    cfg = TcpConfig(handshake_timeout_s=0.5)
    lst = TcpTransport(secret=SECRET, config=cfg).listen("tcp://127.0.0.1:0")
    with socket.create_connection(_addr(lst), timeout=5) as dripper:
        dripper.recv(len(HELLO) + NONCE_BYTES, socket.MSG_WAITALL)
        assert _dropped(dripper, drip_every_s=0.1, most=40)  # 40 bytes, 4 s: never the whole answer
        assert _handshakes_ended([dripper], timeout_s=5)  # its slot is free
    # the client's handshake has 30 s: at 0.5 s a loaded machine running the listener's thread late dropped the
    # client with the secret too (the deadline under test is the dripper's)
    monkeypatch.setattr(lst, "_cfg", replace(cfg, handshake_timeout_s=30.0))
    client = TcpTransport(secret=SECRET, config=cfg).connect(lst.address, timeout_s=5)
    server = lst.accept(timeout_s=5)
    client.send(Message("hi", {"n": 1}))
    assert server.recv(timeout_s=5).header == {"n": 1}
    client.close()
    server.close()
    lst.close()


def test_connect_timeout_bounds_the_whole_handshake() -> None:
    """A server that drips its 36-byte hello one byte every 0.05 s (then hangs up) does not hold a 0.3 s connect
    past its deadline: PeerTimeout, not the server's hang-up 1.8 s later."""
    srv = socket.create_server(("127.0.0.1", 0))

    def server() -> None:
        conn, _ = srv.accept()
        with conn, contextlib.suppress(OSError):
            for b in HELLO + bytes(NONCE_BYTES):
                conn.sendall(bytes([b]))
                time.sleep(0.05)
            conn.recv(1 << 10)  # its answer, if it is still there; then the end

    th = threading.Thread(target=server, daemon=True)
    th.start()
    with pytest.raises(PeerTimeout, match=r"handshake timed out after 0.3s"):
        TcpTransport(secret=SECRET).connect(f"tcp://127.0.0.1:{srv.getsockname()[1]}", timeout_s=0.3)
    th.join(timeout=5)
    srv.close()


def test_a_stripe_stream_joining_at_once_is_not_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stripe stream's handshake may finish before the main stream's handshake thread runs again (a loaded
    host): here that thread pauses 0.3 s in its first socket tuning, once the token is out."""
    real_tune, paused = tcp._tune, threading.Event()

    def slow_tune(sock: socket.socket, cfg: tcp.TcpConfig) -> None:
        if threading.current_thread().name.startswith("handshake") and not paused.is_set():
            paused.set()
            time.sleep(0.3)
        real_tune(sock, cfg)

    monkeypatch.setattr(tcp, "_tune", slow_tune)
    cfg = TcpConfig(num_streams=2, stripe_min_bytes=1 << 10, stall_timeout_s=5)
    lst = TcpTransport(secret=SECRET, config=cfg).listen("tcp://127.0.0.1:0")
    client = TcpTransport(secret=SECRET, config=cfg).connect(lst.address, timeout_s=5)
    server = lst.accept(timeout_s=5)
    payload = torch.arange(1 << 14, dtype=torch.int32)  # striped across both streams
    client.send(Message("weights", {}, [payload]))
    assert torch.equal(server.recv(timeout_s=5).tensors[0], payload)
    assert paused.is_set()
    client.close()
    server.close()
    lst.close()


@pytest.mark.parametrize("joined", [0, 1])
def test_a_connection_whose_stripe_streams_never_all_come_is_dropped(
    joined: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that asks for two stripe streams and opens fewer (it failed, or stalls): at the handshake deadline
    the listener closes its main stream and those that joined, and forgets its token.

    The deadline (2 s) bounds the client's authentications too, which must end before it for the stripes to be
    what it ends: at 0.5 s, a loaded machine running the listener's thread 0.6 s late ended the main stream's."""
    cfg = TcpConfig(handshake_timeout_s=2.0)
    lst = TcpTransport(secret=SECRET, config=cfg).listen("tcp://127.0.0.1:0")

    def authenticated(role: bytes) -> socket.socket:
        sock = socket.create_connection(_addr(lst), timeout=5)
        hs = auth.ClientHandshake(SECRET, lst.address)
        sock.sendall(hs.answer(sock.recv(hs.HELLO_BYTES, socket.MSG_WAITALL)))
        hs.keys(sock.recv(VERDICT_BYTES, socket.MSG_WAITALL))
        sock.sendall(role)
        return sock

    with caplog.at_level(logging.WARNING, logger="rlctl.transport.tcp"):
        main = authenticated(b"M" + tcp._STREAMS.pack(2, 1 << 20))
        token = main.recv(tcp._TOKEN_BYTES, socket.MSG_WAITALL)
        stripes = [authenticated(b"J" + token) for _ in range(joined)]
        for sock in (main, *stripes):
            assert sock.recv(1) == b"", "the listener closes it"  # within the socket's 5 s timeout
        assert _handshakes_ended([main, *stripes], timeout_s=5)
        for sock in (main, *stripes):
            sock.close()
    assert not lst._pending  # type: ignore[attr-defined]
    assert any(f"{joined} of its 2 stripe streams joined within 2.0s" in r.getMessage() for r in caplog.records)
    with pytest.raises(PeerTimeout):
        lst.accept(timeout_s=0.1)
    lst.close()
