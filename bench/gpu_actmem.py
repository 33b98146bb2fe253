"""gpu-check's `actmem` piece: the planner's price of a trainer rank's activation memory (`rlctl.profiler.actmem`)
against what the torch trainer's GRPO step takes on the device, cut by cut.

On CUDA, for each cut of `CUDA_CUTS` (rows × row length: 2k, 8k and 16k tokens; 8k again with
`trainer.activation_checkpointing`), the learner the trainer agent runs (`make_learner`'s `StreamingLearner`, its
`policy_loss`) takes one optimizer step on one cut, as on a GPU site (fp32 weights, bf16 autocast), and

    measured   torch.cuda.max_memory_allocated() over the step − the memory allocated before it (weights, AdamW
               state, and the fp32 gradients, held before it as from a step's second cut on)
    priced     actmem.activation_bytes for the cut's tokens and rows (with bf16 weight copies, unsharded)

A measured cut more than 10 % over its price fails the check (`failures`: a planner must be able to trust the price as
an upper bound); one priced over 1.5 × what it took is reported (`loose`), not failed. Beside them the whole rank:
its peak allocation against `costs.rank_bytes` (weights, gradients, AdamW state, the rank's working bytes and the
activations). A cut priced past 90 % of the device's free memory is skipped, and says so; one the device runs out of
memory on (priced to fit) fails.

On a CPU (the reduced form CI runs; no allocator peak to read) the same learner's step on the tiny model under bf16
autocast counts the bytes its forward keeps for the backward (`rlctl.profiler.saved.count_saved`: each storage once,
parameters and buffers left out) against `actmem.saved_bytes`, the term of the price that grows with the cut, by the
same rule.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import torch

from rlctl.models.hfdir import check_hf_dir

CUDA_CUTS = ((2, 1024, False), (8, 1024, False), (16, 1024, False), (8, 1024, True))  # rows, row tokens, checkpointed
CPU_CUTS = ((2, 24, False), (4, 24, False), (4, 24, True))
OVER = 1.10  # measured past priced × this: the check fails
LOOSE = 1.5  # priced past measured × this: reported
FIT = 0.9  # a cut priced past this share of the device's free memory is skipped


def actmem_check(model_dir: Path, device: str, *, cuts_of: tuple[tuple[int, int, bool], ...] = ()) -> dict[str, Any]:
    """The piece's result: `cuts` (by "ROWSxLEN" and "+ckpt"), `failures` and `loose` (lines, empty when none);
    `cuts_of` (rows, row tokens, checkpointed), in the order run: the device's `CUDA_CUTS` or `CPU_CUTS` by default."""
    cuda = device == "cuda"
    if cuda:  # what earlier pieces left cached goes back to the device
        gc.collect()
        torch.cuda.empty_cache()
    cuts: dict[str, dict[str, Any]] = {}
    cuts_of = cuts_of or (CUDA_CUTS if cuda else CPU_CUTS)
    for checkpointing in (False, True):
        plan = [(r, n) for r, n, c in cuts_of if c == checkpointing]
        if not plan:
            continue
        backend, learner = _learner(model_dir, device, rows=max(r for r, _ in plan), checkpointing=checkpointing)
        if not cuda:
            backend.model.autocast_dtype = torch.bfloat16  # as the trainer computes on a GPU (the formula's dtypes)
        _step(learner, rows=2, row_tokens=32, vocab=backend.model.config.vocab_size)  # AdamW's state made
        for rows, row_tokens in plan:
            key = f"{rows}x{row_tokens}" + ("+ckpt" if checkpointing else "")
            measure = _peak if cuda else _saved
            cuts[key] = measure(model_dir, backend, learner, rows=rows, row_tokens=row_tokens, ckpt=checkpointing)
            if "out_of_memory" in cuts[key]:  # (the learner's state is the failed step's: larger cuts would fail too)
                break
        del backend, learner
        if cuda:
            torch.cuda.empty_cache()
    return {"what": "step peak − held before" if cuda else "saved for backward", "cuts": cuts, **verdict(cuts)}


