"""Security of the wire: peers without the job's secret are refused before any payload is read, nothing
received is ever unpickled, and listeners bind only the interface they were given.
"""

from __future__ import annotations

import ast
import contextlib
import ipaddress
import logging
import os
import pickle
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch

from rlctl.agents.listen import store_listener
from rlctl.errors import AuthError, PeerTimeout, PeerUnreachable, ProtocolError
from rlctl.transport import InprocTransport, Message, TcpTransport, TensorSpec, auth, framing, tcp
from rlctl.transport.auth import HELLO, MAC_BYTES, NONCE_BYTES, VERDICT_BYTES
from rlctl.transport.base import bind_host
from rlctl.transport.framing import MAGIC
from rlctl.weights.node import WeightNode
from tests.conftest import ROOT

SECRET = b"the-job-secret"


@pytest.fixture
def listener():
    lst = TcpTransport(secret=SECRET).listen("tcp://127.0.0.1:0")
    yield lst
    lst.close()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """What is read off handshaking sockets (bytes, by the side that names `peer`), and whether any frame
    decoding is attempted."""
    seen: dict[str, list[Any]] = {"recv_exact": [], "decoded": []}
    real = tcp._recv_exact

    def recv_exact(sock: socket.socket, n: int, peer: str, **kw: Any) -> bytes:
        seen["recv_exact"].append((n, peer))
        return real(sock, n, peer, **kw)

    monkeypatch.setattr(tcp, "_recv_exact", recv_exact)
    for name in ("parse_preamble", "decode_header"):
        monkeypatch.setattr(framing, name, lambda *a, name=name: seen["decoded"].append(name))
    return seen


def _accept_in_thread(lst: Any, *, timeout_s: float = 10) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["conn"] = lst.accept(timeout_s=timeout_s)
        except Exception as e:  # noqa: BLE001 - the outcome under test
            out["err"] = e

    th = threading.Thread(target=run)
    th.start()
    return th, out


def _addr(lst: Any) -> tuple[str, int]:
    host, port = lst.address.removeprefix("tcp://").rsplit(":", 1)
    return host, int(port)


def _refused(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "does not hold this job's secret" in r.getMessage()]


def test_a_raw_peer_sending_a_frame_is_refused_after_the_fixed_size_proof(
    listener, reads, caplog: pytest.LogCaptureFixture
) -> None:
    th, out = _accept_in_thread(listener, timeout_s=2)
    frame = MAGIC + (2**20).to_bytes(4, "big") + msgspec.msgpack.encode(["kind", {}, 1, 0, []]) + b"payload" * 10_000
    with caplog.at_level(logging.WARNING, logger="rlctl.transport.tcp"):
        with socket.create_connection(_addr(listener), timeout=5) as s:
            hello = s.recv(len(HELLO) + NONCE_BYTES, socket.MSG_WAITALL)
            assert hello.startswith(HELLO)
            with contextlib.suppress(ConnectionResetError):  # the listener may already have closed on us
                s.sendall(frame)  # a message where the proof belongs
            verdict = s.recv(VERDICT_BYTES, socket.MSG_WAITALL)
            try:
                rest = s.recv(1)
            except ConnectionResetError:  # closed with our unread bytes in its buffer: a reset
                rest = b""
        th.join()
    assert verdict == b"NO" + bytes(MAC_BYTES) and rest == b""  # refused, then closed
    assert isinstance(out["err"], PeerTimeout)  # accept() never sees it: the refusal is logged, naming the peer
    (line,) = _refused(caplog)
    assert line.startswith(f"{listener.address}: tcp://127.0.0.1:")
    assert [n for n, _ in reads["recv_exact"]] == [NONCE_BYTES + MAC_BYTES]  # not one byte beyond the proof
    assert reads["decoded"] == []  # no preamble or header was ever parsed


