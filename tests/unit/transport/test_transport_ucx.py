"""How a ucx connection ends, over loopback (UCX_TLS=tcp): a reader woken by its own side's close, a peer that
closes in order (PeerClosed after everything it sent, as over TCP), a send the peer never takes (PeerTimeout at
the stall timeout). Skipped when the optional ucxx is not installed."""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from rlctl.errors import PeerClosed, PeerTimeout, PeerUnreachable
from rlctl.transport import Connection, Listener, Message

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ucxx") is None, reason="ucxx not installed (optional extra: pip install 'rlctl[ucx]')"
)
for key, value in {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_TCP_CM_REUSEADDR": "y"}.items():
    os.environ.setdefault(key, value)  # read when UCX initialises, i.e. at the first ucx call below

SECRET = b"ucx-close-test"


@pytest.fixture(scope="module")
def transport() -> Any:
    from rlctl.transport.ucx import UcxConfig, UcxTransport

    return UcxTransport(secret=SECRET, config=UcxConfig(stall_timeout_s=0.5))


def _pair(transport: Any) -> tuple[Listener, Connection, Connection]:
    lst = transport.listen("ucx://127.0.0.1:0")
    accepted: list[Connection] = []
    th = threading.Thread(target=lambda: accepted.append(lst.accept(timeout_s=20)))
    th.start()
    client = transport.connect(lst.address, timeout_s=20)
    th.join()
    return lst, client, accepted[0]


def _in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    """Run `call` on a thread of its own; what it raised lands in the list."""
    got: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as e:  # noqa: BLE001 - the test looks at what ended the call
            got.append(e)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, got


def test_closing_on_this_side_wakes_a_blocked_reader_with_peer_unreachable(transport: Any) -> None:
    lst, client, server = _pair(transport)
    reader, got = _in_thread(server.recv)
    reader.join(timeout=0.5)
    assert reader.is_alive()  # blocked, its receive posted
    server.close()
    reader.join(timeout=10)
    assert got and isinstance(got[0], PeerUnreachable) and not isinstance(got[0], PeerClosed), got
    client.close()
    lst.close()


def test_an_orderly_close_arrives_after_everything_sent_before_it(transport: Any) -> None:
    lst, client, server = _pair(transport)
    for i in range(3):
        client.send(Message("m", {"i": i}, [torch.full((1000,), i)]))
    client.close()
    assert [server.recv(timeout_s=5).header["i"] for _ in range(3)] == [0, 1, 2]
    with pytest.raises(PeerClosed, match="closed by peer"):
        server.recv(timeout_s=5)
    lst.close()


def test_a_send_the_peer_never_takes_ends_at_the_stall_timeout(transport: Any) -> None:
    """The peer never calls recv: the frame's send gives up after stall_timeout_s (the endpoint aborted, the
    request never cancelled) and the connection closes — not an orderly end for the peer."""
    lst, client, server = _pair(transport)
    big = torch.zeros(16 << 20, dtype=torch.uint8)  # rendezvous: it waits for the peer's receive
    sender, got = _in_thread(lambda: client.send(Message("big", {}, [big])))
    sender.join(timeout=10)
    try:
        assert got and isinstance(got[0], PeerTimeout) and "send stalled for 0.5s" in str(got[0]), got
        with pytest.raises(PeerUnreachable) as e:
            server.recv(timeout_s=5)
        assert not isinstance(e.value, PeerClosed), e.value
    finally:
        server.close()
        lst.close()
