"""Gradients are summed over data-parallel ranks in buckets: one all-reduce per bucket of one dtype and device,
the same sums as one all-reduce per parameter, a parameter without a gradient still in the sum, and a frozen one
(a LoRA policy's base weights) left out whoever calls."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.gradsum import _buckets, sum_gradients
from rlctl.rl.grpo import allreduce_grads
from tests.unit.rank_end import end_rank
from tests.unit.tiny_models import small_config

SMALL = small_config(positions=48)


def _grads(model: TinyGPT, rank: int) -> None:
    """Rank-dependent gradients; rank 1 has none for the first parameter (its samples reach no row of it)."""
    for i, p in enumerate(model.parameters()):
        p.grad = None if (rank == 1 and i == 0) else torch.full_like(p, float(rank + 1) * (i + 1))


def _rank(rank: int, init: str, frozen: bool, out: mp.Queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = TinyGPT(SMALL)
        _grads(model, rank)
        for i, p in enumerate(model.parameters()):
            p.requires_grad_(not (frozen and i % 2))
        calls = []
        real = dist.all_reduce

        def counted(tensor: torch.Tensor, *args: object, **kwargs: object) -> object:
            calls.append(tensor.numel())
            return real(tensor, *args, **kwargs)  # type: ignore[arg-type]

        dist.all_reduce = counted  # type: ignore[assignment]
        try:
            if frozen:  # every parameter passed, as PPO passes a module's: the frozen ones are left out inside
                sum_gradients(model.parameters())
            else:
                allreduce_grads(model)
        finally:
            dist.all_reduce = real
        if rank == 0:
            # numpy, not tensors: a tensor crosses the queue as a shared-memory handle that dies with this process
            out.put((len(calls), {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}))
    finally:
        dist.destroy_process_group()
    end_rank(out)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("frozen", [False, True])
def test_two_ranks_sum_every_trained_gradient_in_one_all_reduce(tmp_path: Path, frozen: bool) -> None:
    # one all_reduce per parameter before: TinyGPT's 0.5B shape made 291 NCCL calls an optimizer step. Frozen (every
    # other parameter): each rank's own gradient, not summed (versus summed, zeros given where a rank had none)
    ctx = mp.get_context("spawn")  # not fork: a fork of a threaded pytest worker can deadlock in the child
    out = ctx.Queue()
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [ctx.Process(target=_rank, args=(r, init, frozen, out), daemon=True) for r in (0, 1)]
    for p in procs:
        p.start()
    calls, summed = out.get(timeout=100)
    for p in procs:
        p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0, 0]
    torch.manual_seed(0)
    alone = TinyGPT(SMALL)
    names = [n for n, _ in alone.named_parameters()]
    assert len(names) > 5 and calls == 1  # every fp32 gradient of the small model fits one 25 MiB bucket
    for i, (name, p) in enumerate(alone.named_parameters()):
        own = i == 0 or (frozen and i % 2)  # rank 1 has none for the first: rank 0's alone
        expected = torch.full_like(p, float(i + 1) * (1 if own else 3))  # rank 0's (i+1) + rank 1's 2(i+1)
        assert torch.equal(torch.from_numpy(summed[name]), expected), name


def test_buckets_hold_one_dtype_in_order_up_to_the_limit() -> None:
    f32 = [torch.zeros(10), torch.zeros(10), torch.zeros(30)]  # 40, 40, 120 bytes
    b16 = [torch.zeros(10, dtype=torch.bfloat16)]
    grads = [f32[0], f32[1], b16[0], f32[2]]
    got = [[id(t) for t in b] for b in _buckets(grads, limit=100)]
    # a dtype change closes a bucket; a gradient larger than the limit is a bucket of its own
    assert got == [[id(f32[0]), id(f32[1])], [id(b16[0])], [id(f32[2])]]
    assert [len(b) for b in _buckets(f32, limit=80)] == [2, 1]
    assert [len(b) for b in _buckets(f32, limit=1 << 20)] == [3]
