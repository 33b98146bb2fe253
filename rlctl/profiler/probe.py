"""The microbenchmarks of `rlctl profile --source measured`, run where the site's agents run.

    rlctl profile ──backend(site).start──▶ python -m rlctl.profiler.probe <ProbeSpec as options> --out F
                  ◀── F (JSON: generation entries, one per engine, and the training figures) ──

A local site runs it in-process; a SLURM or SSH site through its launch backend, like an agent.
Generation: PTL(BS) and prefill of each rollout engine asked for (the embedded engine on the
built-in tiny-demo or an HF checkpoint; vLLM on an HF checkpoint). Training: seconds per token of
one iteration of the algorithm with rlctl's learners on the trainer backend asked for (`torch` or
`megatron`), one rank at tp = pp = 1 on this process's thread clock (`measure_train`), a LoRA job's adapters
trained on the frozen policy (`--lora-rank`, `--lora-alpha`, `--lora-targets`: its trainer.lora); with a megatron
split (`--split TP PP`, a job's trainer.tensor_parallel / pipeline_parallel) also GPU-seconds per token at
that split, its tp·pp ranks run as this process's children and timed by wall clock, and tp = pp = 1 in the
same harness (`measure_split`: "training_split" in F). The split's ranks need as many cores as this process
may use (a core per rank, as the job's trainer ranks get), and the split must divide the model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.config.algorithm import GrpoAlgorithm, PpoAlgorithm
from rlctl.config.pipeline import Batch
from rlctl.config.runtime import Lora
from rlctl.engines.factory import VLLM_INSTALL_HINT, vllm_available
from rlctl.errors import RlctlError, UsageError
from rlctl.exits import end_after, end_without_finalization
from rlctl.launch.agentenv import code_mismatch
from rlctl.models.catalog import BUILTIN_MODELS
from rlctl.profiler.measure import (
    LOCAL_BATCHES,
    LOCAL_CONTEXTS,
    LOCAL_MAX_CONTEXT,
    embedded_engines_on,
    measure_generation,
    measure_vllm,
)
from rlctl.profiler.profile import GenerationEntry
from rlctl.trainers.base import BACKENDS, megatron_available

if TYPE_CHECKING:  # torch: imported where a measurement runs
    from rlctl.models.hf import TinyGPTConfig
    from rlctl.profiler.measure_train import TrainMeasurement

ENGINES = ("embedded", "vllm")
CONTEXT_MARGIN = 16
# a GPU's grid: batches up to the hundreds where decode turns compute-bound, contexts of real prompts + outputs
GPU_BATCHES = [1, 8, 32, 64, 128, 256]
GPU_CONTEXTS = [128, 512, 2048]


def cuda_clock() -> float:
    """The wall clock once the GPU has finished what was queued (its kernels run asynchronously)."""
    import torch

    torch.cuda.synchronize()
    return time.perf_counter()  # a profiled prompt plus the tokens decoded after it must fit the model's positions


@dataclass(frozen=True)
class ProbeSpec:
    """What to measure: the model (built-in name or HF checkpoint), engines, algorithm, batch shape and the
    trainer backend that trains it."""

    model: str | None  # a built-in model name (tiny-demo), or None with `checkpoint`
    checkpoint: str | None  # an HF checkpoint directory on the host that runs the probe
    engines: tuple[str, ...]
    kv_capacity_tokens: int
    algorithm: GrpoAlgorithm | PpoAlgorithm
    batch: Batch
    trainer_backend: str = "torch"  # a key of rlctl.trainers.base.BACKENDS
    split: tuple[int, int] | None = None  # megatron (tp, pp) measured over its ranks besides tp 1 pp 1
    device: str = "cpu"  # "cuda" on a GPU site: measured on its GPU as its agents compute (rlctl.devices)
    lora: Lora | None = None  # a LoRA job's trainer.lora: the step timed trains its adapters (the torch backend's)
    # a job's longest context its plan reads the decode curve at (`job_context`): the CPU grid's top (`contexts_for`)
    job_context: int | None = None

    def argv(self) -> list[str]:
        """The probe's command-line options for this spec (everything but --out)."""
        out = ["--model", self.model] if self.model else ["--checkpoint", str(self.checkpoint)]
        for e in self.engines:
            out += ["--engine", e]
        b = self.batch
        out += ["--kv-capacity-tokens", str(self.kv_capacity_tokens), "--algorithm", self.algorithm.kind]
        out += ["--kl-coef", repr(self.algorithm.kl_coef), "--prompts", str(b.prompts_per_iteration)]
        out += ["--samples-per-prompt", str(b.samples_per_prompt)]
        out += ["--micro-batch-samples", str(b.train_micro_batch_samples)]
        out += ["--micro-batch-tokens", str(b.train_micro_batch_tokens or 0)]
        out += ["--trainer-backend", self.trainer_backend, "--device", self.device]
        if self.lora is not None:  # (dropout: 0, the only one built)
            out += ["--lora-rank", str(self.lora.rank), "--lora-alpha", repr(self.lora.alpha)]
            targets = self.lora.target_modules
            out += ["--lora-targets", targets if isinstance(targets, str) else ",".join(targets)]
        out += ["--job-context", str(self.job_context)] if self.job_context is not None else []
        return out + (["--split", *map(str, self.split)] if self.split else [])


