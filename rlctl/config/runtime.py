"""How a job's agents run: the rollout units, the trainer, the transport, weight sync and metrics."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, field_validator

from rlctl.config.base import MAX_THREADS, ListenHost, Seconds, SecondsOrZero, Strict
from rlctl.textutil import did_you_mean

Fraction = Annotated[float, Field(gt=0, lt=1)]
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


class Rollout(Strict):
    engine: Literal["embedded", "vllm"] = "embedded"
    max_batch_size: PositiveInt = 64
    tensor_parallel: PositiveInt | None = None
    dispatch: Literal["random", "skew_aware", "oracle"] = "skew_aware"
    long_tail_fraction: Fraction = Field(
        0.2,
        description="`rlctl plan` only: the share of a batch's samples, the predicted longest, that its simulated "
        "skew-aware dispatch gives the long-tail units (Algorithm 2's α); "
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


# the projections of a decoder layer a LoRA adapter may sit on (PEFT's names; all-linear is all of them: PEFT's
# all-linear leaves the output layer out too)
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class Lora(Strict):
    """LoRA (`rlctl.models.lora`): the policy's weights frozen, a low-rank update trained on each target projection
    of every decoder layer; the optimizer holds the adapters alone. Rollout engines and checkpoints' HF directories
    get the merged weights W + alpha/rank · B·A. The `torch` backend's (a Qwen MoE's experts and shared expert adapted
    each on its own, its routers never)."""

    rank: PositiveInt = Field(le=4096, description="the adapters' rank r: A is [r, in], B [out, r]")
    alpha: PositiveFloat = Field(description="the update's scale is alpha / rank (PEFT's lora_alpha)")
    target_modules: list[str] | str = Field(
        "all-linear",
        description="the projections adapted, of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; "
        "all-linear: all seven (the output layer never)",
    )
    dropout: NonNegativeFloat = Field(0.0, description="dropout on an adapter's input; only 0 is implemented")

    @field_validator("target_modules")
    @classmethod
    def _known(cls, v: list[str] | str) -> list[str] | str:
        if isinstance(v, str):
            if v != "all-linear":
                raise ValueError(f"{v!r}: valid: 'all-linear', or a list of {', '.join(TARGETS)}")
            return v
        if not v:
            raise ValueError(f"empty; give some of {', '.join(TARGETS)}, or 'all-linear'")
        for name in v:
            if name not in TARGETS:
                hint = did_you_mean(name, TARGETS)
                raise ValueError(f"unknown projection {name!r}; valid: {', '.join(TARGETS)}, or 'all-linear'{hint}")
        if len(set(v)) < len(v):
            raise ValueError(f"{v}: a projection named twice; name each once")
        return v

    @field_validator("dropout")
    @classmethod
    def _no_dropout(cls, v: float) -> float:
        if v != 0:
            raise ValueError(f"{v}: adapter dropout is not implemented; valid: 0")
        return v

    @property
    def targets(self) -> tuple[str, ...]:
        return TARGETS if self.target_modules == "all-linear" else tuple(self.target_modules)


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
    lora: Lora | None = Field(
        None, description="train LoRA adapters instead of the whole policy (`Lora`); unset: every weight is trained"
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