def verdict(cuts: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """The cuts measured over their price by more than 10 % (`failures`) and priced over 1.5 × what they took
    (`loose`), one line each."""
    failures, loose = [], []
    for key, c in cuts.items():
        if "out_of_memory" in c:
            failures.append(f"cut {key}: out of memory, the rank priced {c['rank_priced_bytes'] / 1e9:.3f} GB")
        if "measured_bytes" not in c:
            continue
        gb = f"measured {c['measured_bytes'] / 1e9:.3f} GB, priced {c['priced_bytes'] / 1e9:.3f} GB"
        if c["measured_bytes"] > OVER * c["priced_bytes"]:
            failures.append(f"cut {key}: {gb} (measured/priced {c['ratio']}, over {OVER})")
        elif c["priced_bytes"] > LOOSE * c["measured_bytes"]:
            loose.append(f"cut {key}: {gb} (priced/measured {c['priced_bytes'] / c['measured_bytes']:.2f})")
    return {"failures": failures, "loose": loose}


def _learner(model_dir: Path, device: str, *, rows: int, checkpointing: bool) -> tuple[Any, Any]:
    """The torch backend and the trainer's GRPO learner, a cut holding up to `rows` rows (no token budget)."""
    from rlctl.config.algorithm import GrpoAlgorithm
    from rlctl.config.pipeline import Batch
    from rlctl.devices import compute_for
    from rlctl.rl.learner import make_learner
    from rlctl.trainers.base import load_backend

    backend = load_backend("torch", model_dir, compute=compute_for(device), activation_checkpointing=checkpointing)
    batch = Batch(samples_per_prompt=2, train_micro_batch_samples=rows, train_micro_batch_tokens=None)
    return backend, make_learner(backend, GrpoAlgorithm(kind="grpo", lr=1e-5), batch, ref=None)


def _add(learner: Any, *, rows: int, row_tokens: int, vocab: int) -> None:
    """`rows` samples of `row_tokens` tokens (16 of prompt), in groups of 2 with rewards 0 and 1 (each row trained)."""
    from rlctl.rl.samples import Sample

    g = torch.Generator().manual_seed(rows * row_tokens)
    for i in range(rows):
        prompt = torch.randint(3, vocab, (16,), generator=g).tolist()
        output = torch.randint(3, vocab, (row_tokens - 16,), generator=g).tolist()
        learner.add(Sample(f"p{i // 2}", prompt, output, [-3.0] * len(output), float(i % 2), version=0))


def _step(learner: Any, *, rows: int, row_tokens: int, vocab: int) -> None:
    _add(learner, rows=rows, row_tokens=row_tokens, vocab=vocab)
    stats = learner.step()
    assert stats["samples"] == rows and stats["tokens"] == rows * (row_tokens - 16), stats


def _priced(model_dir: Path, *, rows: int, row_tokens: int, ckpt: bool) -> tuple[Any, float]:
    from rlctl.profiler.actmem import Activations

    arch = check_hf_dir(model_dir).arch
    acts = Activations(arch, rows=rows, seq_tokens=row_tokens, checkpointing=ckpt)
    assert acts.rank_tokens == rows * row_tokens
    return arch, acts.rank_bytes()


def _peak(model_dir: Path, backend: Any, learner: Any, *, rows: int, row_tokens: int, ckpt: bool) -> dict[str, Any]:
    """One step on a cut of `rows` rows: the peak allocation over it less what was allocated before."""
    from rlctl.hardware import CATALOG
    from rlctl.planner.costs import rank_bytes
    from rlctl.profiler.analytical import training_entry

    arch, priced = _priced(model_dir, rows=rows, row_tokens=row_tokens, ckpt=ckpt)
    entry = training_entry(arch, CATALOG["H100"], tp=1, pp=1, algorithm="grpo")  # (its memory terms: any GPU's)
    rank_priced = rank_bytes(entry, shards=1, activation_bytes=priced)
    # what the step may take: the device's free memory and what this process's allocator holds unused (earlier
    # pieces may leave some allocated: it is not the step's)
    room = torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    out: dict[str, Any] = {"tokens": rows * row_tokens, "priced_bytes": round(priced)}
    if priced > FIT * room:
        out["skipped"] = f"priced {priced / 1e9:.3f} GB, over {FIT} of the {room / 1e9:.3f} GB free"
        return out
    vocab = backend.model.config.vocab_size
    _add(learner, rows=rows, row_tokens=row_tokens, vocab=vocab)
    for p in backend.model.parameters():  # held as from a step's second cut on (rank_bytes prices them held)
        p.grad = torch.zeros_like(p)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    try:
        learner.step()
    except torch.cuda.OutOfMemoryError as e:  # the device could not hold what the rank was priced to fit in
        return out | {"out_of_memory": str(e).splitlines()[0][:300], "rank_priced_bytes": round(rank_priced)}
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    measured = peak - before
    return out | {
        "measured_bytes": measured,
        "ratio": round(measured / priced, 3),
        "held_before_bytes": before,
        "rank_peak_bytes": peak,
        "rank_priced_bytes": round(rank_priced),
        "rank_ratio": round(peak / rank_priced, 3),
    }


def _saved(model_dir: Path, backend: Any, learner: Any, *, rows: int, row_tokens: int, ckpt: bool) -> dict[str, Any]:
    """One step on a cut of `rows` rows: the distinct storages its forward saves for backward (not the parameters'
    or buffers'), against `saved_bytes`."""
    from rlctl.profiler.actmem import saved_bytes
    from rlctl.profiler.saved import count_saved

    arch = check_hf_dir(model_dir).arch
    priced = saved_bytes(arch, tokens=rows * row_tokens, seq_tokens=row_tokens, checkpointing=ckpt)
    _add(learner, rows=rows, row_tokens=row_tokens, vocab=backend.model.config.vocab_size)
    with count_saved(backend.model) as saved:
        learner.step()
    measured = saved.nbytes
    return {
        "tokens": rows * row_tokens,
        "priced_bytes": round(priced),
        "measured_bytes": measured,
        "ratio": round(measured / priced, 3),
    }
