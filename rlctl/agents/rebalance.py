"""The dynamic-adjustment rule (StreamRL §4.2): add one rollout DP unit when δ ≥ δ'.

    δ  = T_gen − T_train, averaged over the last `window_iterations` iterations
    δ' = the generation time one more unit saves.  With N balanced DP units T_gen(N) ≈ W/N, so
         T_gen(N) − T_gen(N+1) = T_gen(N) / (N + 1)   — from the *measured* T_gen of the current
         workload (its lengths may have grown since planning), not from the plan's profile.

    iteration rows ──▶ window since the last change ──(≥ window and ≥ cooldown rows)──▶ δ ≥ δ'? ──▶ add

An iteration whose generation shared the units with a held-out evaluation (`evaluation.every_iterations`) is not
measured: the evaluation's decoding is not the workload's, and one more unit would not be needed for it. Past
`window_iterations` such iterations in a row the evaluations are the workload (they overlap every iteration), and
the rule measures again.

Only scale-out is automatic; removal is the operator's (`rlctl scale -N`). After a change the window
restarts, so the next decision sees only iterations run with the new unit count: the rule cannot
add twice on the same evidence, and with no automatic removal it cannot oscillate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlctl.config.job import Rebalance


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
        self, iteration: int, *, t_gen_s: float, t_train_s: float, units: int, can_add: bool, evaluating: bool = False
    ) -> Reading:
        """One trained iteration; says whether to add a unit now (the caller then calls `changed`). `evaluating`:
        a held-out evaluation decoded beside its generation (left out of the window)."""
        self.skipped = self.skipped + 1 if evaluating else 0
        measured = not 0 < self.skipped <= self.cfg.window_iterations
        if measured:
            self.window.append((t_gen_s, t_train_s))
            del self.window[: -max(self.cfg.window_iterations, self.cfg.cooldown_iterations)]  # all any check reads
        recent = self.window[-self.cfg.window_iterations :] or [(t_gen_s, t_train_s)]  # (none measured yet)
        gen = sum(g for g, _ in recent) / len(recent)
        delta = sum(g - t for g, t in recent) / len(recent)
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
        if not can_add:
            return Reading(iteration, delta, dprime, units, False, "δ ≥ δ' but no free GPU slot on a rollout site")
        return Reading(iteration, delta, dprime, units, True, "δ ≥ δ'")

    def changed(self) -> None:
        """The unit count changed (by this rule or by the operator): measure afresh."""
        self.window.clear()
