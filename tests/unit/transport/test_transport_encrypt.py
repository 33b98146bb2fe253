"""`transport.encrypt`: a TCP connection whose messages travel encrypted (AES-256-GCM under its own keys): the
bytes on the wire hold none of a message's header or payload, a flipped bit in either is refused (a header before
it is parsed), both ends must agree, and the other kinds refuse."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rlctl.errors import PeerUnreachable, ProtocolError, TransportError
from rlctl.transport import Message, TcpConfig, TcpTransport, TensorSpec, framing, make_transport, tcp
from rlctl.transport.auth import MAC_BYTES, NONCE_BYTES
from tests.unit.transport.test_transport_security import SECRET, _BitFlipProxy

SEALED = TcpConfig(encrypt=True)


@pytest.mark.parametrize("size", [64, 3 << 20])  # one syscall; header then frames piece by piece
def test_the_payload_never_crosses_in_clear_and_arrives_whole(size: int) -> None:
    lst = TcpTransport(secret=SECRET, config=SEALED).listen("tcp://127.0.0.1:0")
    host, port = lst.address.removeprefix("tcp://").rsplit(":", 1)
    tap = _BitFlipProxy((host, int(port)), at=None)
    client = TcpTransport(secret=SECRET, config=SEALED).connect(tap.address, timeout_s=5)
    server = lst.accept(timeout_s=5)
    marker = b"RLCTL-PLAINTEXT-MARKER-"
    payload = torch.frombuffer(bytearray(marker * (size // len(marker) + 1))[:size], dtype=torch.uint8)
    for _ in range(2):  # two messages of each shape: the nonces advance in step on both ends
        client.send(Message("weights-KIND-MARKER", {"sample_id": "HEADER-MARKER"}, [payload]))
        got = server.recv(timeout_s=10)
        assert got.kind == "weights-KIND-MARKER" and got.header == {"sample_id": "HEADER-MARKER"}
        assert torch.equal(got.tensors[0], payload)
        client.send(Message("stop-KIND-MARKER", {"why": "HEADER-MARKER"}))  # no frames: the header's tag only
        got = server.recv(timeout_s=10)
        assert (got.kind, got.header, got.tensors) == ("stop-KIND-MARKER", {"why": "HEADER-MARKER"}, [])
    client.close()
    server.close()
    lst.close()
    seen = bytes(tap.seen)
    assert len(seen) > 2 * size and marker not in seen
    assert b"KIND-MARKER" not in seen and b"HEADER-MARKER" not in seen


def test_a_flipped_bit_in_an_encrypted_header_is_refused_before_it_is_parsed() -> None:
    lst = TcpTransport(secret=SECRET, config=SEALED).listen("tcp://127.0.0.1:0")
    host, port = lst.address.removeprefix("tcp://").rsplit(":", 1)
    handshake = NONCE_BYTES + MAC_BYTES + 1 + tcp._STREAMS.size  # client → server before the first message
    proxy = _BitFlipProxy((host, int(port)), at=handshake + framing.PREAMBLE.size + 3)  # inside the header
    client = TcpTransport(secret=SECRET, config=SEALED).connect(proxy.address, timeout_s=5)
    server = lst.accept(timeout_s=5)
    client.send(Message("weights", {"v": 1}, [torch.arange(16, dtype=torch.int32)]))
    with pytest.raises(ProtocolError, match=r"a message's header failed authentication"):
        server.recv(timeout_s=5)
    client.close()
    lst.close()


def test_a_flipped_bit_in_an_encrypted_frame_is_refused() -> None:
    lst = TcpTransport(secret=SECRET, config=SEALED).listen("tcp://127.0.0.1:0")
    host, port = lst.address.removeprefix("tcp://").rsplit(":", 1)
    proxy = _BitFlipProxy((host, int(port)), at=200 + 4096)
    client = TcpTransport(secret=SECRET, config=SEALED).connect(proxy.address, timeout_s=5)
    server = lst.accept(timeout_s=5)
    client.send(Message("weights", {"v": 1}, [torch.arange(1 << 16, dtype=torch.int32)]))
    with pytest.raises(ProtocolError, match=r"message 'weights' failed authentication"):
        server.recv(timeout_s=5)
    client.close()
    lst.close()


def test_both_ends_must_encrypt(caplog: pytest.LogCaptureFixture) -> None:
    lst = TcpTransport(secret=SECRET, config=SEALED).listen("tcp://127.0.0.1:0")
    with pytest.raises(TransportError):  # the listener closes the stream: reset or closed
        TcpTransport(secret=SECRET).connect(lst.address, timeout_s=5).recv(timeout_s=2)
    lst.close()
    assert any("both ends take the job's transport.encrypt" in r.getMessage() for r in caplog.records)


def test_only_tcp_encrypts() -> None:
    assert isinstance(make_transport("tcp", secret=SECRET, encrypt=True), TcpTransport)
    with pytest.raises(ValueError, match="does not encrypt; valid with encrypt: tcp"):
        make_transport("inproc", secret=SECRET, encrypt=True)


def test_an_empty_frame_travels_encrypted_beside_others() -> None:
    """An empty frame has no bytes on the wire (its view is read-only): the receiver skips it, as unencrypted."""
    lst = TcpTransport(secret=SECRET, config=SEALED).listen("tcp://127.0.0.1:0")
    client = TcpTransport(secret=SECRET, config=SEALED).connect(lst.address, timeout_s=5)
    server = lst.accept(timeout_s=5)
    sent = [torch.arange(4, dtype=torch.float32), torch.empty(0), torch.empty(0, 3, dtype=torch.int8)]
    for _ in range(2):  # the next message still arrives: the stream stayed in step
        client.send(Message("mixed", {"n": 3}, sent))
        got = server.recv(timeout_s=5)
        assert [(t.dtype, t.shape) for t in got.tensors] == [(t.dtype, t.shape) for t in sent]
        assert torch.equal(got.tensors[0], sent[0])
    client.close()
    server.close()
    lst.close()


def test_a_buffer_provider_failing_oddly_closes_the_connection_with_a_protocol_error() -> None:
    """Whatever goes wrong inside a message (here a provider raising a foreign error) leaves the stream half-read:
    the connection closes and the error is the tree's, never a bare one with the connection open out of step."""
    lst = TcpTransport(secret=SECRET, config=SEALED).listen("tcp://127.0.0.1:0")
    client = TcpTransport(secret=SECRET, config=SEALED).connect(lst.address, timeout_s=5)
    server = lst.accept(timeout_s=5)
    client.send(Message("weights", {}, [torch.arange(16, dtype=torch.int32)]))

    def provider(kind: str, header: dict[str, Any], specs: list[TensorSpec]) -> list[torch.Tensor]:
        raise KeyError("a bug in the caller")

    with pytest.raises(ProtocolError, match="receive failed: KeyError"):
        server.recv(timeout_s=5, into=provider)
    with pytest.raises(PeerUnreachable, match="connection is closed"):
        server.recv(timeout_s=1)
    client.close()
    lst.close()
