"""One rank of the FSDP2 tests (test_fsdp.py), as its own process:

    python tests/unit/trainers/fsdp_rank.py RANK WORLD RENDEZVOUS PHASE MODEL SAMPLES.pt JOB OUT.pt

Forms a gloo group of WORLD CPU ranks, loads the `torch` backend on the HF checkpoint MODEL sharded over them
(FSDP2, `rlctl.trainers.fsdp`; WORLD 1: unsharded) and the GRPO learner on it as the trainer agent does: rank 0
adds the samples and steps, the other ranks follow its broadcasts; after each step every rank gathers the
published weights (`wire_weights`, a collective). SAMPLES.pt holds three iterations of samples.

  PHASE "run":     iterations 1 and 2; checkpoint JOB/iter-2 (rank 0 `save_trainer`, the followers `save_shard`:
                   sharded, every rank writes its part of the policy and of AdamW's state); iteration 3.
  PHASE "resume":  fresh ranks restore JOB/iter-2 (the HF policy, then each its own shard); iteration 3.

OUT.pt (rank 0): {"weights": [the fp32 weights after each iteration run], "grad_norms": [...]}.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main(rank: int, world: int, rendezvous: Path, phase: str, model: Path, samples: Path, job: Path, out: Path) -> None:
    from rlctl.checkpoint.trainer import load_trainer, save_shard, save_trainer
    from rlctl.config.job import Batch, GrpoAlgorithm
    from rlctl.launch.agentenv import ParallelConfig
    from rlctl.rl.learner import make_learner
    from rlctl.trainers.base import load_backend

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    iterations = torch.load(samples, weights_only=False)
    backend = load_backend("torch", model, shard=world > 1)
    dp = backend.data_parallel()
    split = ParallelConfig("trainer", dp=dp.size, fsdp=world > 1 or None)
    learner = make_learner(
        backend, GrpoAlgorithm(kind="grpo", lr=1e-3), Batch(samples_per_prompt=4, train_micro_batch_samples=3), ref=None
    )
    optimizers, modules = learner.optimizers(), backend.checkpoint_modules()
    ckpt = job / "iter-2"

    def published() -> dict[str, torch.Tensor]:
        return backend.wire_weights(dtype=torch.float32, tied=backend.model.config.tie_word_embeddings)

    if phase == "resume":
        load_trainer(ckpt, model=backend, optimizers=optimizers, modules=modules, split=split, data_parallel=dp)
    todo = [1, 2, 3] if phase == "run" else [3]
    if rank > 0:
        learner.follow(
            on_step=published,
            on_checkpoint=lambda v: save_shard(
                job / f"iter-{v}", optimizers=optimizers, modules=modules, split=split, data_parallel=dp
            ),
        )
        dist.barrier()
        return
    record: dict[str, list[object]] = {"weights": [], "grad_norms": []}
    for it in todo:
        for s in iterations[it - 1]:
            learner.add(s)
        stats = learner.step()
        record["weights"].append(published())
        record["grad_norms"].append(stats["grad_norm"])
        if phase == "run" and it == 2:
            save_trainer(
                ckpt,
                model=backend,
                optimizers=optimizers,
                modules=modules,
                counters={"version": 2},
                split=split,
                data_parallel=dp,
                announce=lambda: learner.announce_checkpoint(2),
            )
    learner.stop_followers()
    torch.save(record, out)
    dist.barrier()


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]), int(a[1]), Path(a[2]), a[3], Path(a[4]), Path(a[5]), Path(a[6]), Path(a[7]))
