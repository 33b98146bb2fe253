"""Job files (`jobs/*.yaml`, kind: Job): what to train, where, and how the pipeline runs.

    apiVersion: rlctl/v1
    kind: Job
    name: demo
    inventory: [../clusters/local.yaml]      # relative to this file
    model: {kind: builtin, name: tiny-demo}
    task: {kind: digits}
    placement: {trainer: {site: local, gpus: 1}, rollout: [{site: local, gpus: 2}]}
    pipeline: {mode: async}

Everything else has defaults; `rlctl plan` fills `gpus: auto`.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from rlctl.config.base import (
    NAME_RE,
    ListenHost,
    Seconds,
    SecondsOrZero,
    Strict,
    check_header,
    read_yaml,
    register_tags,
    validate,
)
from rlctl.config.inventory import Inventory, load_inventory
from rlctl.config.tracking import Tracking
from rlctl.errors import ConfigError
from rlctl.models.catalog import BUILTIN_MODELS, ModelArch
from rlctl.textutil import did_you_mean, one_of

Fraction = Annotated[float, Field(gt=0, lt=1)]
# Bounds no real job reaches, so that a typo (a few extra zeros) is refused instead of hanging `plan`/`check`
# or overflowing a float: published length distributions have σ ≈ 0.5–1.5 and medians of thousands of tokens.
MAX_SIGMA = 4.0
MAX_TOKENS = 2**24  # tokens of one prompt or one output (16.8M: beyond any model's context)
MAX_THREADS = 4096  # CPU threads of one agent (torch.set_num_threads takes an int; no node has more cores)
# A job's iterations: a billion is decades at one a second. Past 2^64 the controller's first message failed (msgpack
# takes no larger int: `OverflowError`, the job failed at its start), and iteration × samples must stay in an int64.
MAX_ITERATIONS = 10**9
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
HangTimeout = Annotated[
    Literal["auto", "never"] | Seconds,
    Field(
        description="how long one busy phase of the agent's loop (a train step, a publish, an engine step, a weight "
        "load; never a wait for work) may run before the agent counts itself hung: it logs every thread's stack "
        "and exits, and the job goes on as for a crash (a unit is replaced; a trainer fails the run, which "
        "checkpoint.auto_resume resumes). auto: 1800 s the first time, then 10 × the phase's longest run so far, "
        "at least 300 s; a number: that many seconds for every phase (at most a week); never: no watch"
    ),
]


class BuiltinModel(Strict):
    kind: Literal["builtin"]
    name: str

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in BUILTIN_MODELS:
            raise ValueError(
                f"unknown built-in model {v!r}; known: {one_of(BUILTIN_MODELS)}{did_you_mean(v, BUILTIN_MODELS)}"
            )
        return v

    @property
    def arch(self) -> ModelArch:
        return BUILTIN_MODELS[self.name]


class ArchModel(Strict):
    """A model described by its architecture only: for planning (`rlctl plan`), not for launching."""

    kind: Literal["arch"]
    name: str
    layers: PositiveInt
    hidden: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt
    vocab: PositiveInt
    intermediate: PositiveInt
    params: PositiveFloat

    @property
    def arch(self) -> ModelArch:
        return ModelArch(
            self.name, self.layers, self.hidden, self.heads, self.kv_heads, self.vocab, self.intermediate, self.params
        )


class HfModel(Strict):
    """A local Hugging Face checkpoint directory (Qwen2 or Llama architecture): config.json, safetensors
    (single or sharded), tokenizer files. `path` is relative to the job file; `load_job` checks the
    directory (rlctl.models.hf.check_hf_dir) and the planner's figures come from its config.json."""

    kind: Literal["hf"]
    path: str
    name: str | None = None

    @field_validator("path")
    @classmethod
    def _a_path(cls, v: str) -> str:
        if not v.strip():  # else read as the job file's own directory, and said to lack config.json
            raise ValueError("the path is empty; give the Hugging Face checkpoint directory (relative to the job file)")
        return v

    @property
    def arch(self) -> ModelArch:
        from rlctl.models.hf import check_hf_dir

        return check_hf_dir(self.path, name=self.name).arch


Model = Annotated[BuiltinModel | ArchModel | HfModel, Field(discriminator="kind")]
register_tags("model", Model)


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


BUILTIN_REWARD_NAMES = ("digits", "exact_match")  # rlctl.rl.reward.BUILTIN_REWARDS' (not imported by the config)
DATA_SUFFIXES = (".jsonl", ".parquet")  # a dataset file's, in any case (rlctl.rl.dataset reads .parquet so)


