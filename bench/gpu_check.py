"""The GPU check: what a lent GPU machine measures in one run (`make gpu-check`), as one JSON object.

    python -m bench gpu-check --json            on a CUDA machine: the figures below, ≈ 0.5B Qwen2 shape, bf16
    python -m bench gpu-check --quick --json    anywhere (CI: the CPU): the same code paths on a tiny model

    engine_vs_cpu        the embedded engine's logits on the device in the checkpoint's dtype vs the CPU in fp32
    grpo_step_vs_cpu     one GRPO step of the torch trainer on the device (bf16 autocast) vs the CPU (fp32): the
                         cosine of the two weight updates, worst tensor
    engine_tok_s         decode tokens/s of the embedded engine by batch ({"64": …, "256": …}; CUDA graphs on a GPU)
    hf_generate_tok_s    transformers' `generate` on the same checkpoint, device and batches (same run)
    engine_over_hf       the ratio, by batch (goal ≥ 5 at batch 64 on an H100 or H200)
    engine_step_ops      the operators (≈ kernels) one eager decode step dispatches at the first batch: with q/k/v and
                         gate/up fused (what the engine runs) and separate, in all and per layer, and the commonest;
                         the engine's tok/s with them separate, and fused ÷ separate
    engine_mixed         continuous batching with long-tailed output lengths (4 × the first batch of requests, that
                         many rows): tok/s, steps, prefill calls and the share of the run spent in them
    engine_syncs         host↔device operations that make the host wait (CUDA's sync debug mode), by decode step and by
                         admission, through waves of admissions, finishes and compactions at the first batch: one a step
                         (its read), none an admission; anything else is listed in `failed` and the check exits 1
    engine_compiled      the decode step through torch.compile, in the same graphs, at the first batch: tok/s,
                         step ms, the compiling first run's seconds, and ÷ `engine_tok_s` of this run (after gpu_tests)
    bandwidth_floor      per batch: the decode step's time if it only read the weights once at the GPU's memory
                         bandwidth (catalog figure), and that floor ÷ the measured step
    sampler_share        on the CPU, a decode step of the Qwen2-0.5B shape (vocabulary 151,936) at batch 64: the share
                         of the step the sampler takes (goal ≤ 0.25; its hashing is per row, not per token)
    train_tok_s, mfu     GRPO training tokens/s (forward, backward, AdamW) and 6·params·tokens/s ÷ peak bf16 FLOPS
    actmem               the planner's activation price (rlctl.profiler.actmem) against the torch trainer's GRPO step
                         on cuts of 2k, 8k, 16k tokens (8k again checkpointed): the step's peak allocation less what was
                         held before it; a cut more than 10 % over its price is listed in `failed` (on the CPU: the
                         bytes saved for backward against `saved_bytes`; `bench/gpu_actmem.py`)
    delta_encode_gb_s    the delta codec on versions held in device memory (bf16, 2 % of elements changed), from
                         the device buffers to the payload on the host, per rank (goal ≥ 5 GB/s); its ratio
    host_bytes_per_model_byte  the most a trainer rank's weight publisher holds in host memory while it publishes
                         deltas encoded on the device, ÷ the model in its dtype (goal ≤ 1.25); at the first
                         (full) version too; and the encoder's device memory
    launch               `rlctl launch` of a job on the local site whose trainer and two rollout units share the
                         device: its state and ledger (0 lost, 0 duplicated)
    megatron             the `megatron` trainer backend (tp 1 × pp 1) against the `torch` one on the same device:
                         the worst update cosine of one GRPO step, train tok/s of each (`bench/gpu_megatron.py`)
    gpu_tests            `pytest tests/gpu` (skipped without CUDA): passed, failed, skipped
    transport            `bench rpc`'s authentication and encryption costs on this machine's cores (`auth_overhead`:
                         goal ≤ 0.10 at 256 MiB, which 2 shared cores cannot show), CPU count beside them; last

With --quick (and on a CPU) the model is the tiny hf-demo shape, batches 4 and 8, and the launched job a short
one on a CPU site: the same functions run, so the script cannot rot between GPU machines.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from bench.gpu_actmem import CPU_CUTS, actmem_check
from bench.gpu_engine import (
    Size,
    engine_compiled,
    engine_mixed,
    engine_syncs,
    engine_tok_s,
    engine_vs_cpu,
    hf_generate_tok_s,
    random_prompts,
    step_ops,
    sync,
)
from bench.gpu_pieces import Pieces, last_json, ran, run_capped
from rlctl.devices import compute_for, torch_build
from rlctl.hardware import CATALOG
from rlctl.models.hfdir import check_hf_dir
from rlctl.models.tinygpt import TinyGPT

REPO = Path(__file__).resolve().parents[1]
FULL: Size = {"shape": "qwen2-0.5b", "batches": (64, 256), "prompt": 32, "new_tokens": 128, "train_samples": 64}
QUICK: Size = {"shape": "tiny", "batches": (4, 8), "prompt": 8, "new_tokens": 16, "train_samples": 16}


def run(*, quick: bool) -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    size = QUICK if quick or not cuda else FULL
    if not cuda:  # the reduced form on a shared CPU machine: one thread, so that contention does not rule the figures
        torch.set_num_threads(1)
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "commit": os.environ.get("RLCTL_COMMIT") or _git("rev-parse", "--short", "HEAD"),  # a copy may lack .git
        "date": datetime.date.today().isoformat(),
        "torch": torch_build(),
        "python": sys.version.split()[0],
        "shape": size["shape"],
    }
    only = {k for k in os.environ.get(ENV_ONLY, "").split(",") if k}
    budget_s = float(os.environ.get(ENV_BUDGET, "0")) or None
    piece = Pieces(out, path=os.environ.get(ENV_OUT), budget_s=budget_s, only=only, spent_s=_spent_s())
    capped = piece.timeout_s  # a subprocess's own timeout, or what is left of the budget when that is less
    with tempfile.TemporaryDirectory(prefix="rlctl-gpu-check-") as tmp:
        root = Path(tmp)
        model_dir = root / "model"
        shape = str(size["shape"])
        if piece("build_s", lambda: _build(root, shape=shape, timeout_s=capped(600)), timed=True, cuda=False) is None:
            piece("gpu_tests", lambda: _gpu_tests(piece.artifacts, timeout_s=capped(300)), cuda=False)
            return piece.done()
        arch = check_hf_dir(model_dir).arch
        out["params"] = int(arch.params)
        # first the pieces with no figures from a GPU yet (docs/gpu.md): a spent budget skips those that have some
        syncs = piece("engine_syncs", lambda: engine_syncs(model_dir, device, size)) or {}
        if syncs.get("failures"):  # what the check proves, not a figure: the run exits 1 (bench/__main__)
            out["failed"] = [f"engine_syncs: {f}" for f in syncs["failures"]]
        piece("engine_mixed", lambda: engine_mixed(model_dir, device, size))
        small = CPU_CUTS if size is QUICK else ()  # (--quick on a GPU: the tiny model holds 256 positions)
        acts = piece("actmem", lambda: actmem_check(model_dir, device, cuts_of=small)) or {}
        if acts.get("failures"):  # a cut that took more than the planner prices: the run exits 1, as engine_syncs'
            out.setdefault("failed", []).extend(f"actmem: {f}" for f in acts["failures"])
        piece("archs_vs_cpu", lambda: _archs_vs_cpu(root, device, limit=capped))
        piece("megatron", lambda: _megatron(model_dir, device, timeout_s=capped(600)), cuda=False)
        piece("gpu_tests", lambda: _gpu_tests(piece.artifacts, timeout_s=capped(300)), cuda=False)
        engine = piece("engine", lambda: engine_tok_s(model_dir, device, size), keep=False) or {}
        out["engine_tok_s"] = {b: r["tok_s"] for b, r in engine.items()}
        # the compiled step (its compile takes a while) at the first batch, against the engine's graphs of the
        # eager step in this run
        piece("engine_compiled", lambda: engine_compiled(model_dir, device, size, engine))
        # then what a GPU has measured before
        piece("engine_vs_cpu", lambda: engine_vs_cpu(model_dir, device))
        hf = piece("hf_generate_tok_s", lambda: hf_generate_tok_s(model_dir, device, size)) or {}
        out["engine_over_hf"] = {b: round(engine[b]["tok_s"] / hf[b], 2) for b in engine if hf.get(b)}
        piece("engine_step_ops", lambda: step_ops(model_dir, device, size, engine))
        if cuda and engine:
            out["bandwidth_floor"] = _floor(arch.weight_bytes, engine)
        piece(
            "train",
            lambda: _train(model_dir, device, samples=int(size["train_samples"]), params=arch.params, cuda=cuda),
            merge=True,
        )
        piece("delta", lambda: _delta(device, nbytes=(1 << 30) if not quick and cuda else (16 << 20)), merge=True)
        piece("publisher", lambda: _publisher_host_bytes(model_dir, device), merge=True)
        small_job = quick or not cuda  # its own timeout: 600 s on a CPU, 300 s on a GPU
        piece(
            "launch",
            lambda: _launch(
                root,
                device=device,
                quick=small_job,
                artifacts=piece.artifacts,
                timeout_s=capped(600 if small_job else 300),
            ),
            cuda=False,
        )
        piece("grpo_step_vs_cpu", lambda: _grpo_vs_cpu(model_dir, device, prompts=2 if cuda else 4))
        piece("sampler_share", _sampler_share, cuda=False)
    piece("transport", lambda: _transport(quick=quick or not cuda), cuda=False)  # CPU only: never in the GPU's way
    if cuda and not quick:  # the pipeline's stages on cores of their own, as on a cluster (on 2 shared cores they
        # contend; issues 24 and 25 measure overlap): CPU benches, after every GPU piece (a budget skips them first)
        piece("pipeline", lambda: _cpu_bench("pipeline", quick=False), cuda=False)
        piece("staleness", lambda: _cpu_bench("staleness", quick=True), cuda=False)
    return piece.done()


ENV_OUT = "RLCTL_GPU_CHECK_OUT"  # a path: the JSON so far is written there after every piece (and logs beside it)
ENV_BUDGET = "RLCTL_GPU_CHECK_BUDGET_S"  # seconds: pieces not started by then are skipped (unset: no limit)
TEST_TIMEOUT_S = 150  # each test of `pytest tests/gpu` (the compiled step's and megatron's take the longest)
ENV_ONLY = "RLCTL_GPU_CHECK_ONLY"  # comma-separated piece keys: only these run (and the checkpoint's build)
ENV_T0 = "RLCTL_GPU_CHECK_T0"  # Unix seconds the budget counts from (`make gpu-check`'s start; unset: the pieces')


def _spent_s() -> float:
    """The seconds since `RLCTL_GPU_CHECK_T0`: the device command's installs and the check's imports, within its
    limit as the pieces are."""
    t0 = os.environ.get(ENV_T0)
    if not t0:
        return 0.0
    try:
        return max(0.0, time.time() - float(t0))
    except ValueError:
        raise ValueError(f"{ENV_T0}={t0!r}: not a Unix time in seconds (`date +%s`)") from None


def summary(r: dict[str, Any]) -> str:
    g = r.get
    lines = [f"device {g('device')} ({g('torch')}), commit {g('commit')}, {g('shape')} ({g('params', 0) / 1e6:.0f}M)"]
    lines.append(f"engine tok/s {g('engine_tok_s')}  HF generate {g('hf_generate_tok_s')}  ratio {g('engine_over_hf')}")
    lines.append(f"train {g('train_tok_s')} tok/s, MFU {g('mfu')}; delta encode {g('delta_encode_gb_s')} GB/s")
    lines.append(f"publisher host bytes / model byte {g('host_bytes_per_model_byte')}")
    lines.append(f"launch: {g('launch')}; tests/gpu: {g('gpu_tests')}")
    es = g("engine_syncs") or {}
    cuts = (g("actmem") or {}).get("cuts", {})
    lines.append(f"activations measured/priced: { {k: c.get('ratio', c.get('skipped')) for k, c in cuts.items()} }")
    lines.append(f"engine syncs: a step {es.get('syncs_per_step')}, an admission {es.get('syncs_per_admission')}")
    if g("failed"):
        lines.append(f"FAILED: {g('failed')}")
    if g("errors"):
        lines.append(f"errors: {g('errors')}")
    return "\n".join(lines)


# ---- the pieces -------------------------------------------------------------------------------------------
def _git(*args: str) -> str:
    try:
        proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
    except OSError:  # no git on the machine
        return "unknown"
    return proc.stdout.strip() or "unknown"


def _build(root: Path, *, shape: str, timeout_s: float = 600) -> None:
    """The hf-demo builder's checkpoint (model/) and dataset (data.jsonl), untrained, in `shape`."""
    argv = [sys.executable, str(REPO / "jobs/hf-demo/build.py"), "--out", str(root), "--sft-steps=0", "--rows=256"]
    proc = run_capped([*argv, f"--shape={shape}"], timeout_s=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"build.py exited {proc.returncode}: {proc.stderr[-400:]}")


