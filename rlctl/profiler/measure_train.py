"""Measured training cost: seconds per trained token of one iteration of the job's algorithm, run by
rlctl's own learners on a trainer backend (rlctl.trainers: `torch` or `megatron`), as the trainer agent runs it.

    model: the HF checkpoint, or the built-in tiny-demo (random weights) written to a temporary one
      ─▶ load_backend(backend, model, tp=1, pp=1): the policy (a LoRA job's: its adapters on the frozen weights, the
       step the job's trainer runs), and a reference when the algorithm has a KL term
      ─▶ the trainer agent's learner (`rl.learner.make_learner`: `StreamingLearner` for GRPO, `PpoBatchLearner`
         for PPO, its critic on the backend's `critic_trunk`)
    synthetic batch (P prompts × G samples, random tokens, behaviour log-probs, rewards)
      ─▶ learner.add(sample)… ─▶ learner.step()         `warmup_steps` untimed, then `steps` timed
      ─▶ median step time / padded tokens: the step's rows (prompt + output) cut as the learner cuts them at one
         rank and each cut padded to its longest row (`rl.cuts.step_padded_tokens`), what the planner prices a
         rank's share by (`planner.costs.train_compute_s`); per real token until 2026-12-08, which priced the
         probe's padding (about 1.1 × its real tokens) into every token of a job

One process is one trainer rank: the figure is for tp = pp = 1, the data-parallel rank both backends train
with in a job (a megatron split's figure needs its tp·pp ranks as processes: measure_split.py). megatron-core
forms its parallel state over a torch.distributed group: when this process is in none, a one-rank gloo
group is formed for the measurement and taken down, with megatron's state, after it. Like the generation
probe, `clock` may be `time.thread_time` so other work on the machine is not counted.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rlctl.config.algorithm import GrpoAlgorithm, PpoAlgorithm
from rlctl.config.pipeline import Batch
from rlctl.config.runtime import Lora
from rlctl.devices import Compute
from rlctl.errors import UsageError
from rlctl.models.hf import TinyGPTConfig, read_config
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.cuts import step_padded_tokens
from rlctl.rl.learner import make_learner
from rlctl.rl.samples import Sample, row_tokens
from rlctl.trainers.base import TrainerBackend, load_backend

PROMPT_TOKENS = 8
OUTPUT_TOKENS = (16, 48)  # each sample's output length is drawn uniformly in this range (`SampleLengths.of`)


@dataclass(frozen=True)
class SampleLengths:
    """The synthetic samples' prompt length and the range their output lengths are drawn from."""

    prompt_tokens: int = PROMPT_TOKENS
    output_tokens: tuple[int, int] = OUTPUT_TOKENS

    @property
    def context(self) -> int:
        """The longest sample: what the trainer is built for (its RoPE tables)."""
        return self.prompt_tokens + self.output_tokens[1]

    @classmethod
    def of(cls, config: TinyGPTConfig, *, model: str) -> SampleLengths:
        """The lengths for `model` (its config `config`): outputs held to the most the probe runs it on
        (`probe_positions`: max_positions, a Mistral's binding sliding_window, a longrope model's pretraining
        context, as a job's sequences are held by `rlctl check`), versus 56-token sequences a model of fewer
        positions refused (or a longrope one computed past its pretraining context); UsageError where it holds less
        than a prompt and one output token."""
        from rlctl.profiler.probe import probe_positions

        positions = probe_positions(config)
        if positions <= PROMPT_TOKENS:
            raise UsageError(
                f"model {model}: holds sequences of {positions} tokens (max_position_embeddings, a binding "
                f"sliding_window or longrope's pretraining context: the least); the training probe needs "
                f"{PROMPT_TOKENS + 1} (a prompt of {PROMPT_TOKENS} tokens and an output token)",
                hint="use --source analytical for this model",
            )
        most = min(OUTPUT_TOKENS[1], positions - PROMPT_TOKENS)
        return cls(PROMPT_TOKENS, (min(OUTPUT_TOKENS[0], most), most))


@dataclass(frozen=True)
class TrainMeasurement:
    gpu_s_per_token: float  # median over the timed steps of step seconds / step padded tokens (× tp·pp ranks)
    step_s: list[float]
    step_tokens: list[int]
    backend: str = "torch"  # the trainer backend that trained
    tp: int = 1  # its parallel configuration: one rank, a whole model, unless measure_split ran tp·pp ranks
    pp: int = 1
    rank_step_s: list[list[float]] = field(default_factory=list)  # measure_split: each rank's step seconds
    rank_tokens: list[list[int]] = field(default_factory=list)  # and the tokens each rank trained per step


def load_policy(
    checkpoint: str | Path | None, *, compute: Compute | None = None, context: int | None = None
) -> TinyGPT:
    """The embedded engine's model: the HF checkpoint, or the built-in tiny-demo (random weights: speed only), on
    `compute`'s device in its engine dtype (default: the CPU, fp32), holding sequences of up to `context` tokens
    (None: the checkpoint's max_positions; `TinyGPT.from_pretrained`)."""
    if compute is None:
        return TinyGPT() if checkpoint is None else TinyGPT.from_pretrained(checkpoint, context=context)
    if checkpoint is None:
        return TinyGPT().to(compute.device, compute.engine_dtype or torch.float32)
    return TinyGPT.from_pretrained(checkpoint, dtype=compute.engine_dtype, device=compute.device, context=context)


