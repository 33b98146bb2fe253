"""One rank of the model-parallel GRPO-step tests (test_megatron_tp_grpo.py, test_megatron_pp.py), as its own
process:

    python tests/unit/trainers/megatron_grpo_rank.py RANK WORLD TP PP RENDEZVOUS SAMPLES.pt OUT.pt CHECKPOINT…

Forms a gloo group of WORLD ranks and megatron's parallel state with tensor parallel TP and pipeline parallel
PP, then for each
checkpoint does what the trainer agent does (`rlctl.agents.trainer`): the `megatron` backend, a
`StreamingLearner` on it with the backend's data-parallel group and gradient clipping; rank 0 adds the
samples and steps, the other ranks follow its broadcasts; every rank then gathers the full HF weights it
would publish. OUT.pt: {checkpoint: {"weights", "stats", "dp"}} (stats on rank 0 only).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tests.unit.rank_end import end_rank


def main(
    rank: int, world: int, tp: int, pp: int, rendezvous: Path, samples: Path, out: Path, checkpoints: list[Path]
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    batch = torch.load(samples, weights_only=False)
    torch.save({str(c): one_step(c, batch[str(c)], rank=rank, tp=tp, pp=pp) for c in checkpoints}, out)
    dist.destroy_process_group()


def one_step(checkpoint: Path, samples: list[Any], *, rank: int, tp: int, pp: int) -> dict[str, Any]:
    from rlctl.config.algorithm import GrpoAlgorithm
    from rlctl.rl.learner import StreamingLearner
    from rlctl.trainers.base import load_backend

    backend = load_backend("megatron", checkpoint, tp=tp, pp=pp)
    dp = backend.data_parallel()
    learner = StreamingLearner(
        backend.model,
        GrpoAlgorithm(kind="grpo", lr=1e-3),
        group_size=4,
        micro_batch_samples=5,
        data_parallel=dp,
        clip_grad_norm_=backend.clip_grad_norm_,
    )
    stats: dict[str, float] = {}
    published: list[dict[str, torch.Tensor]] = []
    if rank == 0:
        for s in samples:
            learner.add(s)
            learner.train_ready()
        stats = learner.step()
        published.append(backend.weights())
        learner.stop_followers()
    else:
        learner.follow(on_step=lambda: published.append(backend.weights()))
    (weights,) = published
    # pp > 1, tied: the last stage's copy of the embedding (its tp part) stepped as the first stage's did
    tied_copy_equal = None
    if backend.config.tie_word_embeddings and pp > 1 and backend.stage.last:
        from megatron.core import parallel_state as ps

        mine = weights["model.embed_tokens.weight"].chunk(tp)[ps.get_tensor_model_parallel_rank()]
        tied_copy_equal = torch.equal(backend.model.gpt.output_layer.weight, mine)
    return {
        "weights": {k: v.clone() for k, v in weights.items()},
        "stats": stats,
        "dp": [dp.rank, dp.size],
        "tied_copy_equal": tied_copy_equal,
    }


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]), int(a[1]), int(a[2]), int(a[3]), Path(a[4]), Path(a[5]), Path(a[6]), [Path(c) for c in a[7:]])
    end_rank()  # not through finalization (tests/unit/rank_end.py)