def _archs_vs_cpu(root: Path, device: str, *, limit: Callable[[float], float] = lambda s: s) -> dict[str, Any]:
    """`engine_vs_cpu` of the builder's tiny Qwen3 (per-head q/k RMSNorm), Llama 3.1 (llama3 RoPE scaling past a
    32-token context) and Phi3 (its file's fused qkv_proj and gate_up_proj) checkpoints: their architectures' own code
    on the device against the CPU. Each build's timeout is `limit(600)` (`Pieces.timeout_s`)."""
    out = {}
    for shape in ("tiny-qwen3", "tiny-llama3", "tiny-phi3"):
        _build(root / shape, shape=shape, timeout_s=limit(600))
        out[shape] = engine_vs_cpu(root / shape / "model", device)
    return out


def _samples(n_prompts: int, vocab: int) -> list[Any]:
    from rlctl.rl.samples import Sample

    g = torch.Generator().manual_seed(7)
    out = []
    for i in range(n_prompts * 4):
        prompt = torch.randint(10, min(vocab, 40), (16,), generator=g).tolist()
        output = torch.randint(10, min(vocab, 40), (48 + 16 * (i % 4),), generator=g).tolist()
        out.append(Sample(f"p{i // 4}", prompt, output, [-3.0] * len(output), float(i % 3), version=0))
    return out


