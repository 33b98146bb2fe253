"""The longest request a job's task sends against its model's context (max_position_embeddings, × the factor of a
linear RoPE scaling, as vLLM derives max_model_len: `TinyGPTConfig.max_positions`): the rule `rlctl plan`
refuses a job by and `rlctl check` says (`rlctl.ops.preflight.data.context_problems`), in the same line. The engines
refuse a longer request (rlctl.engines.base.check_requests) and the trainer a longer sequence, inside the agents,
after launch; a plan of one prices sequences the model cannot hold.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rlctl.config.model import HfModel
from rlctl.config.task import DatasetTask, DigitsTask, LengthsTask
from rlctl.models.hf import CONFIG_FILE, read_config
from rlctl.models.rope import RopeScaling, longrope_refusal, positions_said

if TYPE_CHECKING:
    from rlctl.config.job import Job


def longest_request(task: DigitsTask | DatasetTask | LengthsTask) -> tuple[int, int]:
    """(prompt, output) tokens of the longest request the task may send an engine."""
    if isinstance(task, DatasetTask):
        return task.max_prompt_tokens, task.max_output_tokens
    if isinstance(task, LengthsTask):
        return task.prompt_tokens, task.max_output_tokens
    from rlctl.rl.tasks import MAX_DIGITS
    from rlctl.rl.tasks import DigitsTask as Digits

    digits = Digits(task)
    # BOS, the digits, '=': a prompt has at most num_digits_max digits, more only when its answer needs
    # them (9 letters per digit), never more than MAX_DIGITS (rlctl.rl.tasks.DigitsTask.prompt)
    answer_digits = math.ceil(digits.max_answer_chars / 9)
    return 2 + min(MAX_DIGITS, max(task.num_digits_max, answer_digits)), digits.max_new_tokens


def dataset_request(task: DatasetTask) -> str:
    """The longest request of a dataset task said by the fields that bound it (what the refusals ask to change):
    `max_prompt_tokens 1024 (the default) + max_output_tokens 4090`, versus `1024 prompt + 4090 output` of a
    max_prompt_tokens never set, a bound the job file does not show."""
    default = "" if "max_prompt_tokens" in task.model_fields_set else " (the default)"
    return f"max_prompt_tokens {task.max_prompt_tokens}{default} + max_output_tokens {task.max_output_tokens}"


def model_positions(job: Job) -> tuple[int, str] | None:
    """(the model's context, what it is and where it comes from: `max_position_embeddings 4096 (…/config.json)`, or
    for an HF checkpoint with RoPE scaling `context 512 (…/config.json: max_position_embeddings 128 × 'linear' factor
    4, as vLLM derives it)`); None where it is not known (a built-in's not recorded, a `kind: arch` model without
    max_positions)."""
    return None if (known := _context(job)) is None else known[:2]


def _context(job: Job) -> tuple[int, str, RopeScaling | None] | None:
    """`model_positions`, and an HF model's RoPE scaling: its config.json read once for both, versus once for each
    and once more for the architecture (`HfModel.arch`: the weight files' headers too)."""
    model = job.spec.model
    if isinstance(model, HfModel):
        c = read_config(model.path)
        context, where = c.max_positions, f"{model.path}/{CONFIG_FILE}"
        if (scaled := positions_said(c.max_position_embeddings, c.rope_scaling)) is not None:
            return context, f"context {context} ({where}: {scaled}, as vLLM derives it)", c.rope_scaling
        return context, f"max_position_embeddings {context} ({where})", c.rope_scaling
    if (limit := model.arch.max_positions) is None:
        return None
    if model.kind == "builtin":
        return limit, f"max_position_embeddings {limit} (built-in {model.name!r})", None
    return limit, f"max_position_embeddings {limit} (the job's model.max_positions)", None


def context_refusal(job: Job) -> tuple[str, str] | None:
    """(job field, why and what is valid) where the longest prompt plus the most output tokens a request of the job's
    task may ask for exceed the model's context, or pass a longrope model's pretraining context (`longrope_refusal`:
    engines and trainer would disagree past it); None where they fit, or the context is not known."""
    task = job.spec.task
    if (known := _context(job)) is None:
        return None
    limit, said, scaling = known
    prompt, output = longest_request(task)
    asked = (
        f"{dataset_request(task)} = {prompt + output}"
        if isinstance(task, DatasetTask)
        else (f"{prompt} prompt + {output} output")
    )
    if prompt + output <= limit:
        if (why := longrope_refusal(scaling, prompt + output)) is None:
            return None
        assert scaling is not None and scaling.original_max_position_embeddings is not None
        limit = scaling.original_max_position_embeddings
        return "task.max_output_tokens", f"{asked} tokens {why}; use {_valid(task, prompt, limit)}"
    return (
        "task.max_output_tokens",
        f"{asked} tokens exceed model {said}; use {_valid(task, prompt, limit)}",
    )


def _valid(task: DigitsTask | DatasetTask | LengthsTask, prompt: int, limit: int) -> str:
    if isinstance(task, DatasetTask):
        return f"max_prompt_tokens + max_output_tokens ≤ {limit}"
    if isinstance(task, LengthsTask):
        return f"prompt_tokens + max_output_tokens ≤ {limit}"
    return f"max_output_tokens ≤ {limit - prompt}"
