"""The in-process transport keeps wire semantics: auth, copies, codec bounds, timeouts, close."""

from __future__ import annotations

import threading

import pytest
import torch

from rlctl.errors import AuthError, PeerTimeout, PeerUnreachable
from rlctl.transport import InprocTransport, Message, make_transport


def test_request_reply_and_tensors_are_copies():
    t = make_transport("inproc", secret=b"s")
    with t.listen("inproc://") as lst:
        client = t.connect(lst.address, timeout_s=1)
        server = lst.accept(timeout_s=1)
        x = torch.arange(6.0).reshape(2, 3).t()

        def serve():
            req = server.recv(timeout_s=5)
            req.tensors[0].add_(1)  # the receiver owns its copy
            server.reply(req, Message("ok", {"sum": float(req.tensors[0].sum())}, req.tensors))

        th = threading.Thread(target=serve)
        th.start()
        reply = client.request(Message("add", {}, [x]), timeout_s=5)
        th.join()
        assert reply.header == {"sum": 21.0} and torch.equal(reply.tensors[0], x + 1)
        assert torch.equal(x, torch.arange(6.0).reshape(2, 3).t())


def test_wrong_secret_is_refused_and_unknown_address_unreachable():
    with InprocTransport(secret=b"right").listen("inproc://auth-test") as lst:
        with pytest.raises(AuthError, match="inproc://auth-test"):
            InprocTransport(secret=b"wrong").connect(lst.address, timeout_s=1)
        with pytest.raises(PeerTimeout):
            lst.accept(timeout_s=0.01)  # nothing was queued for the refused peer
    with pytest.raises(PeerUnreachable, match="nobody listens"):
        InprocTransport(secret=b"right").connect("inproc://auth-test", timeout_s=1)


def test_timeout_close_and_header_codec():
    t = InprocTransport(secret=b"s")
    with t.listen("inproc://") as lst:
        c = t.connect(lst.address, timeout_s=1)
        s = lst.accept(timeout_s=1)
        with pytest.raises(PeerTimeout):
            s.recv(timeout_s=0.01)
        with pytest.raises(ValueError, match="not msgpack-able"):
            c.send(Message("x", {"bad": object()}))
        c.close()
        with pytest.raises(PeerUnreachable, match="closed by peer"):
            s.recv(timeout_s=1)
        with pytest.raises(PeerUnreachable):
            s.send(Message("late"))


def test_make_transport_names_valid_kinds():
    with pytest.raises(ValueError, match="valid: tcp, inproc, ucx"):
        make_transport("udp", secret=b"s")