def _learner(model_dir: Path, device: str, *, micro: int = 16) -> tuple[Any, Any]:
    from rlctl.config.algorithm import GrpoAlgorithm
    from rlctl.config.pipeline import Batch
    from rlctl.rl.learner import make_learner
    from rlctl.trainers.base import load_backend

    backend = load_backend("torch", model_dir, compute=compute_for(device))
    algo = GrpoAlgorithm(kind="grpo", lr=1e-5)
    batch = Batch(samples_per_prompt=4, train_micro_batch_samples=micro, train_micro_batch_tokens=None)
    return backend, make_learner(backend, algo, batch, ref=None)


def _grpo_vs_cpu(model_dir: Path, device: str, *, prompts: int) -> dict[str, float]:
    """One GRPO step from the same checkpoint and samples on the device and on the CPU: the worst cosine between
    the two updates of a tensor (bf16 autocast against fp32)."""
    start = TinyGPT.from_pretrained(model_dir).state_dict()
    moved = {}
    for where in dict.fromkeys([device, "cpu"]):
        backend, learner = _learner(model_dir, where)
        for s in _samples(prompts, backend.model.config.vocab_size):
            learner.add(s)
        learner.step()
        moved[where] = {k: v.float().cpu() for k, v in backend.weights().items()}
    cos = [
        float(
            torch.nn.functional.cosine_similarity((moved[device][k] - w).flatten(), (moved["cpu"][k] - w).flatten(), 0)
        )
        for k, w in start.items()
        if k in moved["cpu"] and not torch.equal(moved["cpu"][k], w)
    ]
    return {"min_update_cosine": round(min(cos), 4), "tensors": len(cos)}