def check_engines(spec: ProbeSpec, *, vllm_here: bool = True) -> None:
    """UsageError unless every engine of `spec` can run its model (before anything starts); with
    `vllm_here`, vLLM must be importable here (the probe runs on this host)."""
    for engine in spec.engines:
        if engine == "vllm":
            if spec.checkpoint is None:
                raise UsageError(
                    f"the vllm engine runs Hugging Face checkpoints; {spec.model!r} is a built-in model",
                    hint="pass --model DIR (a checkpoint directory) or --job with model.kind hf",
                )
            if vllm_here and vllm_available() is not None:
                raise UsageError(
                    f"--source measured --engine vllm: {VLLM_INSTALL_HINT}",
                    hint="or measure the embedded engine: --engine embedded",
                )
        elif spec.checkpoint is None and spec.model != "tiny-demo":
            raise UsageError(
                f"measured profiles run the embedded engine, which runs 'tiny-demo' or an HF checkpoint; "
                f"got {spec.model!r}",
                hint="use --source analytical for other models",
            )


def check_trainer(spec: ProbeSpec, *, here: bool = True) -> None:
    """UsageError unless the trainer backend of `spec` runs its split (before anything starts); with `here` (the
    probe runs on this host), megatron-core must be importable here and the split's ranks must fit the cores this
    process may use."""
    if spec.lora is not None and (spec.trainer_backend != "torch" or spec.algorithm.kind != "grpo"):
        raise UsageError(
            f"the job's trainer.lora trains GRPO's policy on the 'torch' backend; the probe would time "
            f"{spec.algorithm.kind} on {spec.trainer_backend!r}, where LoRA is not built",
            hint="measure the torch backend: --trainer-backend torch (rlctl check refuses the job as it is)",
        )
    if spec.trainer_backend != "megatron":
        if spec.split is not None:
            raise UsageError(
                f"--split {spec.split[0]} {spec.split[1]}: trainer backend {spec.trainer_backend!r} trains whole "
                "replicas (data parallel); tensor/pipeline splits are megatron's",
                hint="measure the split with --trainer-backend megatron",
            )
        return
    if here and (install := megatron_available()) is not None:
        raise UsageError(
            f"--source measured --trainer-backend megatron: megatron-core is not installed: {install}",
            hint="or measure the torch backend: --trainer-backend torch",
        )
    if spec.split is None:
        return
    tp, pp = spec.split
    if spec.device == "cuda":  # its ranks would run on the probe host's CPU, and price the GPU site's plan
        raise UsageError(
            f"--split {tp} {pp} on a GPU site: megatron's tp/pp ranks over NCCL are not built (its ranks run on CPUs "
            "only), so the split cannot be measured on the site's GPUs",
            hint="use --source analytical for this site, or a job without a megatron split (tensor_parallel and "
            "pipeline_parallel 1)",
        )
    from rlctl.models.hf import TinyGPTConfig, read_config
    from rlctl.trainers.megatron.names import check_split

    try:
        check_split(TinyGPTConfig() if spec.checkpoint is None else read_config(spec.checkpoint), tp, pp)
    except ValueError as e:
        raise UsageError(
            f"megatron split tp {tp} pp {pp} of {spec.model or spec.checkpoint}: {e}",
            hint="set the job's trainer.tensor_parallel / pipeline_parallel to divisors",
        ) from e
    if here and tp * pp > (cores := len(os.sched_getaffinity(0))):
        raise UsageError(
            f"--source measured: the megatron split tp {tp} pp {pp} is timed over its {tp * pp} ranks, a core each, "
            f"and this host gives the probe {cores}; on shared cores the wall clock would count the sharing",
            hint=f"profile on a site whose probe host has ≥ {tp * pp} cores, or use --source analytical",
        )