def test_a_peer_with_the_wrong_secret_is_refused_and_sends_nothing_more(
    listener, reads, caplog: pytest.LogCaptureFixture
) -> None:
    th, out = _accept_in_thread(listener, timeout_s=2)
    with caplog.at_level(logging.WARNING, logger="rlctl.transport.tcp"):
        with pytest.raises(AuthError, match="refused our credentials"):
            TcpTransport(secret=b"another-jobs-secret").connect(listener.address, timeout_s=5)
        th.join()
        # the listener logs its refusal after it sent the verdict the client read: by the end of accept's 2 s, unless
        # a loaded machine ran its thread late
        deadline = time.monotonic() + 30
        while not _refused(caplog) and time.monotonic() < deadline:
            time.sleep(0.01)
    assert isinstance(out["err"], PeerTimeout) and len(_refused(caplog)) == 1
    by_listener = [n for n, peer in reads["recv_exact"] if peer != listener.address]  # the client names the address
    assert by_listener == [NONCE_BYTES + MAC_BYTES] and reads["decoded"] == []


def test_a_silent_peer_does_not_hold_up_the_next_connection(listener) -> None:
    """A socket that connects and never answers the hello waits in its own handshake thread (up to the handshake
    timeout, 10 s); a real client behind it is accepted at once."""
    with socket.create_connection(_addr(listener), timeout=5) as silent:
        silent.recv(len(HELLO) + NONCE_BYTES, socket.MSG_WAITALL)
        t0 = time.monotonic()
        client = TcpTransport(secret=SECRET).connect(listener.address, timeout_s=5)
        server = listener.accept(timeout_s=5)
        waited = time.monotonic() - t0
        client.send(Message("hi", {"n": 1}))
        assert server.recv(timeout_s=5).header == {"n": 1}
        client.close()
        server.close()
    assert waited < 5  # not the silent peer's 10 s


class _BitFlipProxy:
    """Forwards one TCP connection to `target`, flipping one bit of the client → server stream at byte `at` (None:
    none), and keeping a copy of that stream (`seen`)."""

    def __init__(self, target: tuple[str, int], at: int | None) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self.server.getsockname()[1]}"
        self.target, self.at, self.seen = target, at, bytearray()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        down, _ = self.server.accept()
        up = socket.create_connection(self.target)
        threading.Thread(target=self._pipe, args=(up, down, None), daemon=True).start()
        self._pipe(down, up, self.at, self.seen)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, flip_at: int | None, keep: bytearray | None = None) -> None:
        seen = 0
        with contextlib.suppress(OSError):
            while data := bytearray(src.recv(1 << 16)):
                if flip_at is not None and seen <= flip_at < seen + len(data):
                    data[flip_at - seen] ^= 0x01
                seen += len(data)
                if keep is not None:
                    keep += data
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def test_a_frame_altered_after_the_handshake_is_refused(listener) -> None:
    """Every message is tagged under the connection's keys: one bit flipped in a tensor frame on the way (the
    framing still parses) fails the receiver's check, which names the peer and closes the connection."""
    handshake = NONCE_BYTES + MAC_BYTES + 1 + tcp._STREAMS.size  # client → server before the first message
    proxy = _BitFlipProxy(_addr(listener), at=handshake + 4096)
    client = TcpTransport(secret=SECRET).connect(proxy.address, timeout_s=5)
    server = listener.accept(timeout_s=5)
    payload = torch.arange(1 << 16, dtype=torch.int32)
    client.send(Message("weights", {"v": 1}, [payload]))
    with pytest.raises(ProtocolError, match=r"message 'weights' failed authentication"):
        server.recv(timeout_s=5)
    with pytest.raises(PeerUnreachable):
        server.recv(timeout_s=1)  # closed: nothing after it is trusted
    client.close()