class DatasetTask(OverlongShaping):
    """Prompts from the user's jsonl or parquet file, scored by a reward function (rlctl/rl/dataset.py, reward.py).

    Rows carry the fields RL users already have (verl's layout): `prompt` (a string or chat messages
    [{role, content}]), the ground truth (`ground_truth`, or verl's nested `reward_model.ground_truth`),
    `data_source`, `extra_info`. `reward` is a built-in (`exact_match`, `digits`) or a user function
    `path/to/file.py:name` / `package.module:name` with verl's signature
    `compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict`.
    """

    kind: Literal["dataset"]
    path: str = Field(description="jsonl or parquet file; relative to the job file")
    prompt_key: str = "prompt"
    answer_key: str | None = Field(
        "ground_truth", description="dotted keys reach nested fields (reward_model.ground_truth); null: none"
    )
    data_source_key: str = "data_source"
    extra_info_key: str = "extra_info"
    template_strings: bool = Field(
        False, description="render string prompts through the chat template, as one user message"
    )
    max_prompt_tokens: Tokens = 1024
    max_output_tokens: Tokens = 1024
    bad_rows: Literal["refuse", "skip"] = "refuse"
    shuffle: bool = True
    shuffle_seed: NonNegativeInt = 0
    reward: str = "exact_match"
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
        recorded = (info.context or {}).get("recorded")
        if self.answer_key is None and self.reward in BUILTIN_REWARD_NAMES and not recorded:  # each None: never met
            raise ValueError(
                f"reward {self.reward!r} compares each output with its row's ground truth, and answer_key is null; "
                "name the field that holds the answers, or a reward of your own (path/to/file.py:function)"
            )
        return self

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


TIS_CAP = 2.0  # truncated importance sampling's default cap on π_prox / μ


OffPolicy = Literal["clip", "decoupled", "tis"]


class OffPolicyCorrection(Strict):
    """How the policy loss corrects samples generated by older weights (rlctl.rl.grpo.policy_loss)."""

    off_policy: OffPolicy = Field(
        "clip",
        description="clip = PPO-clip of π_θ/μ against the behaviour logprobs μ; decoupled = AReaL's decoupled "
        "PPO, each token weighted by π_prox/μ; tis = that weight truncated at is_cap",
    )
    is_cap: PositiveFloat | None = Field(
        None, description=f"cap on the behaviour weight π_prox/μ (tis: default {TIS_CAP}; decoupled: none unless set)"
    )

    @model_validator(mode="after")
    def _cap_needs_a_weight(self) -> OffPolicyCorrection:
        if self.is_cap is not None and self.off_policy == "clip":
            raise ValueError("is_cap caps the behaviour weight of off_policy 'decoupled' or 'tis', not 'clip'")
        return self

    @property
    def behaviour_cap(self) -> float | None:
        """The cap `policy_loss` applies to π_prox / μ."""
        return self.is_cap if self.is_cap is not None or self.off_policy != "tis" else TIS_CAP


LrDecay = Literal["constant", "linear", "cosine"]


class PolicyUpdate(OffPolicyCorrection):
    """The optimizer step and the clip every learner shares (rlctl.rl.learner, rlctl.rl.schedule)."""

    lr: PositiveFloat = 3e-4
    clip_eps: PositiveFloat = 0.2
    clip_eps_high: PositiveFloat | None = Field(
        None, description="upper clip of the ratio, 1 + clip_eps_high (DAPO's clip-higher); default clip_eps"
    )
    grad_clip: PositiveFloat = Field(1.0, description="the whole model's gradient norm is clipped to this")
    weight_decay: Annotated[float, Field(ge=0)] = Field(
        0.0, description="AdamW's decoupled weight decay, on matrices and embeddings (not on biases or norms)"
    )
    lr_warmup_iterations: NonNegativeInt = Field(
        0, description="the learning rate rises linearly to lr over the first this many iterations"
    )
    lr_decay: LrDecay = Field(
        "constant",
        description="after the warm-up: constant, or linear / cosine towards min_lr_ratio × lr at the job's end "
        "(rlctl.rl.schedule)",
    )
    min_lr_ratio: Annotated[float, Field(ge=0, le=1)] | None = Field(
        None, description="the floor linear or cosine decay goes towards, as a fraction of lr (default 0)"
    )

    @model_validator(mode="after")
    def _floor_needs_a_decay(self) -> PolicyUpdate:
        if self.min_lr_ratio is not None and self.lr_decay == "constant":
            raise ValueError(
                "min_lr_ratio is the floor lr_decay 'linear' or 'cosine' decays towards; lr_decay is 'constant'"
            )
        return self

    @property
    def clip_high(self) -> float:
        """The ratio's upper clip is 1 + this."""
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high


