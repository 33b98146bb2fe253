"""The job file's `tracking:` section: which experiment trackers get every iteration's metrics.

    tracking: [tensorboard, wandb]                                 # W&B offline: no server, no login
    tracking: {backends: [wandb], project: my-proj, mode: online}  # the user's own W&B login

It lives here, not beside the trackers in `rlctl/tracking.py`, so that `config/job.py` can import it
without a cycle (`rlctl.tracking` → `rlctl.config` → `job.py` → `rlctl.tracking`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rlctl.config.base import Strict
from rlctl.textutil import did_you_mean, one_of

Backend = Literal["tensorboard", "wandb"]
Mode = Literal["offline", "online"]
BACKENDS = ("tensorboard", "wandb")


class Tracking(Strict):
    """`tracking:` in a job file: the backends that get every iteration's metrics."""

    backends: list[Backend] = Field(default_factory=list)
    project: str | None = None  # W&B project; default "rlctl"
    mode: Mode = "offline"  # W&B: offline writes the run under the job dir; online needs the user's login

    @model_validator(mode="before")
    @classmethod
    def _list_form(cls, data: Any) -> Any:
        """`tracking: [tensorboard, wandb]` (or one name) is short for `tracking: {backends: [...]}`."""
        if isinstance(data, str):
            return {"backends": [data]}
        if isinstance(data, list):
            return {"backends": data}
        return data

    @field_validator("backends", mode="before")
    @classmethod
    def _known_backends(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        for name in value:
            if name not in BACKENDS:
                raise ValueError(
                    f"unknown tracking backend {name!r}; valid: {one_of(BACKENDS)}{did_you_mean(str(name), BACKENDS)}"
                )
        if len(set(value)) != len(value):
            raise ValueError(f"each tracking backend may appear once, got {value}")
        return value
