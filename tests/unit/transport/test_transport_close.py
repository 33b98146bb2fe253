"""How a connection ended: in order (`PeerClosed`: the peer's kernel closed the stream after everything written to
it, as when its process exits or is killed) or not (a reset: what it wrote last may be lost). The controller
bounds a lost unit's unreported tokens more tightly after an orderly end (`ControllerCore._interrupted`)."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
import torch

from rlctl.errors import PeerClosed, PeerUnreachable
from rlctl.transport import Connection, InprocTransport, Listener, Message, TcpTransport

SECRET = b"close-test"


def _pair() -> tuple[Listener, Connection, Connection]:
    lst = TcpTransport(secret=SECRET).listen("tcp://127.0.0.1:0")
    client = TcpTransport(secret=SECRET).connect(lst.address, timeout_s=5)
    return lst, client, lst.accept(timeout_s=5)


def test_an_orderly_end_arrives_after_everything_written_before_it() -> None:
    lst, client, server = _pair()
    client.send(Message("partial", {"n": 1}, [torch.arange(8, dtype=torch.int32)]))
    client.close()
    assert server.recv(timeout_s=5).kind == "partial"
    with pytest.raises(PeerClosed):
        server.recv(timeout_s=5)
    lst.close()


def test_a_reset_is_not_an_orderly_end() -> None:
    lst, client, server = _pair()
    sock: socket.socket = client._sock  # type: ignore[attr-defined]
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close → RST
    sock.close()
    with pytest.raises(PeerUnreachable) as e:
        server.recv(timeout_s=5)
    assert not isinstance(e.value, PeerClosed), e.value
    lst.close()


def test_inproc_ends_in_order() -> None:
    t = InprocTransport(secret=SECRET)
    lst = t.listen("inproc://")
    client = t.connect(lst.address, timeout_s=5)
    server = lst.accept(timeout_s=5)
    client.close()
    with pytest.raises(PeerClosed):
        server.recv(timeout_s=5)


@pytest.mark.parametrize("mid_message", [False, True])
def test_closing_on_this_side_is_not_the_peer_s_orderly_end(mid_message: bool) -> None:
    """A reader blocked in recv, woken by this side's `close` from another thread (the controller's failed send),
    finds the stream's end as after a peer's close — but it is not the peer's."""
    lst, client, server = _pair()
    if mid_message:  # the reader waits inside a message: its header is in, its frame bytes are not
        big = torch.zeros(1 << 20, dtype=torch.uint8)
        sock: socket.socket = client._sock  # type: ignore[attr-defined]
        client._sock = _Partial(sock, 4096)  # type: ignore[attr-defined]
        client.send(Message("weights", {}, [big]))
    # the descriptor closes a moment after the shutdown that wakes the reader, so the reader reads the end (not
    # a closed descriptor) — the order the controller met
    server._sock = _SlowClose(server._sock)  # type: ignore[attr-defined]
    got: list[BaseException] = []
    reader = threading.Thread(target=lambda: _recv_into(server, got), daemon=True)
    reader.start()
    reader.join(timeout=0.5)
    assert reader.is_alive()  # blocked
    server.close()
    reader.join(timeout=5)
    assert got and isinstance(got[0], PeerUnreachable) and not isinstance(got[0], PeerClosed), got
    lst.close()


class _Partial:
    """A socket that sends the first `n` bytes it is given and drops the rest (the peer waits for them)."""

    def __init__(self, sock: socket.socket, n: int) -> None:
        self.sock, self.n = sock, n

    def sendall(self, data: bytes | memoryview) -> None:
        take = memoryview(data).cast("B")[: self.n]
        self.sock.sendall(take)
        self.n -= len(take)

    def __getattr__(self, name: str) -> object:
        return getattr(self.sock, name)


class _SlowClose:
    """A socket whose `close` waits a moment first."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def close(self) -> None:
        time.sleep(0.3)
        self.sock.close()

    def __getattr__(self, name: str) -> object:
        return getattr(self.sock, name)


def _recv_into(conn: Connection, got: list[BaseException]) -> None:
    try:
        conn.recv()
    except BaseException as e:  # noqa: BLE001 - the test looks at what ended the read
        got.append(e)


def test_a_send_after_close_is_peer_unreachable() -> None:
    """close() stops the connection's threads (the tag lane of messages from 4 MiB); a later send (another
    thread's, after a failed recv) says the connection is closed rather than failing on a stopped thread pool."""
    lst, client, server = _pair()
    size = 5 << 20
    payload = torch.zeros(size, dtype=torch.uint8)
    got: list[Message] = []
    reader = threading.Thread(target=lambda: got.append(server.recv(timeout_s=5)))
    reader.start()
    client.send(Message("weights", {}, [payload]))  # starts the lane for the large one
    reader.join()
    assert got[0].tensors[0].numel() == size
    client.close()
    with pytest.raises(PeerUnreachable, match="connection is closed"):
        client.send(Message("weights", {}, [payload]))
    server.close()
    lst.close()