class GrpoAlgorithm(PolicyUpdate):
    kind: Literal["grpo"]
    kl_coef: Annotated[float, Field(ge=0)] = 0.0
    temperature: PositiveFloat = 1.0
    advantage_std: bool = Field(
        True, description="divide each group's advantages by its reward std; false: r − group mean (Dr. GRPO)"
    )
    dynamic_sampling: bool = Field(
        False,
        description="DAPO's dynamic sampling: a group whose rewards are all equal (no advantage: it trains nothing) "
        "is dropped once scored and a new prompt's group takes its place, so that every iteration trains "
        "prompts_per_iteration groups with signal; the generation they took is the cost",
    )
    max_refills: Annotated[int, Field(ge=1, le=10**6)] | None = Field(
        None,
        description="dynamic_sampling: groups drawn per iteration in place of dropped ones, at most (default "
        "prompts_per_iteration); past it, groups without signal train as they are (no_signal_frac)",
    )

    @model_validator(mode="after")
    def _refills_need_dynamic_sampling(self) -> GrpoAlgorithm:
        if self.max_refills is not None and not self.dynamic_sampling:
            raise ValueError("max_refills bounds dynamic_sampling's new groups; set dynamic_sampling: true")
        return self


class PpoAlgorithm(PolicyUpdate):
    kind: Literal["ppo"]
    critic_lr: PositiveFloat = 1e-3
    kl_coef: Annotated[float, Field(ge=0)] = 0.0
    gamma: Annotated[float, Field(gt=0, le=1)] = 1.0
    lam: Annotated[float, Field(ge=0, le=1)] = 0.95  # GAE λ: 0 is one-step TD errors, 1 Monte Carlo returns
    temperature: PositiveFloat = 1.0


Algorithm = Annotated[GrpoAlgorithm | PpoAlgorithm, Field(discriminator="kind")]
register_tags("algorithm", Algorithm)


MAX_PROMPTS_PER_ITERATION = 65536
MAX_SAMPLES_PER_PROMPT = 1024
# samples of one iteration: `rlctl plan` simulates each (≈ 30 s at this bound on one core); published runs
# take up to a few tens of thousands
MAX_SAMPLES_PER_ITERATION = 2**17


class Batch(Strict):
    prompts_per_iteration: Annotated[int, Field(gt=0, le=MAX_PROMPTS_PER_ITERATION)] = Field(
        16, description=f"at most {MAX_PROMPTS_PER_ITERATION} (published runs: up to a few thousand)"
    )
    samples_per_prompt: Annotated[int, Field(gt=0, le=MAX_SAMPLES_PER_PROMPT)] = Field(
        8, description=f"the group size; at most {MAX_SAMPLES_PER_PROMPT} (published runs: 4–64)"
    )
    train_micro_batch_samples: PositiveInt = 32
    train_micro_batch_tokens: PositiveInt | None = Field(
        8192, description="padded tokens per micro-batch (rows × longest row); null: rows only"
    )

    @model_validator(mode="after")
    def _samples_bound(self) -> Batch:
        if self.samples_per_iteration > MAX_SAMPLES_PER_ITERATION:
            raise ValueError(
                f"prompts_per_iteration × samples_per_prompt = {self.samples_per_iteration} samples an iteration; "
                f"at most {MAX_SAMPLES_PER_ITERATION} (published runs: up to a few tens of thousands)"
            )
        return self

    @property
    def samples_per_iteration(self) -> int:
        return self.prompts_per_iteration * self.samples_per_prompt


class Pipeline(Strict):
    mode: Literal["sync", "stream", "async"] = "async"
    staleness: NonNegativeInt | None = Field(
        None,
        description="η; default 1 for async, 0 otherwise; at most the job's iterations (iterations − 1 already lets "
        "every iteration be generated from the first weights)",
    )

    @property
    def eta(self) -> int:
        if self.staleness is not None:
            return self.staleness
        return 1 if self.mode == "async" else 0

    @model_validator(mode="after")
    def _bound_fits_mode(self) -> Pipeline:
        if self.mode != "async" and self.staleness not in (None, 0):
            raise ValueError(f"staleness must be 0 in mode {self.mode!r} (only 'async' trains on older samples)")
        return self


