"""How a connection ended: in order (`PeerClosed`: the peer's kernel closed the stream after everything written to
it, as when its process exits or is killed) or not (a reset: what it wrote last may be lost). The controller
bounds a lost unit's unreported tokens more tightly after an orderly end (`ControllerCore._interrupted`)."""

from __future__ import annotations

import socket
import struct

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
