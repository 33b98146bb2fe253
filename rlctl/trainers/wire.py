"""Values among the trainer's ranks, as tensors: msgpack bytes in uint8 tensors over the group's collectives,
typed on receipt — never pickled (torch's `*_object` collectives unpickle whatever a peer's bytes say, over
connections nothing authenticates).

    rank src: encode(value) ─▶ broadcast(length: int64) ─▶ broadcast(bytes: uint8[length]) ─▶ every rank: decode
    every rank: encode ─▶ all_gather(lengths) ─▶ all_gather(bytes padded to the longest) ─▶ decode each

What travels is msgpack of builtins, msgspec structs and dataclasses (`rlctl.rl.samples.Sample`); `type` says what
the receiver builds from it (msgspec.convert: a wrong shape is a ProtocolError, not an object of the sender's
choosing). The tensors are CPU tensors: the trainer's groups carry them over gloo (`cpu:gloo,cuda:nccl`).
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
import torch
import torch.distributed as dist

from rlctl.errors import ProtocolError

T = TypeVar("T")


def _encode(value: Any) -> torch.Tensor:
    data = msgspec.msgpack.encode(value)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


def _decode(buf: torch.Tensor, typ: type[T], what: str) -> T:
    try:
        return msgspec.convert(msgspec.msgpack.decode(buf.numpy().tobytes()), typ)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
        raise ProtocolError(f"{what}: {e}") from e


def broadcast_value(value: Any, typ: type[T], *, src: int = 0, group: dist.ProcessGroup | None = None) -> T:
    """`value` of rank `src` (ignored elsewhere) on every rank of `group`, as `typ`."""
    mine = dist.get_rank() == src
    buf = _encode(value) if mine else torch.empty(0, dtype=torch.uint8)
    n = torch.tensor([buf.numel()], dtype=torch.int64)
    dist.broadcast(n, src=src, group=group)
    if not mine:
        buf = torch.empty(int(n.item()), dtype=torch.uint8)
    if buf.numel():
        dist.broadcast(buf, src=src, group=group)
    return _decode(buf, typ, f"a value broadcast by trainer rank {src}")


def all_gather_values(value: Any, typ: type[T], *, group: dist.ProcessGroup | None = None) -> list[T]:
    """Every rank's `value`, in the group's rank order, as `typ`."""
    size = dist.get_world_size(group)
    buf = _encode(value)
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(lengths, torch.tensor([buf.numel()], dtype=torch.int64), group=group)
    longest = max(int(n.item()) for n in lengths)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[: buf.numel()] = buf
    out = [torch.empty(longest, dtype=torch.uint8) for _ in range(size)]
    dist.all_gather(out, padded, group=group)
    return [
        _decode(b[: int(n.item())], typ, f"a value gathered from trainer rank {r}")
        for r, (b, n) in enumerate(zip(out, lengths, strict=True))
    ]