GpuCount = PositiveInt | Literal["auto"]


class RolePlacement(Strict):
    site: Annotated[str, Field(pattern=NAME_RE)]
    gpus: GpuCount = "auto"


class Placement(Strict):
    trainer: RolePlacement
    rollout: list[RolePlacement] = Field(min_length=1)
    controller_site: str | None = None

    @property
    def any_auto(self) -> bool:
        """Some GPU count is the planner's to choose (`planning` is read only then)."""
        return self.trainer.gpus == "auto" or any(r.gpus == "auto" for r in self.rollout)


class Rollout(Strict):
    engine: Literal["embedded", "vllm"] = "embedded"
    max_batch_size: PositiveInt = 64
    tensor_parallel: PositiveInt | None = None
    dispatch: Literal["random", "skew_aware", "oracle"] = "skew_aware"
    long_tail_fraction: Fraction = Field(
        0.2,
        description="`rlctl plan` only: the share of units its simulated skew-aware dispatch gives the long tail; "
        "launch dispatches over every unit alike, so `rlctl check` refuses another value",
    )
    threads_per_unit: PositiveInt | None = Field(
        None,
        le=MAX_THREADS,
        description="CPU threads of each unit; default: its site's cores per GPU slot (nodes' cpus) × its GPUs, else 1",
    )
    group_barrier: Literal["auto", "always", "never"] = Field(
        "auto", description="embedded engine: may the next iteration fill rows freed by the previous one's tail"
    )
    partial_report_s: SecondsOrZero = Field(
        1.0,
        description="partial rollouts: seconds between a unit's reports of what its running generations have "
        "produced; a generation whose unit is lost resumes from its last report on another unit instead of "
        "starting over. 0: none by time (see partial_report_steps)",
    )
    partial_report_steps: NonNegativeInt = Field(
        0,
        description="partial rollouts: also report after every this many decode steps (a step adds one token to "
        "each running generation), so a lost unit's generations lose about as many tokens each, however fast it "
        "decodes; costs one message per that many steps of each unit. 0: by partial_report_s alone",
    )
    partial_store_mb: PositiveInt = Field(
        256, description="the controller's memory for partial generations; past it, more are not kept (they restart)"
    )
    compile: bool = Field(
        False,
        description="embedded engine: compile its decode step with torch.compile (fuses the step's small kernels; "
        "each unit's first steps compile, tens of seconds)",
    )
    hang_timeout_s: HangTimeout = "auto"
    quarantine_after: NonNegativeInt = Field(
        2,
        description="a prompt in flight on this many rollout units that were lost (crashed, or ended by "
        "hang_timeout_s) runs alone on a unit from then on; if that unit is lost too, the prompt is quarantined: "
        "set aside, a new prompt drawn in its place (the prompt_quarantined event names it); held-out evaluations "
        "lost with their unit more than this many times in a row stop the evaluation. 0: never",
    )
    on_new_weights: Literal["auto", "recompute", "keep"] = Field(
        "auto",
        description="what a unit's running generations do when a new version arrives: 'recompute' the K/V of "
        "their prompt and output with it before their next token (vllm), or 'keep' the K/V they have (vLLM's "
        "pause_generation(mode='keep'); new requests still never reuse an older version's cached K/V). auto: "
        "recompute on vllm; the embedded engine keeps (it cannot recompute)",
    )
    migrate: bool = Field(
        True,
        description="move work between units: a unit holding more than max_batch_size gives its waiting requests "
        "to one with free rows; an idle unit takes half of a busy one's (running ones resume from their output)",
    )


