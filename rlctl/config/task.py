"""A job file's `task`: the digits demo, a length distribution, or a dataset with a reward, and the bounds on
lengths they share."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, ValidationInfo, field_validator, model_validator

from rlctl.config.base import MAX_THREADS, Seconds, Strict, is_recorded, register_tags

# Bounds no real job reaches, so that a typo (a few extra zeros) is refused instead of hanging `plan`/`check`
# or overflowing a float: published length distributions have σ ≈ 0.5–1.5 and medians of thousands of tokens.
MAX_SIGMA = 4.0
MAX_TOKENS = 2**24  # tokens of one prompt or one output (16.8M: beyond any model's context)
Sigma = Annotated[
    float, Field(gt=0, le=MAX_SIGMA, description=f"σ of ln(output length); at most {MAX_SIGMA:g} (published: 0.5–1.5)")
]
Tokens = Annotated[int, Field(gt=0, le=MAX_TOKENS, description=f"at most {MAX_TOKENS} (2^24)")]
MedianTokens = Annotated[float, Field(gt=0, le=MAX_TOKENS, description=f"at most {MAX_TOKENS} (2^24)")]
Growth = Annotated[
    float,
    Field(
        ge=0, le=1, description="RL iteration i: median × (1 + growth × i); at most 1 (a median doubled by iteration 1)"
    ),
]


class OverlongShaping(Strict):
    """DAPO's soft overlong punishment, added to every sample's reward (rlctl.rl.source.TaskSource.length_penalty):
    0 up to max_output_tokens − overlong_buffer_tokens, then falling linearly to −overlong_penalty at
    max_output_tokens."""

    overlong_buffer_tokens: NonNegativeInt = Field(
        0, description="the last this many output tokens are penalised; 0: off"
    )
    overlong_penalty: PositiveFloat | None = Field(None, description="the penalty at max_output_tokens (default 1)")

    @model_validator(mode="after")
    def _overlong(self) -> OverlongShaping:
        limit = getattr(self, "max_output_tokens", 0)
        if self.overlong_buffer_tokens > limit:
            raise ValueError(f"overlong_buffer_tokens {self.overlong_buffer_tokens} exceeds max_output_tokens {limit}")
        if self.overlong_penalty is not None and not self.overlong_buffer_tokens:
            raise ValueError("overlong_penalty needs overlong_buffer_tokens > 0 (the tokens it applies to)")
        return self

    @property
    def shaping(self) -> tuple[int, float]:
        """(buffer tokens, penalty at the limit)."""
        return self.overlong_buffer_tokens, 1.0 if self.overlong_penalty is None else self.overlong_penalty


class DigitsTask(OverlongShaping):
    """The demo task (DESIGN §10): `3172=` → `aaabcccccccdd`; length = digit sum, long-tailed."""

    kind: Literal["digits"]
    num_digits_min: PositiveInt = 1
    num_digits_max: PositiveInt = 6
    median_output_tokens: MedianTokens = 30.0
    sigma: Sigma = 0.8
    max_output_tokens: Tokens = 256
    growth_per_iteration: Growth = 0.0
    seed: NonNegativeInt = 0

    @model_validator(mode="after")
    def _range(self) -> DigitsTask:
        if self.num_digits_max < self.num_digits_min:
            raise ValueError("num_digits_max must be ≥ num_digits_min")
        return self


class LengthsTask(Strict):
    """A workload described only by its length distribution (planning and simulation at scale).

    Output lengths are lognormal with median `median_output_tokens` and σ(ln L) = `sigma`, capped at
    `max_output_tokens`; `growth_per_iteration` scales the median each iteration (inference-time scaling).
    """

    kind: Literal["lengths"]
    prompt_tokens: Tokens = 512
    median_output_tokens: MedianTokens = 2750.0
    sigma: Sigma = 0.885
    max_output_tokens: Tokens = 20000
    growth_per_iteration: Growth = 0.0  # the plan draws the lengths from the job's `seed`


# rlctl.rl.reward.BUILTIN_REWARDS' (not imported by the config)
BUILTIN_REWARD_NAMES = ("digits", "exact_match", "gsm8k", "math")
# what the chat template is given besides chat_template_kwargs (add_generation_prompt True, tools and documents None)
# and transformers' apply_chat_template's own parameters: a kwarg of the same name is no template variable there
TEMPLATE_ARGUMENTS = {
    "messages",
    "add_generation_prompt",
    "tools",
    "documents",
    "conversation",
    "chat_template",
    "continue_final_message",
    "tokenize",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
}
DATA_SUFFIXES = (".jsonl", ".parquet")  # a dataset file's, in any case (rlctl.rl.dataset_rows reads .parquet so)


class DatasetTask(OverlongShaping):
    """Prompts from the user's jsonl or parquet file, scored by a reward function (rlctl/rl/dataset.py, reward.py).

    Rows carry the fields RL users already have (verl's layout): `prompt` (a string or chat messages
    [{role, content}]), the ground truth (`ground_truth`, or verl's nested `reward_model.ground_truth`),
    `data_source`, `extra_info`. `reward` is a built-in (`exact_match`, `digits`, `gsm8k`, `math`) or a user
    function `path/to/file.py:name` / `package.module:name` with verl's signature
    `compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict`.
    """

    kind: Literal["dataset"]
    path: str = Field(description="jsonl or parquet file; relative to the job file")
    prompt_key: str = "prompt"
    answer_key: str | None = Field(
        "ground_truth", description="dotted keys reach nested fields (reward_model.ground_truth); null: none"
    )
    data_source_key: str = "data_source"
    extra_info_key: str | None = Field(
        "extra_info", description="null: none read (every row's extra_info None, as a row without the field's)"
    )
    template_strings: bool = Field(
        False,
        description="render string prompts through the chat template, as one user message (refused where every "
        "prompt is chat messages, which it renders anyway)",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="variables the chat template reads beyond the messages (verl's apply_chat_template_kwargs, "
        "transformers' apply_chat_template(**kwargs)), e.g. {enable_thinking: false} for Qwen3; one the template "
        "never reads is refused, and all where no prompt goes through the template",
    )
    max_prompt_tokens: Tokens = 1024
    max_output_tokens: Tokens = 1024
    bad_rows: Literal["refuse", "skip"] = "refuse"
    shuffle: bool = True
    shuffle_seed: NonNegativeInt = 0
    reward: str = Field(
        "exact_match",
        description="a built-in: exact_match (the output, stripped, is the ground truth), gsm8k (verl's GSM8K "
        "scorer, for data_source openai/gsm8k: the last '#### <number>' of the output is it), math (verl's MATH "
        "scorer, for data_source lighteval/MATH: the last \\boxed{…} of the output is it, both normalised), digits "
        "(the demo task's); or a function of your own: path/to/file.py:name or package.module:name",
    )
    reward_workers: Annotated[int, Field(ge=0, le=MAX_THREADS)] = Field(
        2, description=f"processes beside the controller, at most {MAX_THREADS}; 0: in the caller's thread, no timeout"
    )
    reward_timeout_s: Seconds = 10.0
    reward_load_timeout_s: Seconds | None = Field(
        None,
        description="how long a reward worker may take to load the function (its imports, a reward model's "
        "weights); null: 6 × reward_timeout_s, at least 60 s",
    )
    reward_on_error: float = 0.0
    reward_stall_s: Seconds | Literal["auto", "never"] = Field(
        "auto",
        description="a sample whose reward is still computing while its group holds the trainer's iteration is "
        "filtered out after this long, and its group trains without it (a group that would keep fewer than 2 "
        "samples is generated again; auto: 10 × the median of recent reward latencies, at least 0.05 s and 2 × their "
        "p90 (a reward slower on some outputs as a rule is waited for); never: "
        "wait for the reward, up to reward_timeout_s)",
    )

    @field_validator("path")
    @classmethod
    def _format(cls, v: str) -> str:
        if not v.lower().endswith(DATA_SUFFIXES):  # (train.PARQUET: a parquet file, as dataset.py reads it)
            raise ValueError(f"unsupported file {v!r}; use a .jsonl or .parquet file")
        return v

    @model_validator(mode="after")
    def _builtin_reward_has_answers(self, info: ValidationInfo) -> DatasetTask:
        """Not in a job's record (`RECORDED`): one an older rlctl launched so reads as launched, else no command
        could read it back (status, pull, launch --resume)."""
        recorded = is_recorded(info)
        if self.answer_key is None and self.reward in BUILTIN_REWARD_NAMES and not recorded:  # each None: never met
            raise ValueError(
                f"reward {self.reward!r} compares each output with its row's ground truth, and answer_key is null; "
                "name the field that holds the answers, or a reward of your own (path/to/file.py:function)"
            )
        return self

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, v: dict[str, Any]) -> dict[str, Any]:
        if taken := sorted(set(v) & TEMPLATE_ARGUMENTS):
            raise ValueError(
                f"{', '.join(taken)}: set by rlctl as transformers' apply_chat_template sets it, not a template "
                "variable of the job's; leave it out"
            )
        for name, value in v.items():  # (the dataset's identity and the job's record hold them as JSON)
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError):
                raise ValueError(
                    f"{name}: {value!r} is not a JSON value (a string, number, boolean, null, list or mapping of "
                    "them); quote a date or time to pass it as text"
                ) from None
        return v

    @field_validator("reward")
    @classmethod
    def _reward_form(cls, v: str) -> str:
        target, sep, name = v.rpartition(":")
        if sep and (not target or not name.isidentifier()):
            raise ValueError(
                f"invalid reward {v!r}; use a built-in name, path/to/file.py:function or package.module:function"
            )
        # (each was taken for another form: 'unknown built-in reward', or a module whose import raised a TypeError)
        if not sep and v.endswith(".py"):
            raise ValueError(
                f"{v!r} names a file but not its function; use path/to/file.py:function ({v}:compute_score)"
            )
        if sep and not target.endswith(".py") and not all(p.isidentifier() for p in target.split(".")):
            raise ValueError(
                f"{target!r} is neither a .py file nor a module name; use path/to/file.py:function or "
                "package.module:function"
            )
        return v


Task = Annotated[DigitsTask | LengthsTask | DatasetTask, Field(discriminator="kind")]
register_tags("task", Task)
