"""One rank of the tp = 2 test (test_megatron_tp.py), as its own process:

    python tests/unit/trainers/megatron_tp_rank.py RANK WORLD RENDEZVOUS OUT.json CHECKPOINT…

Forms a gloo group and megatron's parallel state with tp = WORLD, loads its shard of each checkpoint, and
writes what it measured against the `torch` backend (TinyGPT on the whole checkpoint) to OUT.json, one
entry per checkpoint.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main(rank: int, world: int, rendezvous: Path, out: Path, checkpoints: list[Path]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    out.write_text(json.dumps({str(c): measure(c, world) for c in checkpoints}))
    dist.destroy_process_group()


def measure(checkpoint: Path, world: int) -> dict[str, object]:
    from rlctl.engines.hf import load_state_dict
    from rlctl.engines.model import TinyGPT
    from rlctl.rl.samples import token_logprobs
    from rlctl.trainers.megatron import names
    from rlctl.trainers.megatron.backend import MegatronBackend

    mg = MegatronBackend.load(checkpoint, tp=world)
    ref = TinyGPT.from_pretrained(checkpoint)
    x = torch.randint(0, ref.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits_diff = float((mg.model(x) - ref(x)).abs().max())
    token_logprobs(mg.model, x).sum().backward()
    token_logprobs(ref, x).sum().backward()
    # gradients in HF layout: each rank's shard through the table, gathered like the weights
    shard = names.to_hf(
        {k: p.grad for k, p in mg.model.gpt.named_parameters() if p.grad is not None}, ref.config, tp=world
    )
    shards: list[object] = [None] * world
    dist.all_gather_object(shards, shard)
    grads = names.gather_hf(shards)  # type: ignore[arg-type]
    grad_rel = max(float((grads[n] - p.grad).abs().max() / p.grad.abs().max()) for n, p in ref.named_parameters())
    weights = mg.weights()  # all-gathered over the tp group
    checkpoint_sd = load_state_dict(checkpoint)
    return {
        "shard_numel": sum(t.numel() for t in mg.shard().values()),
        "full_numel": sum(t.numel() for t in checkpoint_sd.values()),
        "logits_max_abs_diff": logits_diff,
        "grad_max_rel_diff": grad_rel,
        "weights_names_are_the_engine_names": list(weights) == list(ref.state_dict()),
        "weights_bit_exact": all(torch.equal(weights[k], v) for k, v in checkpoint_sd.items()),
    }


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), [Path(a) for a in sys.argv[5:]])
