"""One rank of the model-parallel PPO tests (test_megatron_ppo_split.py), as its own process:

    python tests/unit/trainers/megatron_ppo_rank.py RANK WORLD TP PP RENDEZVOUS SAMPLES.pt OUT.pt CHECKPOINT…

Forms a gloo group of WORLD ranks and megatron's parallel state at TP × PP (dp = WORLD ÷ (TP·PP)), then for each
checkpoint does what the trainer agent does for PPO (`rlctl.agents.trainer`, `rl.learner.make_learner`): the
`megatron` backend, a reference model, a `PpoBatchLearner` with the critic on the backend's `critic_trunk`, the
backend's data-parallel group and clipping; rank 0 adds each iteration's samples and steps, the other ranks
follow its broadcasts. Then every rank gathers the full HF weights it would publish and computes the critic's
values of fixed tokens (a collective over the tp × pp group). OUT.pt: {checkpoint: {"weights", "values",
"head", "stats" (rank 0: each step's), "dp"}}.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tests.unit.rank_end import end_rank

TOKENS = torch.randint(3, 96, (3, 20), generator=torch.Generator().manual_seed(7))


def main(
    rank: int, world: int, tp: int, pp: int, rendezvous: Path, samples: Path, out: Path, checkpoints: list[Path]
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    batches = torch.load(samples, weights_only=False)
    torch.save({str(c): train(c, batches[str(c)], rank=rank, tp=tp, pp=pp) for c in checkpoints}, out)
    dist.destroy_process_group()


def train(checkpoint: Path, iterations: list[list[Any]], *, rank: int, tp: int, pp: int) -> dict[str, Any]:
    from rlctl.config.algorithm import PpoAlgorithm
    from rlctl.config.pipeline import Batch
    from rlctl.rl.learner import PpoBatchLearner, make_learner
    from rlctl.trainers.base import load_backend

    backend = load_backend("megatron", checkpoint, tp=tp, pp=pp)
    ref = load_backend("megatron", checkpoint, tp=tp, pp=pp).model
    algorithm = PpoAlgorithm(kind="ppo", lr=1e-3, critic_lr=1e-2, kl_coef=0.05)
    learner = make_learner(
        backend, algorithm, Batch(prompts_per_iteration=3, samples_per_prompt=4, train_micro_batch_samples=5), ref=ref
    )
    assert isinstance(learner, PpoBatchLearner)
    stats: list[dict[str, float]] = []
    published: list[dict[str, torch.Tensor]] = []
    if rank == 0:
        for samples in iterations:
            for s in samples:
                learner.add(s)
                learner.train_ready()
            stats.append(learner.step())
            published.append(backend.weights())
        learner.stop_followers()
    else:
        learner.follow(on_step=lambda: published.append(backend.weights()))
    assert len(published) == len(iterations)
    critic = learner.inner.critic
    with torch.no_grad():
        values = critic(TOKENS)
    dp = backend.data_parallel()
    return {
        "weights": {k: v.clone() for k, v in published[-1].items()},
        "values": values.clone(),
        "head": [critic.head.weight.detach().clone(), critic.head.bias.detach().clone()],
        "stats": stats,
        "dp": [dp.rank, dp.size],
    }


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]), int(a[1]), int(a[2]), int(a[3]), Path(a[4]), Path(a[5]), Path(a[6]), [Path(c) for c in a[7:]])
    end_rank()  # not through finalization (tests/unit/rank_end.py)
