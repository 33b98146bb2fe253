"""What a job does around its RL iterations: checkpoints, the SFT warm-up before, held-out evaluation."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeInt, field_validator

from rlctl.config.base import Strict
from rlctl.config.pipeline import MAX_PROMPTS_PER_ITERATION
from rlctl.config.task import DATA_SUFFIXES


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
    with the task's keys, scored by the task's reward), or every row with `heldout_prompts: all`. With
    `every_iterations` the same prompts are decoded during the run too, on a rollout unit beside its work
    (rlctl.agents.evaluation): a curve to watch."""

    # 0 = no evaluation; at most an iteration's prompts' bound (they are decoded on one unit, twice, at the end);
    # "all": every row of a dataset task's held-out file (check refuses one of more rows than that bound)
    heldout_prompts: Annotated[int, Field(ge=0, le=MAX_PROMPTS_PER_ITERATION)] | Literal["all"] = 0
    every_iterations: NonNegativeInt = Field(
        0,
        description="also evaluate during the run: versions 0, K, 2K, … and the last, greedily on a rollout unit "
        "(evaluations.jsonl, trackers eval/*, rlctl status); 0 = only after the job",
    )
    path: str | None = Field(
        None, description="dataset tasks: the held-out jsonl or parquet file, relative to the job file"
    )

    @property
    def most_prompts(self) -> int:
        """The most held-out prompts evaluated: the number asked, or for `all` the bound (a file's rows cap either)."""
        return MAX_PROMPTS_PER_ITERATION if self.heldout_prompts == "all" else self.heldout_prompts

    @field_validator("path")
    @classmethod
    def _format(cls, v: str | None) -> str | None:
        if v is not None and not v.lower().endswith(DATA_SUFFIXES):
            raise ValueError(f"unsupported file {v!r}; use a .jsonl or .parquet file")
        return v
