"""One rank of test_dp_grad_bytes.py, as its own process:

    python tests/unit/trainers/dp_grad_rank.py RANK WORLD RENDEZVOUS BACKEND MODEL SAMPLES.pt MICRO OUT.pt

Forms a gloo group of WORLD CPU ranks, loads BACKEND ('torch', 'fsdp': the torch backend sharded with FSDP2,
'fsdp-step': sharded, reducing the gradients once a step (`DataParallel.reduce_per_step`), or 'megatron' at
tp = pp = 1) on the HF checkpoint MODEL and the GRPO learner on it as the trainer agent does
(`make_learner`, micro-batches of MICRO rows): rank 0 adds the samples, training what is ready, and steps once, the
other ranks follow its broadcasts. Every call of `torch.distributed.all_reduce` and `reduce_scatter_single` (what
`rlctl.rl.gradsum` and FSDP2 hand their gradients to) is recorded as it is made, and the full gradient of each
parameter as the optimizer's step takes it (reduced, divided by the normaliser and clipped; FSDP2's shards gathered).
OUT.pt: {"calls": [(collective, dtype, bytes of its input)], "grads": {name: full fp32 gradient} (megatron: none),
"weights": the torch backend's full weights after the step (megatron: none), "shares": [(the cut's rows, the
forwards this rank ran on its share of it, the learner's summed figures it added) of each cut], "stats": the step's
figures (rank 0's; others: none)}. With RLCTL_TEST_GROUP=N in the environment a group holds N samples (4 otherwise);
with RLCTL_TEST_PPO=1 the learner is PPO's (its critic sharded as the policy where it is; "shares": none).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tests.unit.rank_end import end_rank


def record(calls: list[tuple[str, str, int]], name: str, pick: Callable[..., torch.Tensor]) -> None:
    """Wrap `torch.distributed.<name>` so that each call appends (name, dtype, bytes of the tensor `pick` takes)."""
    real = getattr(dist, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        t = pick(*args, **kwargs)
        calls.append((name, str(t.dtype), t.numel() * t.element_size()))
        return real(*args, **kwargs)

    setattr(dist, name, counted)


def record_grads(grads: dict[str, torch.Tensor], model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """Before each step of `opt`, copy each of `model`'s parameters' full gradient into `grads` (a DTensor's shards
    gathered: a collective, which every rank makes as its optimizer steps, in the same order)."""
    from rlctl.devices import as_dtensor

    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]

    def before_step(*_: Any) -> None:
        for name, p in named:
            assert p.grad is not None, name
            d = as_dtensor(p.grad)
            full = d.full_tensor() if d is not None else p.grad
            grads[name] = full.detach().to(torch.float32, copy=True).cpu()

    opt.register_step_pre_hook(before_step)


def record_shares(learner: Any, model: torch.nn.Module) -> list[tuple[int, int, dict[str, float]]]:
    """Each cut's rows as `learner.backward_share` takes it on this rank, the forwards of `model` it ran (one for
    its share, none where it has no share to run), and what it added to the learner's summed figures."""
    shares: list[tuple[int, int, dict[str, float]]] = []
    forwards = [0]
    model.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    real = learner.backward_share

    def recorded(chunk: list[Any], **kwargs: Any) -> None:
        before, forwards[0] = dict(learner.sums), 0
        real(chunk, **kwargs)
        added = {k: v - before.get(k, 0.0) for k, v in learner.sums.items()}
        shares.append((len(chunk), forwards[0], added))

    learner.backward_share = recorded
    return shares


def main(rank: int, world: int, rendezvous: Path, kind: str, model: Path, samples: Path, micro: int, out: Path) -> None:
    from rlctl.config.algorithm import GrpoAlgorithm, PpoAlgorithm
    from rlctl.config.pipeline import Batch
    from rlctl.rl.learner import make_learner
    from rlctl.trainers.base import load_backend

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    from rlctl.trainers.fsdp import wire_weights

    sharded = kind.startswith("fsdp")
    backend = load_backend(
        "megatron" if kind == "megatron" else "torch", model, shard=sharded, reduce_per_step=kind == "fsdp-step"
    )
    batch = Batch(samples_per_prompt=int(os.environ.get("RLCTL_TEST_GROUP", "4")), train_micro_batch_samples=micro)
    ppo = bool(os.environ.get("RLCTL_TEST_PPO"))
    algorithm = PpoAlgorithm(kind="ppo", lr=1e-3) if ppo else GrpoAlgorithm(kind="grpo", lr=1e-3)
    learner = make_learner(backend, algorithm, batch, ref=None)
    shares = record_shares(learner, backend.model) if kind != "megatron" and not ppo else []
    calls: list[tuple[str, str, int]] = []
    record(calls, "all_reduce", lambda tensor, *a, **k: tensor)
    record(calls, "reduce_scatter_single", lambda output, input, *a, **k: input)
    grads: dict[str, torch.Tensor] = {}
    if kind != "megatron":
        record_grads(grads, backend.model, learner.optimizers()["policy"])
    stats = None
    if rank > 0:
        learner.follow()
    else:
        for s in torch.load(samples, weights_only=False):  # trained as they arrive, as the trainer agent does
            learner.add(s)
            learner.train_ready()
        stats = learner.step()
        learner.stop_followers()
    weights = wire_weights(backend.model, dtype=torch.float32, tied=False) if kind != "megatron" else {}
    torch.save({"calls": calls, "grads": grads, "weights": weights, "shares": shares, "stats": stats}, out)
    dist.barrier()


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]), int(a[1]), Path(a[2]), a[3], Path(a[4]), Path(a[5]), int(a[6]), Path(a[7]))
    end_rank()  # not through finalization (tests/unit/rank_end.py)
