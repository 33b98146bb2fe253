"""Print PTL(BS) of the vLLM and the embedded engine on one checkpoint, vLLM's start and weight-push time.

    .venv-vllm/bin/python -m tests.vllm.compare_ptl [--batch-sizes 1 4 16 64] [--context 64] [--hidden 128]

The checkpoint is a TinyGPT (HF Llama format, random weights, head size 32: vLLM's CPU attention
needs 32, 64, 80, …; the built-in tiny-demo has 24) written to a temp dir. Both engines run on one
thread; times are CPU seconds of this thread (`time.thread_time`) unless `--wall`, so other work on
a shared machine does not inflate them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def write_model(directory: Path, *, hidden: int, layers: int, vocab: int, positions: int) -> int:
    """A random TinyGPT checkpoint (head size 32); its parameter count."""
    from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig, param_count

    config = TinyGPTConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3 // 32 * 32,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 32,
        num_key_value_heads=hidden // 32,
        max_position_embeddings=positions,
        rope_fp64_angles=False,
    )
    model = TinyGPT(config)
    model.save_pretrained(directory)
    return param_count(model)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tests.vllm.compare_ptl")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--pushes", type=int, default=3)
    ap.add_argument("--wall", action="store_true", help="wall-clock seconds instead of this thread's CPU seconds")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rlctl-ptl-") as tmp:
        report(args, Path(tmp))


def report(args: argparse.Namespace, tmp: Path) -> None:
    """Write the checkpoint under `tmp`, measure both engines on it, print the comparison."""
    os.environ.setdefault("VLLM_CACHE_ROOT", str(tmp / "cache"))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    import torch

    from rlctl.engines.embedded import EmbeddedEngine
    from rlctl.models.tinygpt import TinyGPT
    from rlctl.profiler.measure import measure_generation, start_vllm_for_profile, vllm_engine_factory

    torch.set_num_threads(1)
    clock = time.perf_counter if args.wall else time.thread_time
    model_dir = tmp / "model"
    n_params = write_model(
        model_dir, hidden=args.hidden, layers=args.layers, vocab=args.vocab, positions=args.context + 64
    )
    contexts, batch_sizes = [args.context], args.batch_sizes
    net = TinyGPT.from_pretrained(model_dir)
    embedded = measure_generation(
        lambda bs: EmbeddedEngine(net, max_batch_size=bs, temperature=1.0, seed=0),
        contexts=contexts,
        batch_sizes=batch_sizes,
        kv_capacity_tokens=1,
        clock=clock,
    )
    t0 = time.perf_counter()
    engine = start_vllm_for_profile(model_dir, contexts=contexts, batch_sizes=batch_sizes)
    start_s = time.perf_counter() - t0
    vllm = measure_generation(
        vllm_engine_factory(engine), contexts=contexts, batch_sizes=batch_sizes, kv_capacity_tokens=1, clock=clock
    )
    engine.abort_all()
    sd = net.state_dict()
    for version in range(1, args.pushes + 1):
        engine.load_weights(sd, version)

    unit = "wall" if args.wall else "CPU"
    print(f"checkpoint: TinyGPT hidden {args.hidden}, {args.layers} layers, {n_params / 1e6:.2f} M params, fp32")
    print(f"vLLM start: LLM() {engine.start_s:.1f} s wall; with the profile's warm-up batch {start_s:.1f} s")
    print(f"weight push (reload_weights + prefix-cache reset): median {statistics.median(engine.push_s):.3f} s")
    print(f"PTL(BS) at context {args.context}, ms per decode step ({unit} time of this thread):")
    print(f"{'BS':>6} {'embedded':>10} {'vLLM':>10} {'vLLM/emb':>9}")
    for i, bs in enumerate(args.batch_sizes):
        emb_s, vllm_s = embedded.ptl_s[0][i], vllm.ptl_s[0][i]
        print(f"{bs:>6} {emb_s * 1e3:>10.2f} {vllm_s * 1e3:>10.2f} {vllm_s / emb_s:>9.2f}")
    print(
        f"prefill: embedded {embedded.prefill_s_per_token * 1e6:.1f} µs/token, "
        f"vLLM {vllm.prefill_s_per_token * 1e6:.1f} µs/token"
    )


if __name__ == "__main__":
    main()