def synthetic_samples(
    *, prompts: int, group_size: int, vocab: int, seed: int, lengths: SampleLengths = SampleLengths()
) -> list[Sample]:
    """A batch shaped like an RL iteration's: groups of samples per prompt, varied output lengths (`lengths`); rewards
    0 and 1 alternate within each group, so every group has signal and trains (the learner skips a group whose rewards
    are all equal: the cost measured is that of a trained token)."""
    rng = random.Random(seed)
    out = []
    for p in range(prompts):
        prompt = [1] + [rng.randrange(2, vocab) for _ in range(lengths.prompt_tokens - 1)]
        for i in range(group_size):
            n = rng.randint(*lengths.output_tokens)
            tokens = [rng.randrange(2, vocab) for _ in range(n)]
            out.append(Sample(f"p{p}", prompt, tokens, [-2.0] * n, float(i % 2)))
    return out


@contextlib.contextmanager
def trainer_rank(
    backend: str,
    checkpoint: str | Path | None,
    *,
    reference: bool,
    compute: Compute | None = None,
    lora: Lora | None = None,
) -> Iterator[tuple[TrainerBackend, nn.Module | None, TinyGPTConfig, SampleLengths]]:
    """The `backend` policy on the checkpoint (tiny-demo when None) as one trainer rank, with `lora`'s adapters
    (the torch backend's), its reference model (without adapters) when `reference`, the model's config and the
    synthetic samples' lengths it is built for; megatron's process group and parallel state last as long as the
    block."""
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rlctl-measure-train-")))
        model_dir = Path(checkpoint) if checkpoint is not None else TinyGPT().save_pretrained(scratch / "model")
        config = read_config(model_dir)
        lengths = SampleLengths.of(config, model=str(checkpoint or "tiny-demo"))  # (before anything is loaded)
        if backend == "megatron":
            stack.enter_context(_one_rank_group(scratch / "rendezvous"))
        policy = load_backend(backend, model_dir, compute=compute, context=lengths.context, adapters=lora)
        ref = load_backend(backend, model_dir, compute=compute, context=lengths.context).model if reference else None
        yield policy, ref, config, lengths


@contextlib.contextmanager
def _one_rank_group(rendezvous: Path) -> Iterator[None]:
    """A gloo group of this process alone, unless it is in a group already; taken down after the block with
    the megatron parallel state formed over it (a later group, e.g. the next site's measurement, starts clean)."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=0, world_size=1)
    try:
        yield
    finally:
        from rlctl.trainers.megatron.model import import_megatron

        import_megatron().parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def measure_training(
    algorithm: GrpoAlgorithm | PpoAlgorithm,
    batch: Batch,
    *,
    backend: str = "torch",
    checkpoint: str | Path | None = None,
    steps: int = 3,
    warmup_steps: int = 1,
    clock: Callable[[], float] = time.perf_counter,
    learner_factory: Callable[[], Any] | None = None,
    vocab: int | None = None,
    compute: Compute | None = None,
    lora: Lora | None = None,
) -> TrainMeasurement:
    """Seconds per trained (padded) token of one iteration (`batch.samples_per_iteration` samples) of `algorithm`,
    trained by the `backend` trainer backend on one rank (tp = pp = 1); with `lora`, its adapters alone (the
    policy frozen, as a LoRA job's trainer trains it).

    `learner_factory` replaces the real learner (tests); `vocab` is the model's (read from it by default).
    """
    if steps < 1 or warmup_steps < 0:
        raise ValueError("steps must be ≥ 1 and warmup_steps ≥ 0")
    if learner_factory is not None:
        assert vocab is not None, "vocab is needed with a learner_factory"
        return _time_steps(learner_factory(), batch, vocab=vocab, steps=steps, warmup_steps=warmup_steps, clock=clock)
    reference = algorithm.kl_coef > 0
    with trainer_rank(backend, checkpoint, reference=reference, compute=compute, lora=lora) as rank:
        policy, ref, config, lengths = rank
        learner = make_learner(
            policy,
            algorithm,
            batch,
            ref=ref,
            iterations=warmup_steps + steps,
            max_output_tokens=lengths.output_tokens[1],
        )  # (the measurement's own longest output: what `loss_aggregation: constant` divides by)
        m = _time_steps(
            learner,
            batch,
            vocab=config.vocab_size,
            steps=steps,
            warmup_steps=warmup_steps,
            clock=clock,
            lengths=lengths,
        )
    return TrainMeasurement(m.gpu_s_per_token, m.step_s, m.step_tokens, backend=backend)


def padded_tokens(samples: list[Sample], batch: Batch) -> int:
    """The tokens one rank computes training `samples` in a step: their rows cut in length order to `batch`'s
    budgets and each cut padded to its longest row (`rl.cuts.step_padded_tokens` at one rank)."""
    rows = [row_tokens(s) for s in samples]
    budget = batch.train_micro_batch_tokens
    return int(step_padded_tokens(rows, batch.train_micro_batch_samples, max_tokens=budget))


def _time_steps(
    learner: Any,
    batch: Batch,
    *,
    vocab: int,
    steps: int,
    warmup_steps: int,
    clock: Callable[[], float],
    lengths: SampleLengths = SampleLengths(),
) -> TrainMeasurement:
    times: list[float] = []
    counts: list[int] = []
    for i in range(warmup_steps + steps):
        samples = synthetic_samples(
            prompts=batch.prompts_per_iteration,
            group_size=batch.samples_per_prompt,
            vocab=vocab,
            seed=i,
            lengths=lengths,
        )
        tokens = padded_tokens(samples, batch)
        t0 = clock()
        for s in samples:  # as the trainer hands them over; GRPO trains whole groups as they complete
            learner.add(s)
            learner.train_ready()
        learner.step()
        if i >= warmup_steps:
            times.append(clock() - t0)
            counts.append(tokens)
    per_token = statistics.median(t / n for t, n in zip(times, counts, strict=True))
    return TrainMeasurement(per_token, times, counts)
