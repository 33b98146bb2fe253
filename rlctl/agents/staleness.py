"""The staleness rule (StaleFlow, DESIGN §5): the one place that says which version gaps are allowed.

Every sample carries the policy version it was generated with. The trainer trains iteration `i`
with weights of version `i` (one optimizer step per iteration, so `trainer_version == iteration`)
and must never train on a sample whose version is more than η behind:

    trainer_version − sample_version ≤ η          (η = 0 sync/stream, 1 async)

The controller enforces it twice: at dispatch (a rollout unit at version `w` only receives prompts of
iterations `i ≤ w + η`, so whatever it generates is fresh enough — versions only grow), and at
delivery (a finished sample that would break the rule is re-queued instead of delivered).

    iteration i ──dispatch──▶ unit at version w ≥ i−η ──sample(v ≥ w)──▶ deliver when trainer at i
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StalenessBound:
    eta: int

    def __post_init__(self) -> None:
        if self.eta < 0:
            raise ValueError(f"staleness bound must be ≥ 0, got {self.eta}")

    def may_dispatch(self, *, iteration: int, unit_version: int) -> bool:
        """May a rollout unit holding weights `unit_version` generate samples for `iteration`?"""
        return iteration - unit_version <= self.eta

    def may_train(self, *, trainer_version: int, sample_version: int) -> bool:
        """May the trainer at `trainer_version` train on a sample generated with `sample_version`?"""
        return trainer_version - sample_version <= self.eta

    def newest_dispatchable(self, unit_version: int) -> int:
        """The last iteration a unit at `unit_version` may work on."""
        return unit_version + self.eta