def catalog_gpu(device_name: str) -> str:
    """The catalog's name for a CUDA device (`torch.cuda.get_device_name`: "NVIDIA H200", "NVIDIA H100 80GB HBM3"),
    H100 for one the catalog lacks: the bandwidth floor, the MFU's peak and the launched job's inventory follow it."""
    return next((k for k in CATALOG if k != "CPU" and re.search(rf"\b{k}\b", device_name)), "H100")


def _floor(weight_bytes: float, engine: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """The step time of reading the weights once at the GPU's memory bandwidth (its catalog entry), against each
    batch's measured step."""
    spec = CATALOG[catalog_gpu(torch.cuda.get_device_name(0))]
    floor_ms = 1e3 * weight_bytes / (spec.hbm_tb_per_s * 1e12)
    return {
        b: {"floor_ms": round(floor_ms, 3), "fraction": round(floor_ms / r["step_ms"], 4)} for b, r in engine.items()
    }


def _sampler_share(batch: int = 64) -> dict[str, float]:
    """The sampler's share of an embedded-engine decode step on the CPU (fp32, the process's threads) of
    Qwen2-0.5B's shape: the best of 3 steps against the best of 3 samplings of such a step's logits (the step
    includes its own sampling)."""
    from rlctl.engines.base import GenRequest
    from rlctl.engines.embedded import EmbeddedEngine
    from rlctl.engines.sampling import sample
    from rlctl.models.tinygpt import TinyGPTConfig

    keys = dict(hf_demo_builder().SHAPES["qwen2-0.5b"])
    cfg = TinyGPTConfig(architecture="Qwen2ForCausalLM", tie_word_embeddings=True, **keys)
    model = TinyGPT.empty(cfg, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-0.05, 0.05)
    engine = EmbeddedEngine(model, max_batch_size=batch, temperature=1.0)
    prompts = random_prompts(batch, 8, cfg.vocab_size)
    engine.add([GenRequest(f"s{i}", p, 8, ignore_eos=True) for i, p in enumerate(prompts)])
    engine.step()  # admits and prefills
    logits = torch.randn(batch, cfg.vocab_size)
    seeds, steps = torch.arange(batch), torch.zeros(batch, dtype=torch.long)
    step_s, sample_s = [], []
    for _ in range(3):  # interleaved: a busy machine slows both alike
        t0 = time.perf_counter()
        engine.step()
        t1 = time.perf_counter()
        sample(logits, seeds, steps, 1.0)
        step_s.append(t1 - t0)
        sample_s.append(time.perf_counter() - t1)
    step, samp = min(step_s), min(sample_s)
    return {
        "vocab": cfg.vocab_size,
        "batch": batch,
        "step_ms": round(1e3 * step, 1),
        "sample_ms": round(1e3 * samp, 1),
        "share": round(samp / step, 4),
    }


def hf_demo_builder() -> Any:
    """jobs/hf-demo/build.py as a module (its SHAPES: the architectures it builds)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("hf_demo_build", REPO / "jobs/hf-demo/build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train(model_dir: Path, device: str, *, samples: int, params: float, cuda: bool) -> dict[str, Any]:
    """GRPO steps (forward, backward, AdamW) on the device: a warm-up step, then two timed; at micro-batches of 16
    samples and, on a GPU, of all of them (a step's kernels are launched per micro-batch: on an H100 a 0.5B
    model's step at 16 samples waits on its launches, 2026-11-27). `train_tok_s` is the faster."""
    by_micro = {}
    for micro in (16, samples) if cuda else (16,):
        backend, learner = _learner(model_dir, device, micro=micro)
        by_micro[str(micro)] = train_steps(learner, _samples(samples // 4, backend.model.config.vocab_size), device)
        del backend, learner
    best = max(by_micro.values())
    peak = CATALOG[catalog_gpu(torch.cuda.get_device_name(0))].flops if cuda else None
    return {
        "train_tok_s": best,
        "train_tok_s_by_micro_batch": by_micro,
        "mfu": round(6 * params * best / peak, 4) if peak else None,
    }


def train_steps(learner: Any, batch: list[Any], device: str, *, after_warmup: Any = None) -> float:
    """Three GRPO steps on `batch`: tokens/s of the last two (the first warms up; `after_warmup()` runs after it,
    outside the timing)."""
    seconds, tokens = 0.0, 0
    for step in range(3):
        for s in batch:
            learner.add(s)
        sync(device)
        t0 = time.perf_counter()
        learner.step()
        sync(device)
        if step:
            seconds += time.perf_counter() - t0
            tokens += sum(len(s.prompt_tokens) + len(s.output_tokens) for s in batch)
        elif after_warmup is not None:
            after_warmup()
    return round(tokens / seconds, 1)


def _delta(device: str, *, nbytes: int) -> dict[str, float]:
    """Two bf16 versions in device memory, 2 % of elements changed: the codec from those buffers to the host
    payload (the version's xxh3 is the publisher's, of its host copy: not timed here)."""
    import xxhash

    from rlctl.weights import delta

    g = torch.Generator(device=device).manual_seed(0)
    prev = torch.randn(nbytes // 2, generator=g, device=device).to(torch.bfloat16)
    new = prev.clone()
    mask = torch.rand(prev.numel(), generator=g, device=device) < 0.02
    new[mask] = (new[mask].float() * 1.01 + 1e-3).to(torch.bfloat16)
    a, b = prev.view(torch.uint8), new.view(torch.uint8)
    target = xxhash.xxh3_64_intdigest(b.cpu().numpy().data)
    delta.encode(a, b, base_version=0, target_xxh3=target)  # warm-up
    sync(device)
    t0 = time.perf_counter()
    payload = delta.encode(a, b, base_version=0, target_xxh3=target)
    sync(device)
    seconds = time.perf_counter() - t0
    assert torch.equal(delta.decode(a.cpu(), payload), b.cpu())
    return {"delta_encode_gb_s": round(nbytes / seconds / 1e9, 3), "delta_ratio": round(payload.numel() / nbytes, 5)}


def _publisher_host_bytes(model_dir: Path, device: str) -> dict[str, float]:
    """A trainer rank's weight publisher in delta mode, as the trainer agent drives it: version 1 in full (a host
    snapshot), versions 2–4 as deltas encoded on the device from the trainer's tensors. The most its node held in
    host memory at once over 2–4 (buffer, payloads, the deltas kept; a transient copy included), and at version 1,
    ÷ the model's bytes in its dtype (what the planner prices); and the device memory of the encoder's part."""
    from rlctl.agents.weights import WeightPublisher
    from rlctl.config.runtime import WeightSync
    from rlctl.trainers.base import load_backend
    from rlctl.transport import InprocTransport
    from rlctl.weights.root import RootNode

    backend = load_backend("torch", model_dir, compute=compute_for(device))
    info = check_hf_dir(model_dir)
    dtype, tied = getattr(torch, info.config.torch_dtype), info.config.tie_word_embeddings
    pub = WeightPublisher(InprocTransport(secret=b"k"), listen="inproc://", sync=WeightSync(mode="delta"), timeout_s=30)
    node = pub.node
    assert isinstance(node, RootNode)
    model_bytes = info.arch.weight_bytes
    try:
        pub.publish(1, backend.wire_weights(dtype=dtype, tied=tied, on_device=True), params=backend.tensors())
        _wait_held(pub, 1)
        first, node.peak_host_bytes = node.peak_host_bytes, 0
        for v in (2, 3, 4):
            with torch.no_grad():
                for p in backend.model.parameters():
                    p.add_(1e-3 * torch.randn_like(p) * (torch.rand_like(p) < 0.02))
            assert pub.publish_step(v, backend.tensors())
        _wait_held(pub, 4)
        steady = node.peak_host_bytes
        assert pub._encoder is not None
        encoder = 2 * pub._encoder.nbytes  # its previous part and the newest snapshot
    finally:
        pub.close()
    return {
        "host_bytes_per_model_byte": round(steady / model_bytes, 3),
        "host_bytes_per_model_byte_first_version": round(first / model_bytes, 3),
        "encoder_device_bytes_per_model_byte": round(encoder / model_bytes, 3),
    }


def _wait_held(pub: Any, version: int) -> None:
    deadline = time.monotonic() + 120
    while pub.node.store.current is None or pub.node.store.current.version < version:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the publisher did not hold v{version} within 120 s")
        time.sleep(0.02)


def _launch(
    root: Path, *, device: str, quick: bool, artifacts: Path | None = None, timeout_s: float = 300
) -> dict[str, Any]:
    """`rlctl launch` on the local site: one trainer rank and two rollout units, all on device 0 when it is a GPU.
    The agents' logs go to `artifacts`/launch-logs.txt when given. Past `timeout_s` the launch is stopped (its
    agents with it) and its rc is None."""
    gpu = catalog_gpu(torch.cuda.get_device_name(0)) if device == "cuda" else "CPU"
    node: dict[str, Any] = {"host": "localhost", "gpus": 3}
    if device == "cuda":
        node["devices"] = [0, 0, 0]  # processes may share the device; the one trainer rank has it for NCCL alone
    inv = {
        "apiVersion": "rlctl/v1",
        "kind": "Inventory",
        "sites": {"here": {"datacenter": "dc", "scheduler": {"kind": "local"}, "gpu": gpu, "nodes": [node]}},
    }
    (root / "inventory.yaml").write_text(yaml.safe_dump(inv))
    job = yaml.safe_load((REPO / "jobs/hf-demo.yaml").read_text())
    job.update(
        name="gpu-check",
        inventory=["inventory.yaml"],
        model={"kind": "hf", "path": "model"},
        iterations=3 if quick else 4,
        batch={"prompts_per_iteration": 4, "samples_per_prompt": 4},
        placement={"trainer": {"site": "here", "gpus": 1}, "rollout": [{"site": "here", "gpus": 2}]},
        weight_sync={"mode": "delta"},
        tracking=[],
    )
    job["task"].update(path="data.jsonl", reward=str(REPO / "jobs/hf-demo/reward.py") + ":compute_score")
    (root / "job.yaml").write_text(yaml.safe_dump(job))
    t0 = time.monotonic()
    argv = [
        sys.executable,
        "-m",
        "rlctl",
        "launch",
        str(root / "job.yaml"),
        "--job-dir",
        str(root / "run"),
        "-o",
        "json",
    ]
    rc, stdout, stderr = ran(argv, timeout_s=timeout_s)
    logs = _logs(root / "run" / "logs")
    if artifacts is not None:
        (artifacts / "launch-logs.txt").write_text(logs)
    out: dict[str, Any] = {"rc": rc, "wall_s": round(time.monotonic() - t0, 1)}
    if rc != 0:
        out["stderr_tail"] = stderr[-2000:]
        out["logs_tail"] = logs[-3000:]
        return out
    s = json.loads(stdout)
    led = s["ledger"]
    out |= {"state": s["state"], "iterations": s["iterations"], "lost": led["lost"], "duplicated": led["duplicated"]}
    out["devices"] = _agent_devices(root / "run" / "logs")
    return out


def _logs(logs: Path) -> str:
    """Every agent's log, each under its name (the end of each: 20,000 characters)."""
    return "".join(f"==== {p.name}\n{p.read_text(errors='replace')[-20000:]}\n" for p in sorted(logs.glob("*.log")))


def _agent_devices(logs: Path) -> dict[str, str]:
    """What each agent's log says it computed on (its 'computing on …' line)."""
    found = {}
    for path in sorted(logs.glob("*.log")):
        m = re.search(r"computing on (\S+)", path.read_text(errors="replace"))
        if m:
            found[path.stem] = m.group(1)
    return found


def _gpu_tests(
    artifacts: Path | None = None, *, timeout_s: float = 300, tests: Path = REPO / "tests/gpu"
) -> dict[str, Any]:
    """`pytest tests/gpu`: the counts, and the failing tests' one-line reasons (the whole output to
    `artifacts`/gpu-tests.txt when given). Past `timeout_s` the run is ended and the counts are those of the tests
    that finished (`-v` prints each one's outcome as it ends), `timed_out` naming the test it was in; each test is
    bounded by `TEST_TIMEOUT_S` where pytest-timeout is installed."""
    argv = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--tb=short", "-rfE", str(tests)]
    if importlib.util.find_spec("pytest_timeout") is not None:
        argv.insert(4, f"--timeout={TEST_TIMEOUT_S}")
    rc, stdout, stderr = ran(argv, timeout_s=timeout_s)
    if artifacts is not None:
        (artifacts / "gpu-tests.txt").write_text(stdout + stderr)
    lines = stdout.strip().splitlines()
    tail = lines[-1] if lines and rc is not None else ""
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", tail)}
    if not counts:  # ended before its summary: each test's line so far
        ended = re.findall(r"^\S+::\S+ (PASSED|FAILED|SKIPPED|ERROR)", stdout, re.MULTILINE)
        counts = {k: ended.count(k.upper()) for k in ("passed", "failed", "skipped", "error")}
    out: dict[str, Any] = {k: counts.get(k, 0) for k in ("passed", "failed", "skipped", "error")}
    out["rc"] = rc
    if rc is None:
        running = re.match(r"(\S+::\S+)\s*$", lines[-1]) if lines else None
        out["timed_out"] = f"after {timeout_s:g} s" + (f", in {running.group(1)}" if running else "")
    elif not lines:
        out["stderr_tail"] = stderr[-300:]
    failing = [line[:300] for line in lines if line.startswith(("FAILED", "ERROR"))]
    failing += [line[:300] for line in lines if re.match(r"^\S+::\S+ (FAILED|ERROR)", line) and rc is None]
    if failing:
        out["failing"] = failing
    return out


def _megatron(model_dir: Path, device: str, *, timeout_s: float = 600) -> dict[str, Any]:
    """The `megatron` trainer backend against the `torch` one on the device (`bench/gpu_megatron.py`, a process of
    its own: it forms a torch.distributed group). A result it printed is kept when the process then failed or
    hung (at its teardown: NCCL's), with its `rc` (None: ended past `timeout_s`) and stderr's end."""
    argv = [sys.executable, "-m", "bench.gpu_megatron", str(model_dir), device]
    rc, stdout, stderr = ran(argv, timeout_s=timeout_s)
    result = last_json(stdout)
    how = f"exited {rc}" if rc is not None else f"did not end within {timeout_s:g} s"
    if result is None:
        raise RuntimeError(f"bench.gpu_megatron {how}: {stderr.strip()[-400:]}")
    if rc != 0:
        result |= {"rc": rc, "after_result": how, "stderr_tail": stderr.strip()[-400:]}
    return result


def _transport(*, quick: bool) -> dict[str, Any]:
    """`bench rpc`'s cost of authentication and encryption on this machine's cores (256 MiB over loopback; 16 MiB
    quick): on the 2 shared cores of CI's machines the tags compete with the copies themselves."""
    from bench.rpc import auth_costs

    return auth_costs(nbytes=16 << 20, repeats=2, round_trips=200) if quick else auth_costs()


# what gpu-check keeps of each CPU bench's result (`python -m bench NAME --json` has all of it)
CPU_BENCH_KEYS = {
    "pipeline": (
        "async_over_sync",
        "stream_over_sync",
        "ideal_async_over_sync",
        "ideal_async_over_sync_at_horizon",
        "samples_per_s",
        "bubble_fraction",
        "staleness_violations",
        "iterations",
        "segments",
        "cpu_count",
    ),
    "staleness": ("eta4_over_eta1", "eta2_over_eta1", "eta1_over_sync", "staleness_violations", "lost", "iterations"),
}


def _cpu_bench(name: str, *, quick: bool) -> dict[str, Any]:
    """`python -m bench NAME`'s headline figures on this machine's cores (`bench.pipeline`, `bench.staleness`: jobs
    of real agent processes on the CPU); for staleness also each configuration's samples/s and all-units-idle
    fraction."""
    import importlib

    result = importlib.import_module(f"bench.{name}").run(quick=quick)
    out = {k: result[k] for k in CPU_BENCH_KEYS[name] if k in result}
    if name == "staleness":
        out["configs"] = {c: {k: r[k] for k in ("samples_per_s", "all_idle")} for c, r in result["configs"].items()}
    return out