def test_a_message_replayed_or_moved_to_another_connection_is_refused() -> None:
    """The tag binds a message to its connection's keys and its place in the stream."""
    keys = auth.SessionKeys.pair(SECRET)
    a, b = socket.socketpair()
    sender = tcp.TcpConnection(a, "b", tcp.TcpConfig(), keys=keys[0])
    sender.send(Message("x", {"i": 0}, [torch.ones(8)]))
    sender.close()
    recorded = _drain(b)  # what went on the wire
    a, b = socket.socketpair()
    receiver = tcp.TcpConnection(b, "peer-a", tcp.TcpConfig(), keys=keys[1])
    a.sendall(recorded + recorded)  # the same message twice: the second is a replay
    assert receiver.recv(timeout_s=5).header == {"i": 0}
    with pytest.raises(ProtocolError, match="failed authentication"):
        receiver.recv(timeout_s=5)
    a.close()
    a, b = socket.socketpair()
    other = tcp.TcpConnection(b, "peer-a", tcp.TcpConfig(), keys=auth.SessionKeys.pair(SECRET)[1])
    a.sendall(recorded)  # recorded on another connection (other keys)
    with pytest.raises(ProtocolError, match="failed authentication"):
        other.recv(timeout_s=5)
    a.close()


class _Asked:
    """A BufferProvider that records what it was asked for and refuses it (nothing is allocated)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, list[int]]] = []

    def __call__(self, kind: str, header: dict[str, Any], specs: list[TensorSpec]) -> list[torch.Tensor]:
        self.asked.append((kind, [s.nbytes for s in specs]))
        raise ProtocolError(f"the provider was asked for {kind!r}")


def test_a_forged_header_is_refused_before_anything_is_allocated_for_it() -> None:
    """An on-path peer without the keys injects a well-formed header announcing 16 GiB: its header's tag fails
    before the header is parsed, so the BufferProvider is never asked (it would have allocated the 16 GiB)."""
    keys = auth.SessionKeys.pair(SECRET)
    a, b = socket.socketpair()
    receiver = tcp.TcpConnection(b, "peer-a", tcp.TcpConfig(), keys=keys[1])
    body = msgspec.msgpack.encode(framing.WireHeader("weights", {}, 1, 0, [("uint8", [16 << 30], 16 << 30)]))
    a.sendall(framing.PREAMBLE.pack(MAGIC, len(body)) + body + bytes(auth.TAG_BYTES) + bytes(1 << 16))
    provider = _Asked()
    with pytest.raises(ProtocolError) as e:
        receiver.recv(timeout_s=5, into=provider)
    assert provider.asked == [], provider.asked
    assert str(e.value).startswith("peer-a: a message's header failed authentication"), e.value
    with pytest.raises(PeerUnreachable):
        receiver.recv(timeout_s=1)  # closed: nothing after it is trusted
    a.close()


def test_a_header_altered_on_the_way_is_refused_before_the_buffer_provider_is_asked(listener) -> None:
    """One bit flipped inside a real message's header (the kind: it still parses) over a listener's connection."""
    handshake = NONCE_BYTES + MAC_BYTES + 1 + tcp._STREAMS.size  # client → server before the first message
    proxy = _BitFlipProxy(_addr(listener), at=handshake + framing.PREAMBLE.size + 3)  # "weights" → "wdights"
    client = TcpTransport(secret=SECRET).connect(proxy.address, timeout_s=5)
    server = listener.accept(timeout_s=5)
    client.send(Message("weights", {"v": 1}, [torch.arange(1 << 16, dtype=torch.int32)]))
    provider = _Asked()
    with pytest.raises(ProtocolError) as e:
        server.recv(timeout_s=5, into=provider)
    assert provider.asked == [], provider.asked
    assert str(e.value).startswith(f"{server.peer}: a message's header failed authentication"), e.value
    client.close()


def _drain(sock: socket.socket) -> bytes:
    out = bytearray()
    while chunk := sock.recv(1 << 16):
        out += chunk
    sock.close()
    return bytes(out)


def test_a_server_without_the_secret_gets_nothing_from_a_client() -> None:
    """The client checks the server's proof before it names its stream or sends any message."""
    srv = socket.create_server(("127.0.0.1", 0))
    got: dict[str, bytes] = {}

    def impostor() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.sendall(HELLO + os.urandom(NONCE_BYTES))
            got["proof"] = conn.recv(NONCE_BYTES + MAC_BYTES, socket.MSG_WAITALL)
            conn.sendall(b"OK" + os.urandom(MAC_BYTES))  # claims success, cannot prove it
            conn.settimeout(5)
            got["after"] = conn.recv(1 << 16)

    th = threading.Thread(target=impostor)
    th.start()
    with pytest.raises(AuthError, match="failed to prove"):
        TcpTransport(secret=SECRET).connect(f"tcp://127.0.0.1:{srv.getsockname()[1]}", timeout_s=5)
    th.join()
    srv.close()
    assert len(got["proof"]) == NONCE_BYTES + MAC_BYTES and got["after"] == b""


