"""The ucx transport over loopback (UCX_TLS=tcp); skipped when the optional ucxx is not installed."""

from __future__ import annotations

import importlib.util
import logging
import os
import threading

import pytest
import torch

from rlctl.errors import AuthError, PeerTimeout, PeerUnreachable
from rlctl.transport import Message

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ucxx") is None, reason="ucxx not installed (optional extra: pip install 'rlctl[ucx]')"
)
for key, value in {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_TCP_CM_REUSEADDR": "y"}.items():
    os.environ.setdefault(key, value)  # read when UCX initialises, i.e. at the first ucx call below

SECRET = b"ucx-test-secret"


@pytest.fixture(scope="module")
def transport():
    from rlctl.transport.ucx import UcxConfig, UcxTransport

    return UcxTransport(secret=SECRET, config=UcxConfig(stall_timeout_s=10))


def _pair(transport):
    lst = transport.listen("ucx://127.0.0.1:0")
    accepted = []
    th = threading.Thread(target=lambda: accepted.append(lst.accept(timeout_s=20)))
    th.start()
    client = transport.connect(lst.address, timeout_s=20)
    th.join()
    return lst, client, accepted[0]


def test_round_trip_of_dtypes_shapes_and_request_reply(transport):
    lst, client, server = _pair(transport)
    tensors = [
        torch.randn(4, 5).t(),
        torch.empty(0, 3),
        torch.tensor(7, dtype=torch.int64),
        torch.randn(1000).to(torch.bfloat16),
        torch.tensor([True, False]),
    ]

    def serve():
        req = server.recv(timeout_s=20)
        server.reply(req, Message("echo", req.header, req.tensors))

    th = threading.Thread(target=serve)
    th.start()
    reply = client.request(Message("t", {"k": [1, "x"]}, tensors), timeout_s=20)
    th.join()
    assert reply.header == {"k": [1, "x"]}
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(tensors, reply.tensors, strict=True))
    with pytest.raises(PeerTimeout, match=lst.address):
        client.recv(timeout_s=0.2)
    server.send(Message("after-timeout"))
    assert client.recv(timeout_s=20).kind == "after-timeout"  # the timed-out receive did not break the stream
    client.close()
    with pytest.raises(PeerUnreachable):
        server.recv(timeout_s=20)
    lst.close()


def test_wrong_secret_is_refused(transport, caplog):
    """The listener refuses it in the handshake task and logs it; accept() never returns it, and a good client
    after it is accepted."""
    from rlctl.transport.ucx import UcxTransport

    lst = transport.listen("ucx://127.0.0.1:0")
    with caplog.at_level(logging.WARNING, logger="rlctl.transport.ucx"):
        with pytest.raises(AuthError, match="refused our credentials"):
            UcxTransport(secret=b"wrong").connect(lst.address, timeout_s=20)
        with pytest.raises(PeerTimeout):
            lst.accept(timeout_s=1)
    assert any("does not hold this job's secret" in r.getMessage() for r in caplog.records)
    accepted = []
    th = threading.Thread(target=lambda: accepted.append(lst.accept(timeout_s=20)))
    th.start()
    client = transport.connect(lst.address, timeout_s=20)
    th.join()
    client.send(Message("tagged", {"n": 2}, [torch.ones(4)]))
    assert accepted[0].recv(timeout_s=20).header == {"n": 2}
    client.close()
    accepted[0].close()
    lst.close()