class Trainer(Strict):
    backend: Literal["torch", "megatron"] = "torch"
    threads_per_rank: PositiveInt | None = Field(
        None,
        le=MAX_THREADS,
        description="CPU threads of each rank; default: its site's cores per GPU slot (nodes' cpus), else 1",
    )
    tensor_parallel: PositiveInt | None = Field(
        None,
        description="ranks that hold shards of one replica ('megatron'); the trainer's GPUs are tp × pp × dp. "
        "Unset: the plan's choice for the trainer's GPU count",
    )
    pipeline_parallel: PositiveInt | None = Field(
        None,
        description="pipeline stages per replica ('megatron': GPipe within each learner cut, the cut's rows in "
        "chunks that overlap across the stages); must divide the model's layers. Unset: the plan's choice",
    )

    shard: Literal["auto", "fsdp", "none"] = Field(
        "auto",
        description="'torch': shard the parameters, gradients and AdamW state over the trainer's ranks with FSDP2. "
        "auto: where a whole replica (16 bytes per parameter) does not fit one GPU of the trainer's site, as the "
        "planner prices it",
    )
    activation_checkpointing: bool = Field(
        False, description="'torch': recompute each layer's activations in backward (less memory, ~1/3 more compute)"
    )
    hang_timeout_s: HangTimeout = "auto"
    skip_nonfinite: NonNegativeInt = Field(
        3,
        description="an optimizer step whose gradient norm is NaN or infinite is skipped (the weights and the "
        "optimizer state stay; the iteration's samples count as trained and its version holds the same weights); "
        "more than this many in a row fail the run, naming them. 0: the first fails it",
    )

    @property
    def split_field(self) -> str:
        """The field a refusal of the job's split as a whole names: the one the job sets (tensor_parallel of both)."""
        return "trainer.tensor_parallel" if self.tensor_parallel is not None else "trainer.pipeline_parallel"

    @property
    def model_split(self) -> tuple[int, int] | None:
        """(tp, pp) the job asks for, or None when it leaves both to the plan."""
        if self.tensor_parallel is None and self.pipeline_parallel is None:
            return None
        return self.tensor_parallel or 1, self.pipeline_parallel or 1


class Transport(Strict):
    kind: Literal["tcp", "ucx", "inproc"] = "tcp"
    listen_host: ListenHost = Field(
        "127.0.0.1",
        description="address agents bind and advertise unless their site's network.listen_host says "
        "otherwise: an IP address, a host name, or `auto` = the interface that routes toward the controller",
    )
    streams: PositiveInt = 1
    encrypt: bool = Field(
        False,
        description="encrypt every connection's messages, headers and frames (AES-256-GCM under per-connection "
        "keys from the handshake): for links you do not trust, e.g. between datacenters; tcp only",
    )
    timeout_s: Seconds = 30.0
    unreachable_timeout_s: Seconds = Field(
        300.0,
        description="how long the job waits for an agent it cannot reach (silent for 15 s: its site's link is down) "
        "before counting it lost; meanwhile its work goes to the others, or the job pauses; an agent waits as long "
        "for a silent controller",
    )


class WeightSync(Strict):
    mode: Literal["full", "delta"] = "full"
    anchor_every: PositiveInt | None = Field(
        None,
        description="delta mode: send a full anchor every K versions (K past the job's iterations sends none: "
        "`rlctl check` warns of it); unset (default) = full copies only on demand (a unit joins, a job resumes, a "
        "verification fails), every other version as a delta",
    )
    # at most a bucket (64 MiB, `rlctl.weights.versions.WeightSyncConfig`): a chunk never spans two
    chunk_bytes: int = Field(4 * 1024 * 1024, gt=0, le=64 * 1024 * 1024)
    chains_per_datacenter: PositiveInt = Field(
        2,
        description="chains the relay of a datacenter feeds with each version (one copy crosses each inter-DC "
        "link, then it splits): a slow rollout unit holds back only the units below it in its own chain",
    )


class Metrics(Strict):
    port: Annotated[int, Field(ge=0, le=65535)] = 0  # 0 = pick a free port


class Checkpoint(Strict):
    every_iterations: NonNegativeInt = 20  # 0 = only at the end
    keep: NonNegativeInt = Field(
        0,
        description="complete checkpoints kept on each site: once a newer one is complete the older are removed "
        "(each part by the agent that wrote it); the newest complete one never is. It bounds checkpoints/abandoned/ "
        "too (the sealed checkpoints a resume passed over): the K set aside last are kept there, older ones removed; "
        "a part never sealed is removed at once. 0 = keep every checkpoint",
    )
    auto_resume: NonNegativeInt = Field(
        0,
        le=1000,
        description="a run that fails (its trainer lost, its controller gone) after completing a checkpoint newer "
        "than the one it started from is resumed from it by its launcher, at most this many times (a run ended by "
        "its SLURM site's time_limit_min is resumed too, and spends none); a stop, and a run that completed no newer "
        "checkpoint (it would fail the same way again), are not. 0 = never",
    )


DEMO_SFT_STEPS = 800  # the built-in model's warm-up when the job sets none