def test_inproc_refuses_the_wrong_secret() -> None:
    lst = InprocTransport(secret=SECRET).listen("inproc://")
    try:
        with pytest.raises(AuthError):
            InprocTransport(secret=b"other").connect(lst.address, timeout_s=1)
    finally:
        lst.close()


# -- nothing on the wire is unpickled -----------------------------------------------------------------------
UNPICKLED: list[str] = []


def _record_unpickling() -> str:
    UNPICKLED.append("boom")
    return "boom"


class _Bomb:
    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_record_unpickling, ())


def test_pickles_on_the_wire_stay_inert_bytes() -> None:
    """A header carrying pickles (as bytes, as a msgpack ext) and a frame full of one arrive as data."""
    bomb = pickle.dumps(_Bomb())
    a, b = socket.socketpair()
    ca, cb = tcp.TcpConnection(a, "b", tcp.TcpConfig()), tcp.TcpConnection(b, "a", tcp.TcpConfig())
    try:
        payload = torch.frombuffer(bytearray(bomb), dtype=torch.uint8)
        ca.send(Message("x", {"p": bomb, "e": msgspec.msgpack.Ext(1, bomb)}, [payload]))
        got = cb.recv(timeout_s=5)
    finally:
        ca.close()
        cb.close()
    assert got.header["p"] == bomb and isinstance(got.header["e"], msgspec.msgpack.Ext)
    assert bytes(got.tensors[0].numpy()) == bomb
    assert UNPICKLED == []


WIRE_PACKAGES = ("transport", "agents")
UNPICKLERS = {"pickle", "_pickle", "cPickle", "marshal", "dill", "cloudpickle", "shelve", "joblib", "multiprocessing"}


def _modules(pkgs: tuple[str, ...]) -> list[Path]:
    return [p for pkg in pkgs for p in sorted((ROOT / "rlctl" / pkg).rglob("*.py"))]


def test_wire_code_imports_no_unpickler() -> None:
    """The transport and the agents (everything that reads from a peer) import nothing that unpickles."""
    found = []
    for path in _modules(WIRE_PACKAGES):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in UNPICKLERS]
    assert found == []


