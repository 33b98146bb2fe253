"""gpu-check's `megatron` piece, in a process of its own: the `megatron` trainer backend on a device against the
`torch` backend on the same device, from one checkpoint and one batch of samples.

    python -m bench.gpu_megatron MODEL_DIR cuda|cpu   →   one JSON object on stdout

- `min_update_cosine`: one GRPO step of each (the learner, AdamW, bf16 autocast on a GPU, fp32 on a CPU): the worst
  cosine between the two updates of a tensor (but k_proj's bias: see below);
- `train_tok_s` of each (two timed steps after that one, micro-batches of 16 samples) and `megatron_over_torch`.

Its own process because the megatron backend needs a torch.distributed group (one rank here: NCCL on a GPU, gloo
on a CPU, as the trainer agent forms it) and megatron's parallel state, which no other piece of the check may see.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench.gpu_check import _samples, train_steps
from rlctl.models.tinygpt import TinyGPT


def compare(model_dir: Path, device: str, *, prompts: int = 4, micro: int = 16) -> dict[str, Any]:
    from rlctl.config.algorithm import GrpoAlgorithm
    from rlctl.config.pipeline import Batch
    from rlctl.devices import compute_for
    from rlctl.rl.learner import make_learner
    from rlctl.trainers.base import load_backend

    compute = compute_for(device)
    start_model = TinyGPT.from_pretrained(model_dir)
    start, vocab = start_model.state_dict(), start_model.config.vocab_size
    moved: dict[str, dict[str, torch.Tensor]] = {}
    tok_s: dict[str, float] = {}
    for name in ("torch", "megatron"):
        backend = load_backend(name, model_dir, compute=compute)
        batch = Batch(samples_per_prompt=4, train_micro_batch_samples=micro, train_micro_batch_tokens=None)
        learner = make_learner(backend, GrpoAlgorithm(kind="grpo", lr=1e-5), batch, ref=None)
        samples = _samples(prompts, vocab)

        def keep(name: str = name, backend: Any = backend) -> None:  # the weights after one step
            moved[name] = {k: v.float().cpu() for k, v in backend.weights().items()}

        tok_s[name] = train_steps(learner, samples, device, after_warmup=keep)
        del backend, learner
    cos = [
        float(
            torch.nn.functional.cosine_similarity(
                (moved["megatron"][k] - w).flatten(), (moved["torch"][k] - w).flatten(), 0
            )
        )
        for k, w in start.items()
        # not k_proj.bias: its gradient is 0 in exact arithmetic (softmax ignores a shift every key shares), so
        # AdamW's first step scales rounding noise up on either backend (tests/unit/trainers/test_megatron_backend.py)
        if k in moved["torch"] and not torch.equal(moved["torch"][k], w) and not k.endswith("k_proj.bias")
    ]
    return {
        "min_update_cosine": round(min(cos), 4),
        "tensors": len(cos),
        "train_tok_s": tok_s,
        "megatron_over_torch": round(tok_s["megatron"] / tok_s["torch"], 3),
    }


def main(argv: list[str]) -> None:
    model_dir, device = Path(argv[0]), argv[1]
    with tempfile.TemporaryDirectory(prefix="rlctl-gpu-megatron-") as tmp:
        dist.init_process_group(
            "nccl" if device == "cuda" else "gloo", init_method=f"file://{tmp}/rendezvous", rank=0, world_size=1
        )
        try:
            # flushed: a pipe holds it in Python's buffer, and a teardown ended by a signal (NCCL's hang, run_capped's
            # SIGTERM) would lose it unwritten
            print(json.dumps(compare(model_dir, device)), flush=True)
        finally:
            dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