class Warmup(Strict):
    """SFT warm-up before RL (cached on disk): the built-in demo model must first learn the digits task's format.
    A Hugging Face checkpoint starts RL from its own weights: the warm-up is the built-in model's only."""

    sft_steps: NonNegativeInt | None = Field(
        None,
        description=f"SFT steps of the built-in model on the digits task before RL (default {DEMO_SFT_STEPS} there, "
        "0 for any other model or task); 0 = start RL from the randomly initialised built-in model",
    )


class Evaluation(Strict):
    """After the last iteration, `rlctl launch` decodes held-out prompts greedily with the starting policy
    (model/init) and the final checkpoint and adds the figures to the summary as `heldout`
    (rlctl.rl.evaluate): sampled reward alone also rises when the policy only sharpens. The digits task draws
    prompts no iteration draws; a dataset task reads the first `heldout_prompts` rows of `path` (its own file,
    with the task's keys, scored by the task's reward). With `every_iterations` the same prompts are decoded
    during the run too, on a rollout unit beside its work (rlctl.agents.evaluation): a curve to watch."""

    # 0 = no evaluation; at most an iteration's prompts' bound (they are decoded on one unit, twice, at the end)
    heldout_prompts: Annotated[int, Field(ge=0, le=MAX_PROMPTS_PER_ITERATION)] = 0
    every_iterations: NonNegativeInt = Field(
        0,
        description="also evaluate during the run: versions 0, K, 2K, … and the last, greedily on a rollout unit "
        "(evaluations.jsonl, trackers eval/*, rlctl status); 0 = only after the job",
    )
    path: str | None = Field(
        None, description="dataset tasks: the held-out jsonl or parquet file, relative to the job file"
    )

    @field_validator("path")
    @classmethod
    def _format(cls, v: str | None) -> str | None:
        if v is not None and not v.lower().endswith(DATA_SUFFIXES):
            raise ValueError(f"unsupported file {v!r}; use a .jsonl or .parquet file")
        return v


class Rebalance(Strict):
    """StreamRL §4.2 dynamic adjustment: add one rollout DP unit when δ = T_gen − T_train ≥ δ'.

    δ is the median over the last `window_iterations` (where iterations overlap, pipeline.staleness η > 0, T_gen is
    the iteration's period and δ the trainer's wait for samples; at η = 0, async included, the stage times:
    rlctl.agents.rebalance); after a change the rule waits
    `cooldown_iterations` so the new unit's effect is measured before the next decision. Units are
    only added automatically (removal is `rlctl scale -N`), so the rule cannot oscillate.
    """

    auto: bool = False
    window_iterations: PositiveInt = 3
    cooldown_iterations: PositiveInt = 3
    # the most units the rule and `rlctl scale` may reach; default: as many as the rollout sites' free GPUs allow
    max_rollout_units: PositiveInt | None = None


class Planning(Strict):
    """How `plan` chooses among candidate allocations (StreamRL Alg. 1 and 2)."""

    rule: Literal["simulated", "paper", "fewest_gpus"] = Field(
        "simulated",
        description="simulated: for an async job the job simulator decides (its iterations overlapping in each "
        "unit's engine): a trainer sharing its site with rollout (GPU counts auto) gets the fastest split; across "
        "datacenters each stage whose count is auto keeps the fewest GPUs within 1% of the full allocation's "
        "iteration; other jobs as paper. paper: StreamRL's Algorithm 1 on the stage curves. fewest_gpus: fewest "
        "GPUs within epsilon",
    )
    epsilon: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.05,
        description="rule fewest_gpus: the slowdown allowed against the full allocation; rule simulated: one start of "
        "its search of a shared site's split; otherwise it sizes only `rlctl plan`'s printed `fewest_gpus` "
        "alternative, and `rlctl check` refuses another value (as it refuses `planning` when no GPU count is auto)",
    )
    profile: str | None = Field(
        None,
        description="a profile file from `rlctl profile -o` (relative to the job file): `rlctl plan`, `check` and "
        "`launch` price the job with it (its GPU counts when auto, the plan's predictions, the runtime's migration "
        "costs) instead of the analytical profile of the inventory's GPU specs; `rlctl plan --profile` overrides it",
    )
    dispatch_rule: Literal["sum", "max"] = Field(
        "max",
        description="`rlctl plan` only: the cost model of its simulated dispatch (not of the allocation); "
        "launch dispatches without it, so `rlctl check` refuses another value",
    )