def test_every_torch_load_is_weights_only() -> None:
    """Anywhere in rlctl: torch.load only with weights_only=True, numpy.load never with allow_pickle."""
    bad = []
    for path in sorted((ROOT / "rlctl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
            kw = {k.arg: k.value for k in node.keywords}
            if node.func.attr == "load" and owner == "torch":
                ok = isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True
            elif node.func.attr == "load" and owner in ("np", "numpy"):
                ok = not (isinstance(kw.get("allow_pickle"), ast.Constant) and kw["allow_pickle"].value)
            else:
                continue
            if not ok:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert bad == []


# -- listeners bind only where they are told ------------------------------------------------------------------
def test_a_listener_binds_only_the_given_interface() -> None:
    lst = TcpTransport(secret=SECRET).listen("tcp://127.0.0.2:0")
    try:
        host, port = _addr(lst)
        assert host == "127.0.0.2"
        with pytest.raises(ConnectionRefusedError):  # the same port on another address of this host: nobody
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        assert (host, port) in _listening_sockets()
        assert ("0.0.0.0", port) not in _listening_sockets()
    finally:
        lst.close()


def test_a_weight_node_binds_only_the_given_interface() -> None:
    with WeightNode(TcpTransport(secret=SECRET), "tcp://127.0.0.2:0") as node:
        host, port = node.address.removeprefix("tcp://").rsplit(":", 1)
        assert host == "127.0.0.2" and ("0.0.0.0", int(port)) not in _listening_sockets()


def test_bind_host_is_the_listeners_interface() -> None:
    assert bind_host("tcp://10.1.2.3:4000") == "10.1.2.3"
    assert bind_host("tcp://[::1]:4000") == "::1"
    assert bind_host("ucx://10.1.2.3:1") == "10.1.2.3"
    assert bind_host("inproc://anon-3") == "127.0.0.1"


def test_the_trainer_groups_store_binds_master_addr_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's TCPStore server would listen on every interface; rank 0 hands it a socket bound to MASTER_ADDR."""
    fd = store_listener("127.0.0.2", 0)
    assert fd is not None
    sock = socket.socket(fileno=fd)
    try:
        host, port = sock.getsockname()[:2]
        assert host == "127.0.0.2" and ("0.0.0.0", port) not in _listening_sockets()
    finally:
        sock.close()
    # a node name that only this node resolves to the loopback (Debian's 127.0.1.1): torch's default, not a lockout
    real = socket.getaddrinfo
    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        lambda host, *a, **k: real("127.0.1.1", *a, **k) if host == "node-1" else real(host, *a, **k),
    )
    assert store_listener("node-1", 0) is None


def test_the_trainer_groups_store_binds_a_master_addr_in_ipv4_shorthand() -> None:
    """127.0.2 is the address 127.0.0.2 (inet_aton), not a node name that resolves to the loopback: bound, versus
    torch's default of every interface with a warning naming it as such a name."""
    fd = store_listener("127.0.2", 0)
    assert fd is not None
    with socket.socket(fileno=fd) as sock:
        assert sock.getsockname()[0] == "127.0.0.2"


def test_the_trainer_groups_store_binds_localhost_in_capitals() -> None:
    """LOCALHOST is localhost (`hosts.loopback`, case ignored), not a node name that resolves to the loopback:
    bound, versus torch's default of every interface with a warning naming it as such a name."""
    fd = store_listener("LOCALHOST", 0)
    assert fd is not None
    with socket.socket(fileno=fd) as sock:
        assert ipaddress.ip_address(sock.getsockname()[0]).is_loopback


def test_connecting_to_a_closed_listener_names_it() -> None:
    lst = TcpTransport(secret=SECRET).listen("tcp://127.0.0.1:0")
    lst.close()
    with pytest.raises(PeerUnreachable, match=lst.address):
        TcpTransport(secret=SECRET).connect(lst.address, timeout_s=2)


def _listening_sockets() -> set[tuple[str, int]]:
    """(address, port) of every listening IPv4 TCP socket of this network namespace (/proc/net/tcp)."""
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] != "0A":  # LISTEN
            continue
        hexip, hexport = fields[1].split(":")
        ip = socket.inet_ntoa(int(hexip, 16).to_bytes(4, "little"))
        out.add((ip, int(hexport, 16)))
    return out


def test_a_connection_reset_after_the_handshake_is_a_transport_error_naming_the_peer() -> None:
    """A server that proves the secret, reads the client's stream request and then resets the connection (a
    proxy or a redirect going away mid-connect): the client raises PeerUnreachable naming it, which callers such as
    a rollout unit's weight fetcher handle, not a bare ConnectionResetError (that killed the fetch thread once)."""
    srv = socket.create_server(("127.0.0.1", 0))

    def server() -> None:
        conn, _ = srv.accept()
        hs = auth.ServerHandshake(SECRET)
        conn.sendall(hs.hello())
        verdict, keys = hs.verdict(conn.recv(hs.ANSWER_BYTES, socket.MSG_WAITALL))
        assert keys is not None
        conn.sendall(verdict)
        conn.recv(1 + tcp._STREAMS.size, socket.MSG_WAITALL)  # "M" + the stripe request
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()  # RST, not FIN: the client's token read fails with ECONNRESET

    th = threading.Thread(target=server)
    th.start()
    address = f"tcp://127.0.0.1:{srv.getsockname()[1]}"
    with pytest.raises(PeerUnreachable, match=rf"{address}: connection failed opening its streams"):
        TcpTransport(secret=SECRET).connect(address, timeout_s=5)
    th.join()
    srv.close()
