"""The dynamic-adjustment rule (StreamRL §4.2): add one rollout DP unit when δ ≥ δ'.

    δ  = T_gen − T_train, the median over the last `window_iterations` iterations
    δ' = the generation time one more unit saves.  With N balanced DP units T_gen(N) ≈ W/N, so
         T_gen(N) − T_gen(N+1) = T_gen(N) / (N + 1)   — from the *measured* T_gen of the current
         workload (its lengths may have grown since planning), not from the plan's profile.

    iteration rows ──▶ window since the last change ──(≥ window and ≥ cooldown rows)──▶ δ ≥ δ'? ──▶ add

What T_gen and T_train are depends on whether iterations overlap (`Scaler.rebalance` passes them, by η =
pipeline.staleness, not the mode). At η = 0 (sync and stream mode, and async with `staleness: 0`) they are the stage
times: the iteration's generation makespan and the trainer's step. At η > 0 a
round's samples are dispatched up to η iterations ahead and wait in the engines behind the current one, so the
makespan counts that wait and exceeds the generation's time per iteration even when the units keep up (measured:
with 2 units on this 2-core machine the makespan rule asked for a third in 27 of 28 windows while the trainer waited
≈ 0 s in most iterations). There T_gen is the iteration's period (trained to trained) and T_train the trainer's busy
time in it, so δ is the time the trainer waited for samples, and δ' = period / (N + 1) is what one more unit saves
when generation sets the pace. The median, not the mean: one slow iteration (a long sample's decode, which more
units would not shorten) does not add a unit.

An iteration whose generation shared the units with a held-out evaluation (`evaluation.every_iterations`) is not
measured: the evaluation's decoding is not the workload's, and one more unit would not be needed for it. Past
`window_iterations` such iterations in a row the evaluations are the workload (they overlap every iteration), and
the rule measures again.

Only scale-out is automatic; removal is the operator's (`rlctl scale -N`). After a change the window
restarts, so the next decision sees only iterations run with the new unit count: the rule cannot
add twice on the same evidence, and with no automatic removal it cannot oscillate.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from rlctl.config.pipeline import Rebalance


@dataclass(frozen=True)
class Reading:
    iteration: int
    delta_s: float  # windowed δ
    delta_prime_s: float  # δ' for the current unit count
    units: int
    add: bool
    why: str


def delta_prime(t_gen_s: float, units: int) -> float:
    """Generation time saved by one more unit when `units` balanced units take `t_gen_s`."""
    return t_gen_s / (units + 1)


@dataclass
class RebalanceRule:
    cfg: Rebalance
    window: list[tuple[float, float]] = field(default_factory=list)  # (t_gen, t_train) since the last change
    skipped: int = 0  # iterations beside an evaluation in a row (not measured, up to window_iterations)

    def observe(
        self,
        iteration: int,
        *,
        t_gen_s: float,
        t_train_s: float,
        units: int,
        blocked: str | None = None,
        evaluating: bool = False,
    ) -> Reading:
        """One trained iteration; says whether to add a unit now (the caller then calls `changed`). `blocked`: why
        no unit can be added (no free slot, the job's cap), None if one can. `evaluating`: a held-out evaluation
        decoded beside its generation (left out of the window)."""
        self.skipped = self.skipped + 1 if evaluating else 0
        measured = not 0 < self.skipped <= self.cfg.window_iterations
        if measured:
            self.window.append((t_gen_s, t_train_s))
            del self.window[: -max(self.cfg.window_iterations, self.cfg.cooldown_iterations)]  # all any check reads
        recent = self.window[-self.cfg.window_iterations :] or [(t_gen_s, t_train_s)]  # (none measured yet)
        gen = statistics.median(g for g, _ in recent)
        delta = statistics.median(g - t for g, t in recent)
        dprime = delta_prime(gen, units)
        if not measured:
            why = "a held-out evaluation decoded beside this iteration: not measured"
            return Reading(iteration, delta, dprime, units, False, why)
        if not self.cfg.auto:
            return Reading(iteration, delta, dprime, units, False, "automatic rebalancing is off")
        if len(self.window) < max(self.cfg.window_iterations, self.cfg.cooldown_iterations):
            return Reading(iteration, delta, dprime, units, False, "measuring since the last change")
        if delta < dprime:
            return Reading(iteration, delta, dprime, units, False, "δ < δ'")
        if blocked is not None:
            return Reading(iteration, delta, dprime, units, False, f"δ ≥ δ' but {blocked}")
        return Reading(iteration, delta, dprime, units, True, "δ ≥ δ'")

    def changed(self) -> None:
        """The unit count changed (by this rule or by the operator): measure afresh."""
        self.window.clear()
