"""Greedy evaluation of a policy on held-out prompts of the digits task, batched on the embedded engine.

    task.heldout_prompts(n)        indices no SFT step or RL iteration draws (rlctl.rl.tasks)
        │ greedy decoding (temperature 0), continuous batching, longest answers admitted first
        ▼
    Figures(exact, reward, prompts)   exact: the answer then EOS; reward: the task's verifier, mean

Why greedy and held out: the sampled reward of the training batches rises when the policy only sharpens
(lower entropy, same argmax), so RL can look like learning without being it (DESIGN §10). Greedy
accuracy on prompts it never trained on moves only when the most likely answer changes.
`compare(before_dir, after_dir, …)` gives the summary's `heldout` figures of a job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlctl.engines.base import GenRequest
from rlctl.engines.embedded import EmbeddedEngine
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.sft import one_thread
from rlctl.rl.tasks import DigitsTask, Prompt

BATCH_ROWS = 64


@dataclass(frozen=True)
class Figures:
    exact: float  # fraction of prompts answered exactly (then EOS)
    reward: float  # mean reward
    prompts: int


def greedy_outputs(
    model: TinyGPT, task: DigitsTask, prompts: list[Prompt], *, max_batch_size: int = BATCH_ROWS
) -> dict[str, list[int]]:
    """Each prompt's greedy output tokens (ending with EOS unless cut at the task's length limit), by id."""
    engine = EmbeddedEngine(model, max_batch_size=max_batch_size, temperature=0.0)
    # longest first keeps the long tail from running alone at the end; greedy outputs do not depend on it
    engine.add(
        [GenRequest(p.prompt_id, p.tokens, task.max_new_tokens, priority=float(p.target_tokens)) for p in prompts]
    )
    return {r.request_id: r.output_tokens for r in engine.run_until_done()}


def score_outputs(task: DigitsTask, prompts: list[Prompt], outputs: dict[str, list[int]]) -> Figures:
    """Exact-match fraction and mean reward of `outputs` (by prompt id) under the task's verifier."""
    if not prompts:
        raise ValueError("no prompts to evaluate")
    exact = sum(task.exact(p, outputs[p.prompt_id]) for p in prompts)
    reward = sum(task.reward(p, outputs[p.prompt_id]) for p in prompts)
    return Figures(exact=exact / len(prompts), reward=reward / len(prompts), prompts=len(prompts))


def evaluate(model: TinyGPT, task: DigitsTask, prompts: list[Prompt]) -> Figures:
    """Greedy answers of `model` to `prompts`, scored by the task's verifier."""
    return score_outputs(task, prompts, greedy_outputs(model, task, prompts))


def evaluate_dir(model_dir: Path, task: DigitsTask, prompts: list[Prompt]) -> Figures:
    """`evaluate` on a saved model directory (the job's model/init or a checkpoint's model/)."""
    return evaluate(TinyGPT.from_pretrained(model_dir), task, prompts)


def compare(before: Path, after: Path, task: DigitsTask, *, num_prompts: int) -> dict[str, Any]:
    """Held-out greedy figures of the starting policy and of the final one, as the job summary shows them."""
    t0 = time.monotonic()
    prompts = task.heldout_prompts(num_prompts)
    with one_thread():
        first, last = evaluate_dir(before, task, prompts), evaluate_dir(after, task, prompts)
    return {
        "prompts": num_prompts,
        "greedy_exact_first": round(first.exact, 4),
        "greedy_exact_last": round(last.exact, 4),
        "greedy_reward_first": round(first.reward, 4),
        "greedy_reward_last": round(last.reward, 4),
        "seconds": round(time.monotonic() - t0, 2),
    }
