"""Measured training cost: seconds per trained token of one iteration of the job's algorithm, run by
rlctl's own learners (the trainer agent's `StreamingLearner` for GRPO, `PpoBatchLearner` for PPO).

    synthetic batch (P prompts × G samples, random tokens, behaviour log-probs, rewards)
      ─▶ learner.add(sample)… ─▶ learner.step()         `warmup_steps` untimed, then `steps` timed
      ─▶ median step time / tokens (prompt + output: what the planner's workload counts)

The model is the job's (built-in tiny-demo or an HF checkpoint), on this host's CPU thread(s) or
device; a reference model is loaded when the algorithm has a KL term, as the trainer does. Like
the generation probe, `clock` may be `time.thread_time` so other work on the machine is not counted.
"""

from __future__ import annotations

import importlib
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlctl.config.job import Batch, GrpoAlgorithm, PpoAlgorithm

PROMPT_TOKENS = 8
OUTPUT_TOKENS = (16, 48)  # each sample's output length is drawn uniformly in this range


@dataclass(frozen=True)
class TrainMeasurement:
    gpu_s_per_token: float  # median over the timed steps of step seconds / step tokens
    step_s: list[float]
    step_tokens: list[int]


def load_policy(checkpoint: str | Path | None) -> Any:
    """The policy to train: the HF checkpoint, or the built-in tiny-demo model (random weights: speed only)."""
    model_mod = importlib.import_module("rlctl.engines.model")
    return model_mod.TinyGPT() if checkpoint is None else model_mod.TinyGPT.from_pretrained(checkpoint)


def synthetic_samples(*, prompts: int, group_size: int, vocab: int, seed: int) -> list[Any]:
    """A batch shaped like an RL iteration's: groups of samples per prompt, varied output lengths."""
    sample_cls = importlib.import_module("rlctl.rl.samples").Sample
    rng = random.Random(seed)
    out = []
    for p in range(prompts):
        prompt = [1] + [rng.randrange(2, vocab) for _ in range(PROMPT_TOKENS - 1)]
        for _ in range(group_size):
            n = rng.randint(*OUTPUT_TOKENS)
            tokens = [rng.randrange(2, vocab) for _ in range(n)]
            out.append(sample_cls(f"p{p}", prompt, tokens, [-2.0] * n, float(rng.random() < 0.5)))
    return out


def make_learner(
    policy: Any, algorithm: GrpoAlgorithm | PpoAlgorithm, batch: Batch, *, checkpoint: str | Path | None
) -> Any:
    """The trainer agent's learner for `algorithm` (and a reference copy of the policy if it has a KL term)."""
    learner_mod = importlib.import_module("rlctl.agents.learner")
    ref = load_policy(checkpoint) if algorithm.kl_coef > 0 else None
    if ref is not None and checkpoint is None:
        ref.load_state_dict(policy.state_dict())
    if isinstance(algorithm, PpoAlgorithm):
        return learner_mod.PpoBatchLearner(
            policy,
            algorithm,
            ref_model=ref,
            micro_batch_samples=batch.train_micro_batch_samples,
            micro_batch_tokens=batch.train_micro_batch_tokens,
        )
    return learner_mod.StreamingLearner(
        policy,
        algorithm,
        group_size=batch.samples_per_prompt,
        micro_batch_samples=batch.train_micro_batch_samples,
        micro_batch_tokens=batch.train_micro_batch_tokens,
        ref_model=ref,
    )


def measure_training(
    algorithm: GrpoAlgorithm | PpoAlgorithm,
    batch: Batch,
    *,
    checkpoint: str | Path | None = None,
    steps: int = 3,
    warmup_steps: int = 1,
    clock: Callable[[], float] = time.perf_counter,
    learner_factory: Callable[[], Any] | None = None,
    vocab: int | None = None,
) -> TrainMeasurement:
    """Seconds per trained token of one iteration (`batch.samples_per_iteration` samples) of `algorithm`.

    `learner_factory` replaces the real learner (tests); `vocab` is the model's (read from it by default).
    """
    if steps < 1 or warmup_steps < 0:
        raise ValueError("steps must be ≥ 1 and warmup_steps ≥ 0")
    if learner_factory is None:
        policy = load_policy(checkpoint)
        vocab = policy.config.vocab_size
        learner = make_learner(policy, algorithm, batch, checkpoint=checkpoint)
    else:
        learner = learner_factory()
    assert vocab is not None, "vocab is needed with a learner_factory"
    times: list[float] = []
    counts: list[int] = []
    for i in range(warmup_steps + steps):
        samples = synthetic_samples(
            prompts=batch.prompts_per_iteration, group_size=batch.samples_per_prompt, vocab=vocab, seed=i
        )
        tokens = sum(len(s.prompt_tokens) + len(s.output_tokens) for s in samples)
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
