"""Tensor RPC (tcp, ucx, inproc) for rlctl: messages of a typed header and raw tensors (the weight plane,
rlctl.weights, runs over it).

    from rlctl.transport import Message, make_transport
    t = make_transport("tcp", secret=job_secret)
    with t.listen("tcp://0.0.0.0:0") as lst: ...

See `base.py` for the interface and docs/transport.md for the wire format.
"""

from __future__ import annotations

from rlctl.transport.base import BufferProvider, Connection, Listener, Message, TensorSpec, Transport
from rlctl.transport.inproc import InprocTransport
from rlctl.transport.tcp import TcpConfig, TcpTransport
from rlctl.transport.ucx import UcxTransport

TRANSPORTS: dict[str, type[TcpTransport] | type[InprocTransport] | type[UcxTransport]] = {
    "tcp": TcpTransport,
    "inproc": InprocTransport,
    "ucx": UcxTransport,
}


def make_transport(kind: str, *, secret: bytes, encrypt: bool = False) -> Transport:
    """The transport named `kind` ("tcp" | "ucx" | "inproc") holding the per-job `secret`; `encrypt`: every
    connection's frames encrypted (tcp only: `rlctl check` refuses it with another kind)."""
    try:
        cls = TRANSPORTS[kind]
    except KeyError:
        raise ValueError(f"unknown transport {kind!r}; valid: {', '.join(TRANSPORTS)}") from None
    if encrypt:
        if kind != "tcp":
            raise ValueError(f"transport {kind!r} does not encrypt; valid with encrypt: tcp")
        return TcpTransport(secret=secret, config=TcpConfig(encrypt=True))
    return cls(secret=secret)


__all__ = [
    "TRANSPORTS",
    "BufferProvider",
    "Connection",
    "InprocTransport",
    "Listener",
    "Message",
    "TcpConfig",
    "TcpTransport",
    "TensorSpec",
    "Transport",
    "UcxTransport",
    "make_transport",
]
