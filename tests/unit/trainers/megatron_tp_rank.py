"""One rank of the model-parallel tests (test_megatron_tp.py, test_megatron_pp.py), as its own process:

    python tests/unit/trainers/megatron_tp_rank.py RANK WORLD TP PP RENDEZVOUS OUT.json CHECKPOINT…

Forms a gloo group of WORLD = TP × PP ranks and megatron's parallel state, loads its shard of each checkpoint
(its tp part of its pipeline stage), and writes what it measured against the `torch` backend (TinyGPT on the
whole checkpoint) to OUT.json, one entry per checkpoint, and the logits it returned to OUT.pt
({checkpoint: {"BxT": logits}}, for each batch shape of SHAPES). The gradients are taken on the last shape; the
tags of the point-to-point sends its forward and backward made (the pipeline's chunk indices, in order) are recorded.
The model's own calls (`weights()`, forwards, backward) run with the meta device as torch's default (`elsewhere`):
a buffer the stages exchange or a sum they reduce made without the stage's device fails there, as a host tensor
would among a GPU stage's (NCCL).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tests.unit.rank_end import end_rank

# at pp 2 (2 chunks per stage): 2 rows in 2 chunks, 1 row in 1 (the stage-by-stage schedule), 5 rows in 4
# chunks of 2, 1, 1, 1 rows
SHAPES = [(2, 24), (1, 24), (5, 24)]
PAD = 8  # a token of the last shape's input (twice): a checkpoint whose pad_token_id it is has that row's gradient
# checked as well (none from those positions, as TinyGPT's and transformers' padding_idx)


def elsewhere() -> torch.device:
    """The meta device as torch's default within: a tensor made without a device is made where the model is not
    (on a GPU rank: the host, where the default device is), and cannot be sent, received or added to the model's."""
    return torch.device("meta")


@contextlib.contextmanager
def sends_tagged(tags: list[int]) -> Iterator[None]:
    """Record the tag of every `dist.isend` made inside (the pipeline's sends: one per chunk)."""
    isend = dist.isend

    def spy(tensor: torch.Tensor, dst: int, *args: Any, tag: int = 0, **kw: Any) -> Any:
        tags.append(tag)
        return isend(tensor, dst, *args, tag=tag, **kw)

    dist.isend = spy
    try:
        yield
    finally:
        dist.isend = isend


def main(rank: int, world: int, tp: int, pp: int, rendezvous: Path, out: Path, checkpoints: list[Path]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    logits: dict[str, dict[str, torch.Tensor]] = {}
    out.write_text(json.dumps({str(c): measure(c, tp=tp, pp=pp, logits=logits) for c in checkpoints}))
    torch.save(logits, out.with_suffix(".pt"))
    dist.destroy_process_group()


def measure(checkpoint: Path, *, tp: int, pp: int, logits: dict[str, dict[str, torch.Tensor]]) -> dict[str, object]:
    from rlctl.models.tensors import ModelTensors
    from rlctl.models.tinygpt import TinyGPT
    from rlctl.models.weightfiles import load_state_dict
    from rlctl.rl.samples import token_logprobs
    from rlctl.trainers.megatron import names
    from rlctl.trainers.megatron.backend import MegatronBackend
    from rlctl.trainers.megatron.model import import_megatron

    mg = MegatronBackend.load(checkpoint, tp=tp, pp=pp)
    with elsewhere():
        weights = mg.weights()  # all-gathered over the tp and pp groups, before any step
    ref = TinyGPT.from_pretrained(checkpoint)
    mine, logits_diff = logits.setdefault(str(checkpoint), {}), 0.0
    for shape in SHAPES:
        x = torch.randint(0, ref.config.vocab_size, shape, generator=torch.Generator().manual_seed(1))
        with torch.no_grad(), elsewhere():
            mine["x".join(map(str, shape))] = mg.model(x)
            logits_diff = max(logits_diff, float((mine["x".join(map(str, shape))] - ref(x)).abs().max()))
    sent: dict[str, list[int]] = {"forward": [], "backward": []}
    with sends_tagged(sent["forward"]), elsewhere():
        logp = token_logprobs(mg.model, x)
    with sends_tagged(sent["backward"]), elsewhere():
        logp.sum().backward()
    token_logprobs(ref, x).sum().backward()
    # gradients in HF layout: each rank's shard of its stage through the table, gathered like the weights; the
    # last stage's copy of a tied embedding adds its gradient to the first stage's
    grad = {k: p.grad for k, p in mg.model.gpt.named_parameters() if p.grad is not None}
    shard = names.to_hf(grad, ref.config, tp=tp, stage=mg.stage)
    if ref.config.tie_word_embeddings and pp > 1 and mg.stage.last:
        shard["model.embed_tokens.weight"] = grad["output_layer.weight"]
    ps = import_megatron().parallel_state
    everyone: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (mg.stage.index, ps.get_tensor_model_parallel_rank(), shard))
    grads: dict[str, torch.Tensor] = {}
    for s in range(pp):
        by_tp = sorted((r, sh) for st, r, sh in everyone if st == s)  # type: ignore[misc]
        for k, v in names.gather_hf([sh for _, sh in by_tp]).items():
            if k.endswith(("q_norm.weight", "k_norm.weight")):  # Qwen3's: each tp rank's its own heads' part
                v = sum((sh[k] for _, sh in by_tp), torch.zeros_like(v))
            grads[k] = grads[k] + v if k in grads else v
    grad_rel = max(float((grads[n] - p.grad).abs().max() / p.grad.abs().max()) for n, p in ref.named_parameters())
    checkpoint_sd = ModelTensors(load_state_dict(checkpoint), ref.config)  # (a Phi3's fused tensors: the model's names)
    return {
        "shard_numel": sum(p.numel() for p in mg.model.parameters()),
        "full_numel": sum(t.numel() for t in checkpoint_sd.values()),
        "logits_max_abs_diff": logits_diff,
        "grad_max_rel_diff": grad_rel,
        "pad_positions": int((x == ref.config.pad_token_id).sum()) if ref.config.pad_token_id is not None else 0,
        "weights_names_are_the_engine_names": list(weights) == list(ref.state_dict()),
        "send_tags": sent,
        "weights_bit_exact": all(torch.equal(weights[k], v) for k, v in checkpoint_sd.items()),
    }


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]), int(a[1]), int(a[2]), int(a[3]), Path(a[4]), Path(a[5]), [Path(c) for c in a[6:]])
    end_rank()  # not through finalization (tests/unit/rank_end.py)