def probe_positions(config: TinyGPTConfig) -> int:
    """The longest sequence the probe runs the model on: the longest a job may ask of it (`rlctl check`,
    rlctl.planner.context), max_positions, held to a Mistral's binding sliding_window (`hf.window_refusal`) and to a
    longrope model's pretraining context (`rope.longrope_refusal`: past it engines and trainer switch factors apart)."""
    held = (config.max_positions, config.binding_window, config.longrope_context)
    return min(p for p in held if p is not None)


def contexts_for(max_positions: int, job_context: int | None = None) -> list[int]:
    """The local grid's contexts that fit the model's positions (at least one: half of them). With a job's
    `job_context` (the longest context its plan reads the curve at), the grid's contexts below it and that context
    itself, held to the positions and to LOCAL_MAX_CONTEXT (the CPU's cost: a point costs about its context × the
    batches), versus 16, 64 and 160 for every job: a job of longer sequences was priced by extrapolating past 160, one
    of shorter ones measured at contexts its plan never reads."""
    if job_context is None:
        fit = [c for c in LOCAL_CONTEXTS if c + CONTEXT_MARGIN <= max_positions]
        return fit or [max(2, max_positions // 2)]
    top = min(job_context, max_positions - CONTEXT_MARGIN, LOCAL_MAX_CONTEXT)
    if top < 2:
        return [max(2, max_positions // 2)]
    return [c for c in LOCAL_CONTEXTS if c < top] + [top]


def job_context(prompt_tokens: int, output_tokens: int) -> int:
    """The longest context a plan reads a decode curve at, for a job whose longest request is `prompt_tokens` +
    `output_tokens` (`rlctl.planner.context.longest_request`): a padded step's, the prompt + half the longest output
    (`rlctl.planner.curves.live_context`; a paged step's is less)."""
    return prompt_tokens + -(-output_tokens // 2)


def measure_here(spec: ProbeSpec) -> dict[str, Any]:
    """Generation entries (one per engine) and the training seconds per token, measured on this host: on its
    first GPU when `spec.device` is "cuda" (the checkpoint's dtype, CUDA graphs; timed on the wall clock after
    the device finished), else on one CPU thread (timed on that thread's clock)."""
    import torch

    from rlctl.devices import compute_for
    from rlctl.models.hf import TinyGPTConfig, read_config
    from rlctl.profiler.measure_split import measure_split
    from rlctl.profiler.measure_train import load_policy, measure_training

    check_engines(spec)
    check_trainer(spec)
    compute = compute_for(spec.device)  # a GPU site whose host cannot use CUDA stops here, in one line
    torch.set_num_threads(1)  # one engine thread / one trainer rank: one "GPU" slot on a CPU site
    config = TinyGPTConfig() if spec.checkpoint is None else read_config(spec.checkpoint)
    positions = probe_positions(config)
    if compute.is_cuda:
        contexts = [c for c in GPU_CONTEXTS if c + CONTEXT_MARGIN <= positions] or [16]
        batches, clock, clock_name = GPU_BATCHES, cuda_clock, "wall"
    else:  # CPU time of the (single) engine thread: other work on the machine does not inflate the profile
        contexts, batches = contexts_for(positions, spec.job_context), LOCAL_BATCHES
        clock, clock_name = time.thread_time, "thread"
    # built for the longest sequence measured, versus every position a checkpoint has (1,024,000: ≈ 1 GiB of tables)
    net = load_policy(spec.checkpoint, compute=compute, context=min(positions, max(contexts) + CONTEXT_MARGIN))
    entries: list[GenerationEntry] = []
    for engine in spec.engines:
        if engine == "vllm":
            assert spec.checkpoint is not None
            entry = measure_vllm(
                spec.checkpoint,
                contexts=contexts,
                batch_sizes=batches,
                kv_capacity_tokens=spec.kv_capacity_tokens,
                clock=clock,
                context=config.longrope_context,  # (its max_model_len; None: vLLM's own, as a job's without one)
            )
        else:  # the embedded engine attends over the batch's max length (padded attention)
            entry = measure_generation(
                embedded_engines_on(net),
                contexts=contexts,
                batch_sizes=batches,
                kv_capacity_tokens=spec.kv_capacity_tokens,
                clock=clock,
                padded_attention=True,
            )
        entries.append(entry.model_copy(update={"engine": engine}))
    train = measure_training(
        spec.algorithm,
        spec.batch,
        backend=spec.trainer_backend,
        checkpoint=spec.checkpoint,
        clock=clock,
        compute=compute,
        lora=spec.lora,
    )
    out: dict[str, Any] = {
        "host": os.uname().nodename,
        "device": str(compute.device),
        "generation": [e.model_dump(mode="json") for e in entries],
        "training": {**_training(train), "clock": clock_name},
    }
    if spec.split is not None:  # the split's ranks, and one rank in the same harness: like for like
        tp, pp = spec.split
        single, at_split = (
            measure_split(
                spec.algorithm, spec.batch, tp=t, pp=p, backend=spec.trainer_backend, checkpoint=spec.checkpoint
            )
            for t, p in ((1, 1), (tp, pp))
        )
        out["training_split"] = {"clock": "wall", "split": _training(at_split), "single": _training(single)}
    return out


def _training(m: TrainMeasurement) -> dict[str, Any]:
    out = {"backend": m.backend, "tp": m.tp, "pp": m.pp, "gpu_s_per_token": m.gpu_s_per_token, "step_s": m.step_s}
    out["tokens"] = m.step_tokens
    return out | ({"rank_step_s": m.rank_step_s, "rank_tokens": m.rank_tokens} if m.rank_step_s else {})


def parse_spec(argv: list[str] | None = None) -> tuple[ProbeSpec, Path]:
    ap = argparse.ArgumentParser(prog="python -m rlctl.profiler.probe")
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", choices=sorted(BUILTIN_MODELS))
    which.add_argument("--checkpoint", help="an HF checkpoint directory on this host")
    ap.add_argument("--engine", action="append", choices=ENGINES)
    ap.add_argument("--kv-capacity-tokens", type=int, required=True)
    ap.add_argument("--algorithm", choices=["grpo", "ppo"], default="grpo")
    ap.add_argument("--kl-coef", type=float, default=0.0)
    ap.add_argument("--prompts", type=int, default=Batch().prompts_per_iteration)
    ap.add_argument("--samples-per-prompt", type=int, default=Batch().samples_per_prompt)
    ap.add_argument("--micro-batch-samples", type=int, default=Batch().train_micro_batch_samples)
    ap.add_argument("--micro-batch-tokens", type=int, default=Batch().train_micro_batch_tokens or 0)
    ap.add_argument("--trainer-backend", choices=sorted(BACKENDS), default="torch")
    ap.add_argument("--split", type=int, nargs=2, metavar=("TP", "PP"), help="megatron: also measure this split")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: on this host's first GPU")
    ap.add_argument("--lora-rank", type=int, help="train LoRA adapters of this rank (a job's trainer.lora)")
    ap.add_argument("--lora-alpha", type=float)
    ap.add_argument("--lora-targets", default="all-linear", help="the adapted projections, comma-separated")
    ap.add_argument("--job-context", type=int, help="the longest context the job's plan reads (the CPU grid's top)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    algo: GrpoAlgorithm | PpoAlgorithm = (PpoAlgorithm if a.algorithm == "ppo" else GrpoAlgorithm)(
        kind=a.algorithm, kl_coef=a.kl_coef
    )
    batch = Batch(
        prompts_per_iteration=a.prompts,
        samples_per_prompt=a.samples_per_prompt,
        train_micro_batch_samples=a.micro_batch_samples,
        train_micro_batch_tokens=a.micro_batch_tokens or None,
    )
    engines = tuple(dict.fromkeys(a.engine or ["embedded"]))
    split = (a.split[0], a.split[1]) if a.split else None
    lora = None
    if a.lora_rank is not None:
        targets = a.lora_targets if a.lora_targets == "all-linear" else a.lora_targets.split(",")
        lora = Lora(rank=a.lora_rank, alpha=a.lora_alpha, target_modules=targets)
    spec = ProbeSpec(
        a.model,
        a.checkpoint,
        engines,
        a.kv_capacity_tokens,
        algo,
        batch,
        a.trainer_backend,
        split,
        a.device,
        lora,
        a.job_context,
    )
    return spec, a.out


def main(argv: list[str] | None = None) -> int:
    spec, out = parse_spec(argv)
    mismatch = code_mismatch()  # the operator's rlctl asked, through RLCTL_CODE: another one's figures are not its own
    if mismatch is not None:
        sys.stderr.write(f"rlctl profile probe: on {os.uname().nodename}: {mismatch}\n")
        return 2
    try:
        result = measure_here(spec)
    except RlctlError as e:
        sys.stderr.write(f"rlctl profile probe: {e}\n")
        return e.exit_code
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(out)  # whole or absent: the operator never reads half a file
    return 0


if __name__ == "__main__":
    # a megatron measurement formed (and took down) a one-rank gloo group here, whose worker thread can still be
    # freeing its last collective at the interpreter's finalization (SIGABRT after F was written: rlctl.exits)
    end_after(main, end=end_without_finalization)
