"""Greedy evaluation of a policy on held-out prompts, batched on the embedded engine.

    digits:  task.heldout_prompts(n)    indices no SFT step or RL iteration draws (rlctl.rl.tasks)
    dataset: the first n rows of `evaluation.path`, prepared like the training file (rlctl.rl.dataset)
        │ greedy decoding (temperature 0), continuous batching
        ▼
    Figures(exact, reward, prompts)   digits: exact = the answer then EOS, reward = its verifier;
                                      dataset: reward = the task's reward function (no `exact`)

Why greedy and held out: the sampled reward of the training batches rises when the policy only sharpens
(lower entropy, same argmax), so RL can look like learning without being it (DESIGN §10). Greedy
accuracy on prompts it never trained on moves only when the most likely answer changes.
`compare(before_dir, after_dir, …)` and `compare_dataset(…)` give the summary's `heldout` figures of a job.
"""

from __future__ import annotations

import time
from concurrent.futures import CancelledError
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlctl.config.task import DatasetTask
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


def greedy(
    model: TinyGPT,
    requests: list[GenRequest],
    *,
    eos_token_ids: tuple[int, ...] | None = None,
    max_batch_size: int = BATCH_ROWS,
) -> dict[str, list[int]]:
    """Each request's greedy output tokens (ending with EOS unless cut at its length limit), by id."""
    engine = EmbeddedEngine(model, max_batch_size=max_batch_size, temperature=0.0, eos_token_ids=eos_token_ids)
    engine.add(requests)
    return {r.request_id: r.output_tokens for r in engine.run_until_done()}


def greedy_outputs(
    model: TinyGPT, task: DigitsTask, prompts: list[Prompt], *, max_batch_size: int = BATCH_ROWS
) -> dict[str, list[int]]:
    """Each digits prompt's greedy output tokens, by id."""
    # longest first keeps the long tail from running alone at the end; greedy outputs do not depend on it
    requests = [
        GenRequest(p.prompt_id, p.tokens, task.max_new_tokens, priority=float(p.target_tokens)) for p in prompts
    ]
    return greedy(model, requests, max_batch_size=max_batch_size)


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
    """`evaluate` on a saved model directory (the job's model/init or a checkpoint's model/), its RoPE tables of the
    task's context (a checkpoint's max_position_embeddings may be 1,024,000 positions: ≈ 1 GiB of tables)."""
    return evaluate(TinyGPT.from_pretrained(model_dir, context=task.context), task, prompts)


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


def compare_dataset(
    before: Path, after: Path, task: DatasetTask, *, data_dir: Path, reward_dir: Path, num_prompts: int
) -> dict[str, Any]:
    """Held-out greedy figures of the starting and the final policy on the first `num_prompts` rows prepared in
    `data_dir` (`evaluation.path`), each output scored by the task's reward (its file under `reward_dir`, the
    job directory), as the job summary shows them. On this machine's first GPU in the checkpoint's dtype when
    it has one (the engine is the same code), else on the CPU in fp32."""
    from rlctl.rl.dataset import load_dataset, submit_reward
    from rlctl.rl.reward_pool import RewardPool
    from rlctl.rl.source import by_source
    from rlctl.rl.tokenizer import load_tokenizer

    t0 = time.monotonic()
    data = load_dataset(data_dir, task)
    n = min(num_prompts, len(data))
    if not n:
        raise ValueError(f"{data_dir}: no held-out prompts")
    prompts = [data.prompt(i) for i in range(n)]
    tokenizer = load_tokenizer(before)
    cuda = torch.cuda.is_available()
    rewards: list[float] = []
    per_source: list[dict[str, float] | None] = []  # each policy's, where the rows have more than one data_source
    with RewardPool(
        task.reward,
        base_dir=reward_dir,
        workers=task.reward_workers,
        timeout_s=task.reward_timeout_s,
        on_error=task.reward_on_error,
        load_retry_s=task.reward_load_timeout_s,
    ) as pool:
        for model_dir in (before, after):  # one policy in memory at a time, on every core (the job is done)
            model = TinyGPT.from_pretrained(
                model_dir,
                dtype=None if cuda else torch.float32,
                device="cuda" if cuda else "cpu",
                context=task.max_prompt_tokens + task.max_output_tokens,  # (rlctl.agents.common.job_context)
            )
            requests = [GenRequest(f"h{i}", p.tokens, data.max_new_tokens) for i, p in enumerate(prompts)]
            outputs = greedy(model, requests, eos_token_ids=tokenizer.eos_ids)
            del model
            if cuda:
                torch.cuda.empty_cache()
            calls = [  # a failed call's log line names its row of the held-out file, as the run's do
                submit_reward(
                    pool,
                    tokenizer,
                    sample_id=f"{model_dir}#{i}",
                    prompt=p,
                    output_tokens=outputs[f"h{i}"],
                    data_path=task.path,
                )
                for i, p in enumerate(prompts)
            ]
            try:
                scores = [c.result().score for c in calls]
            except CancelledError:  # the pool failed (no worker could load the function): its calls were cancelled
                raise ValueError(f"reward pool failed: {pool.failed}") from None
            rewards.append(sum(scores) / n)
            per_source.append(by_source([p.data_source for p in prompts], scores))
        failures = pool.stats.failures
    out: dict[str, Any] = {
        "prompts": n,
        "greedy_reward_first": round(rewards[0], 4),
        "greedy_reward_last": round(rewards[1], 4),
        "reward_failures": failures,  # calls scored `reward_on_error` (raised, timed out, wrong type)
        "seconds": round(time.monotonic() - t0, 2),
    }
    if per_source[0] is not None and per_source[1] is not None:  # (one data_source: the figures as they were)
        out |= {"greedy_reward_first_by_source": per_source[0], "greedy_reward_last_by_source": per_source[1]}
    return out
