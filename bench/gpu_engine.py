"""The embedded engine's pieces of the GPU check (`bench.gpu_check`): its logits against the CPU, decode tokens/s
by batch (eager, compiled, projections separate), continuous batching with a long tail, its synchronising
host↔device operations, and transformers' `generate` on the same checkpoint for scale."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, TypedDict

import torch

from rlctl.devices import compute_for
from rlctl.models.tinygpt import TinyGPT

# decode throughput, the engine's and `generate`'s alike: the fastest of this many runs after a warm-up (a run's
# host, shared or not, moves `generate` most: it launches every kernel from Python)
TIMED_RUNS = 2


class Size(TypedDict):
    """A run's scale (`bench.gpu_check`'s FULL or QUICK)."""

    shape: str  # the checkpoint's: jobs/hf-demo/build.py --shape
    batches: tuple[int, ...]  # decode batches measured
    prompt: int  # tokens a prompt
    new_tokens: int  # tokens generated a sequence
    train_samples: int  # samples a training step


def random_prompts(n: int, length: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(n)
    return torch.randint(10, min(vocab, 40), (n, length), generator=g).tolist()


def engine_vs_cpu(model_dir: Path, device: str) -> dict[str, str | float]:
    """Logits of 4 sequences of 48 tokens: on the device in the checkpoint's dtype vs the CPU in fp32."""
    here = TinyGPT.from_pretrained(model_dir, dtype=None, device=device)
    ref = TinyGPT.from_pretrained(model_dir)
    x = torch.tensor(random_prompts(4, 48, ref.config.vocab_size))
    with torch.no_grad():
        a, b = here(x.to(device)).float().cpu(), ref(x)
    return {
        "dtype": str(here.lm_head.weight.dtype).removeprefix("torch."),
        "max_abs_diff": round(float((a - b).abs().max()), 5),
        "max_abs_logit": round(float(b.abs().max()), 3),
        "argmax_agreement": round(float((a.argmax(-1) == b.argmax(-1)).float().mean()), 4),
    }


def engine_model(model_dir: Path, device: str) -> TinyGPT:
    """The checkpoint as a rollout agent's embedded engine loads it on `device` ("cuda" or "cpu"): the device policy's
    dtype (rlctl.devices: the checkpoint's own on a GPU, fp32 on a CPU)."""
    compute = compute_for(device)
    return TinyGPT.from_pretrained(model_dir, dtype=compute.engine_dtype, device=compute.device)


def engine_tok_s(
    model_dir: Path,
    device: str,
    size: Size,
    *,
    batches: tuple[int, ...] = (),
    compile_step: bool = False,
    separate: bool = False,
) -> dict[str, dict[str, float]]:
    """Decode tokens/s at each batch (default: the size's): prompts of `prompt` tokens, `new_tokens` each, EOS
    ignored; a first run warms up (captures the CUDA graphs, compiles a `compile_step`: its seconds are
    `first_run_s`), the fastest of the `TIMED_RUNS` after it counts (as for `generate`). `separate`: with the
    model's projections unfused (what fusing gains)."""
    from rlctl.engines.base import GenRequest
    from rlctl.engines.embedded import EmbeddedEngine

    model = engine_model(model_dir, device)
    out = {}
    for b in batches or size["batches"]:
        prompts = random_prompts(b, size["prompt"], model.config.vocab_size)
        engine = EmbeddedEngine(model, max_batch_size=b, temperature=1.0, compile_step=compile_step)
        if separate:
            model.unfuse_projections()
        runs = []
        for attempt in range(TIMED_RUNS + 1):
            engine.add(
                [GenRequest(f"{attempt}-{i}", p, size["new_tokens"], ignore_eos=True) for i, p in enumerate(prompts)]
            )
            sync(device)
            t0 = time.perf_counter()
            engine.run_until_done()
            sync(device)
            runs.append(time.perf_counter() - t0)
        first_run_s, seconds = runs[0], min(runs[1:])
        tokens = b * size["new_tokens"]
        out[str(b)] = {
            "tok_s": round(tokens / seconds, 1),
            "step_ms": round(1e3 * seconds / size["new_tokens"], 3),
            "first_run_s": round(first_run_s, 1),
        }
    return out