class JobFile(Strict):
    api_version: str = Field(alias="apiVersion")
    kind: Literal["Job"]
    name: Annotated[str, Field(pattern=NAME_RE)]
    inventory: list[str] = Field(min_length=1)
    model: Model
    task: Task
    placement: Placement
    algorithm: Algorithm = GrpoAlgorithm(kind="grpo")
    iterations: Annotated[int, Field(gt=0, le=MAX_ITERATIONS)] = 100
    batch: Batch = Batch()
    pipeline: Pipeline = Pipeline()
    rollout: Rollout = Rollout()
    trainer: Trainer = Trainer()
    transport: Transport = Transport()
    weight_sync: WeightSync = WeightSync()
    metrics: Metrics = Metrics()
    checkpoint: Checkpoint = Checkpoint()
    planning: Planning = Planning()
    rebalance: Rebalance = Rebalance()
    warmup: Warmup = Warmup()
    evaluation: Evaluation = Evaluation()
    tracking: Tracking = Tracking()
    job_dir: str | None = Field(
        None,
        min_length=1,
        description="where the job's directory goes, relative to the job file as its other paths are; default: "
        "runs/<name>-<time> in the directory rlctl is run from ($RLCTL_HOME/runs/<name>-<time> when RLCTL_HOME is "
        "set), not the job file's; `launch --job-dir` overrides it",
    )
    # below 2^32: vLLM seeds numpy's global generator with it, which takes no more
    seed: int = Field(0, ge=0, le=2**32 - 1)


def sft_steps(spec: JobFile) -> int:
    """The SFT warm-up steps the launch runs: the job's `warmup.sft_steps`, else the built-in model's default on the
    digits task and none for any other (a Hugging Face model, a dataset task: `rlctl check` refuses a non-zero value
    set for them)."""
    if spec.warmup.sft_steps is not None:
        return spec.warmup.sft_steps
    return DEMO_SFT_STEPS if spec.model.kind == "builtin" and isinstance(spec.task, DigitsTask) else 0


def refills(spec: JobFile) -> int:
    """Groups the controller may draw per iteration in place of dropped ones (dynamic sampling; 0: off)."""
    algo = spec.algorithm
    if not isinstance(algo, GrpoAlgorithm) or not algo.dynamic_sampling:
        return 0
    return algo.max_refills if algo.max_refills is not None else spec.batch.prompts_per_iteration


class Job:
    """A validated job together with the inventory it runs on."""

    def __init__(
        self, spec: JobFile, inventory: Inventory, path: Path, *, mapping: dict[str, Any] | None = None
    ) -> None:
        self.spec = spec
        self.inventory = inventory
        self.path = path
        self.mapping = mapping  # the job file's mapping as it was read (as JSON reads it back): what a resume compares

    @property
    def name(self) -> str:
        return self.spec.name


def _home_expanded(spec: JobFile) -> JobFile:
    """The dataset task's data and reward files and the held-out file with a leading `~` expanded, as model.path,
    inventory, job_dir and planning.profile are (each is read relative to the job file: `~/data/train.jsonl` was
    refused as no such file, `~` taken for a directory beside the job file)."""
    task, evaluation = spec.task, spec.evaluation
    if isinstance(task, DatasetTask):
        target, sep, name = task.reward.rpartition(":")
        reward = f"{os.path.expanduser(target)}:{name}" if sep else task.reward
        task = task.model_copy(update={"path": os.path.expanduser(task.path), "reward": reward})
    if evaluation.path is not None:
        evaluation = evaluation.model_copy(update={"path": os.path.expanduser(evaluation.path)})
    return spec.model_copy(update={"task": task, "evaluation": evaluation})


