"""Summing gradients over data-parallel ranks in buckets: one all-reduce per bucket, not one per parameter.

    trained parameters' gradients (a missing one: zeros, still in the sum) ─▶ buckets of one dtype and device, in
    parameter order, up to BUCKET_BYTES each ─▶ one flat copy per bucket, all-reduced, copied back

A 0.5B policy has 291 parameters: one NCCL call each is 291 launches and latencies per optimizer step, where
buckets of 25 MiB (torch DDP's default) make about 80 calls of its 2 GB of fp32 gradients. Every rank builds the
same buckets (the same model, parameter order and dtypes), so the collectives pair up. A sum of two ranks is the
same value per element whatever the bucketing; over more ranks the reduction order inside a collective is the
backend's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

BUCKET_BYTES = 25 << 20


def sum_gradients(params: Iterable[torch.nn.Parameter], group: Any = None, *, bucket_bytes: int = BUCKET_BYTES) -> int:
    """Sum the gradients of the parameters of `params` that require one (a LoRA policy's adapters, its frozen
    weights left as they are) over `group` (None: the default group) in place; the all-reduce calls made. A
    parameter without a gradient gets zeros first: a rank whose samples reach no row of it is still in the sum."""
    grads = []
    for p in (p for p in params if p.requires_grad):
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    calls = 0
    for bucket in _buckets(grads, bucket_bytes):
        if len(bucket) == 1:
            dist.all_reduce(bucket[0], group=group)
        else:
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat, group=group)
            for g, part in zip(bucket, flat.split([g.numel() for g in bucket]), strict=True):
                g.copy_(part.view_as(g))
        calls += 1
    return calls


def _buckets(grads: list[torch.Tensor], limit: int) -> Iterator[list[torch.Tensor]]:
    """Runs of consecutive gradients of one dtype and device, each up to `limit` bytes (a larger gradient alone)."""
    bucket: list[torch.Tensor] = []
    size = 0
    for g in grads:
        nbytes = g.numel() * g.element_size()
        if bucket and (_kind(g) != _kind(bucket[0]) or size + nbytes > limit):
            yield bucket
            bucket, size = [], 0
        bucket.append(g)
        size += nbytes
    if bucket:
        yield bucket


def _kind(g: torch.Tensor) -> tuple[torch.dtype, torch.device]:
    return g.dtype, g.device