def step_ops(model_dir: Path, device: str, size: Size, engine: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The operators one eager decode step of the model dispatches at the first batch (`bench.opcount`: views left
    out), with its projections fused (the engine's model) and separate: on a GPU each is a kernel, and a small
    model's step is bound by their count (docs/gpu.md); and the engine's tok/s with them separate, against
    `engine` (this run's, fused)."""
    from bench.opcount import ops_of

    batch = int(size["batches"][0])
    separate_tok_s = engine_tok_s(model_dir, device, size, batches=(batch,), separate=True)[str(batch)]["tok_s"]
    model = engine_model(model_dir, device)
    layers = model.config.num_hidden_layers
    prompts = torch.tensor(random_prompts(batch, 8, model.config.vocab_size), device=device)
    out: dict[str, Any] = {}
    for how in ("separate", "fused"):
        if how == "fused":
            model.fuse_projections()
        cache = model.new_cache(batch, 128)
        rows = torch.arange(batch, device=device)
        model.prefill(cache, rows, prompts[:, :-1], torch.full((batch,), 7, device=device))
        ops = ops_of(lambda: model.decode(cache, prompts[:, -1], rows=batch, width=128))  # noqa: B023 - called here
        out[how] = {"ops": sum(ops.values()), "per_layer": round(sum(ops.values()) / layers, 1)}
        if how == "fused":
            out["commonest"] = dict(ops.most_common(8))
    out["separate"]["tok_s"] = separate_tok_s
    if str(batch) in engine:
        out["fused_over_separate_tok_s"] = round(engine[str(batch)]["tok_s"] / separate_tok_s, 3)
    return out


def engine_mixed(model_dir: Path, device: str, size: Size) -> dict[str, Any]:
    """Continuous batching as a rollout runs it: 4 × the first batch of requests through an engine of that many
    rows, output lengths log-uniform from 1/8 to 2 × the size's `new_tokens` (most short, a long tail), so rows end
    at different steps and waiting requests are admitted (prefilled: on CUDA graphs of bucketed shapes) between
    decode steps. Reported: tok/s, steps, prefill calls and their share of the run (each timed with a device sync
    around it), from the second of two runs (the first captures the graphs)."""
    from rlctl.engines.base import GenRequest
    from rlctl.engines.embedded import EmbeddedEngine

    b = int(size["batches"][0])
    model = engine_model(model_dir, device)
    engine = EmbeddedEngine(model, max_batch_size=b, temperature=1.0)
    prompts = random_prompts(4 * b, size["prompt"], model.config.vocab_size)
    most = model.config.max_position_embeddings - int(size["prompt"])
    u = torch.rand(len(prompts), generator=torch.Generator().manual_seed(0))
    lengths = [min(most, max(1, round(size["new_tokens"] * 2.0 ** (4 * x - 3)))) for x in u.tolist()]
    prefill, spent = engine._prefill, {"s": 0.0}

    def timed_prefill(*args: Any, **kw: Any) -> None:  # the engine's call: the model's may run inside a capture
        sync(device)
        t = time.perf_counter()
        prefill(*args, **kw)
        sync(device)
        spent["s"] += time.perf_counter() - t

    engine._prefill = timed_prefill  # type: ignore[method-assign]
    seconds, prefills = 0.0, 0
    for attempt in range(2):
        spent["s"], before = 0.0, engine.prefills
        engine.add(
            [
                GenRequest(f"{attempt}-{i}", p, n, ignore_eos=True)
                for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
            ]
        )
        steps = 0
        sync(device)
        t0 = time.perf_counter()
        while engine.has_work():
            engine.step()
            steps += 1
        sync(device)
        seconds, prefills = time.perf_counter() - t0, engine.prefills - before
    tokens = sum(lengths)
    return {
        "requests": len(prompts),
        "rows": b,
        "tok_s": round(tokens / seconds, 1),
        "steps": steps,
        "prefills": prefills,
        "prefill_share": round(spent["s"] / seconds, 3),
    }


def engine_syncs(model_dir: Path, device: str, size: Size) -> dict[str, Any]:
    """The engine's synchronising host↔device operations a decode step and an admission (`bench.gpu_syncs`), through
    waves of requests at the first batch: on CUDA one a step (its read) and none an admission pass."""
    from bench.gpu_syncs import measure

    model = engine_model(model_dir, device)
    return measure(model, batch=int(size["batches"][0]), prompt=int(size["prompt"]), new_tokens=int(size["new_tokens"]))


def engine_compiled(model_dir: Path, device: str, size: Size, eager: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The engine with its decode step through torch.compile at the first batch: tok/s, step ms, the compiling
    first run's seconds, and `over_eager_step` against `eager` (`engine` of this run)."""
    b = str(size["batches"][0])
    r = engine_tok_s(model_dir, device, size, batches=(int(b),), compile_step=True)[b]
    out: dict[str, Any] = {"tok_s": {b: r["tok_s"]}, "step_ms": {b: r["step_ms"]}, "first_run_s": r["first_run_s"]}
    if b in eager:
        out["over_eager_step"] = round(r["tok_s"] / eager[b]["tok_s"], 3)
    return out


def hf_generate_tok_s(model_dir: Path, device: str, size: Size) -> dict[str, float | None]:
    """transformers' `generate` (sampling, the checkpoint's dtype on a GPU) at the same batches; None per batch
    where transformers is missing."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        return {str(b): None for b in size["batches"]}
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    out: dict[str, float | None] = {}
    n = size["new_tokens"]
    for b in size["batches"]:
        x = torch.tensor(random_prompts(b, size["prompt"], model.config.vocab_size), device=device)
        runs = []
        for _ in range(TIMED_RUNS + 1):  # a warm-up, then the fastest of the timed runs, as for the engine
            sync(device)
            t0 = time.perf_counter()
            with torch.no_grad():
                model.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=True, pad_token_id=0)
            sync(device)
            runs.append(time.perf_counter() - t0)
        out[str(b)] = round(b * n / min(runs[1:]), 1)
    return out


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