def load_job(path: Path, *, profile_must_exist: bool = True) -> Job:
    """The job file at `path`, validated, with the inventories it names; its paths resolved against it.
    `profile_must_exist=False`: a `planning.profile` not written yet is resolved but not refused (`rlctl profile` is
    what writes it, and `rlctl plan --profile` prices the job with another)."""
    data = read_yaml(path)
    check_header(path, data, "Job")
    spec = _home_expanded(validate(path, data, JobFile))
    inv_paths = [Path(os.path.normpath(path.parent / os.path.expanduser(p))) for p in spec.inventory]  # as model.path
    for i, p in enumerate(inv_paths):
        try:
            p.stat()
        except (FileNotFoundError, NotADirectoryError) as e:
            raise ConfigError(
                str(path), f"inventory[{i}]", f"no such file {str(p)!r} (paths are relative to the job file)"
            ) from e
        except OSError as e:  # e.g. a directory on the way this user may not enter
            raise ConfigError(str(path), f"inventory[{i}]", f"cannot read {str(p)!r}: {e.strerror or e}") from e
        if p.is_dir():  # read_yaml would name the directory alone ('' is the job file's own: 'jobs: is a directory')
            raise ConfigError(
                str(path),
                f"inventory[{i}]",
                f"{str(p)!r} is a directory; give an inventory file (relative to the job file)",
            )
        # else each of its sites was said to be defined twice, in that one file (or the file 'given twice', by a link)
        if (same := next((j for j, q in enumerate(inv_paths[:i]) if q.resolve() == p.resolve()), None)) is not None:
            raise ConfigError(
                str(path),
                f"inventory[{i}]",
                f"{str(p)!r} is inventory[{same}] too; list each inventory file once",
            )
    inventory = load_inventory(inv_paths)
    if isinstance(spec.model, HfModel):  # resolve against the job file, check it once, here
        from rlctl.models.hf import check_hf_dir

        model_dir = Path(os.path.normpath(path.parent / os.path.expanduser(spec.model.path)))
        try:
            check_hf_dir(model_dir, name=spec.model.name)
        except ConfigError as e:
            from rlctl.models.hf import hub_id_hint

            hint = hub_id_hint(spec.model.path, model_dir)
            raise ConfigError(str(path), "model.path", str(e), hint=hint) from e
        except OSError as e:  # e.g. a directory this user may not read
            raise ConfigError(str(path), "model.path", f"cannot read {str(model_dir)!r}: {e.strerror or e}") from e
        spec = spec.model_copy(update={"model": spec.model.model_copy(update={"path": str(model_dir)})})
    if (profile := spec.planning.profile) is not None:  # resolved against the job file, as model.path
        where = Path(os.path.normpath(path.absolute().parent / os.path.expanduser(profile)))
        if profile_must_exist and not where.is_file():
            why = "not a file" if where.exists() else "no such file"
            raise ConfigError(
                str(path),
                "planning.profile",
                f"{why} {str(where)!r} (paths are relative to the job file)",
                hint=f"write it with `rlctl profile --job {shlex.quote(str(path))} -o {shlex.quote(str(where))}`",
            )
        spec = spec.model_copy(update={"planning": spec.planning.model_copy(update={"profile": str(where)})})
    roles = [("placement.trainer", spec.placement.trainer)] + [
        (f"placement.rollout[{i}]", r) for i, r in enumerate(spec.placement.rollout)
    ]
    for field, role in roles:
        if role.site not in inventory.sites:
            raise ConfigError(
                str(path),
                f"{field}.site",
                f"unknown site {role.site!r}; known: {one_of(inventory.sites)}"
                + did_you_mean(role.site, inventory.sites),
            )
        if role.gpus != "auto" and role.gpus > inventory.sites[role.site].total_gpus:
            raise ConfigError(
                str(path),
                f"{field}.gpus",
                f"{role.gpus} GPUs asked but site {role.site!r} has {inventory.sites[role.site].total_gpus}",
            )
    if isinstance(spec.algorithm, GrpoAlgorithm) and spec.batch.samples_per_prompt < 2:
        raise ConfigError(
            str(path),
            "batch.samples_per_prompt",
            "GRPO's advantage compares a prompt's samples with each other: a group of 1 has advantage 0 and trains "
            "nothing; use 2 or more (or algorithm.kind 'ppo')",
        )
    eta = spec.pipeline.staleness
    if eta is not None and eta > spec.iterations:  # a typo's extra zeros: refused, not planned or buffered
        raise ConfigError(
            str(path),
            "pipeline.staleness",
            f"{eta} is more than the job's {spec.iterations} iterations; use at most {spec.iterations} (a bound of "
            f"{max(spec.iterations - 1, 0)} already lets every iteration be generated from the first weights)",
        )
    sites = [r.site for r in spec.placement.rollout]
    if len(set(sites)) != len(sites):
        raise ConfigError(str(path), "placement.rollout", "each rollout site may appear once")
    cs = spec.placement.controller_site
    if cs is not None and cs not in inventory.sites:
        raise ConfigError(
            str(path), "placement.controller_site", f"unknown site {cs!r}; known: {one_of(inventory.sites)}"
        )
    if spec.job_dir is not None:  # like every path of the job file: the same job dir from wherever it is launched
        job_dir = os.path.normpath(path.absolute().parent / os.path.expanduser(spec.job_dir))
        spec = spec.model_copy(update={"job_dir": job_dir})
    return Job(spec, inventory, path, mapping=json.loads(json.dumps(data, default=str)))
