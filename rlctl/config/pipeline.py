"""How a job's work is batched, pipelined (staleness), placed on sites, planned and rebalanced."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from rlctl.config.base import NAME_RE, Strict

MAX_PROMPTS_PER_ITERATION = 65536
MAX_SAMPLES_PER_PROMPT = 1024
# samples of one iteration: `rlctl plan` simulates each (≈ 30 s at this bound on one core); published runs
# take up to a few tens of thousands
MAX_SAMPLES_PER_ITERATION = 2**17
# Rounds are created up to η ahead of the trainer, and no more than this many samples' worth ahead: a bound of
# thousands (a job that means "as stale as it likes") made every round at once, each sample ≈ 1.5 kB of the
# controller's memory and a request queued in a unit's engine. At 2,048 samples a round that is 128 rounds ahead.
# A job file's staleness past it is refused (`load_job`); a record of an older launch runs at `rounds_ahead`.
MAX_SAMPLES_AHEAD = 262_144


def rounds_ahead(eta: int, samples_per_round: int, *, max_samples_ahead: int | None = None) -> int:
    """How many rounds past the trainer's version the controller creates (and the planner prices): η, or fewer where
    η rounds would hold more than `max_samples_ahead` samples (default MAX_SAMPLES_AHEAD; at least 1: the next
    round)."""
    most = MAX_SAMPLES_AHEAD if max_samples_ahead is None else max_samples_ahead
    return min(eta, max(1, most // max(samples_per_round, 1)))


class Batch(Strict):
    prompts_per_iteration: Annotated[int, Field(gt=0, le=MAX_PROMPTS_PER_ITERATION)] = Field(
        16, description=f"at most {MAX_PROMPTS_PER_ITERATION} (published runs: up to a few thousand)"
    )
    samples_per_prompt: Annotated[int, Field(gt=0, le=MAX_SAMPLES_PER_PROMPT)] = Field(
        8, description=f"the group size; at most {MAX_SAMPLES_PER_PROMPT} (published runs: 4–64)"
    )
    train_micro_batch_samples: PositiveInt = Field(
        32, description="rows per micro-batch on each data-parallel rank (a cut over dp ranks holds dp × as many)"
    )
    train_micro_batch_tokens: PositiveInt | None = Field(
        8192,
        description="padded tokens per micro-batch on each data-parallel rank (its rows × its longest row; a longer "
        "row alone); null: rows only",
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
        f"every iteration be generated from the first weights), and at most {MAX_SAMPLES_AHEAD:,} samples' worth of "
        "iterations (the rounds the controller creates ahead of the trainer)",
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
