"""The plan's dispatch report: Algorithm 2 on the rollout site with the most units, both rules × three cost
models, each split simulated on the true lengths, and which rule's estimate came closer."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlctl.planner.dispatch import Rule, SkewSplit, fixed_split
from rlctl.planner.sim import (
    DispatchConfig,
    Estimate,
    GenResult,
    Unit,
    simulate_split,
    site_split,
)
from rlctl.planner.workload import LengthModel


def dispatch_report(
    lm: LengthModel,
    units: list[Unit],
    all_lengths: np.ndarray,
    all_pred: np.ndarray,
    dcfg: DispatchConfig,
    gen: GenResult,
) -> dict[str, Any]:
    """Algorithm 2 on the rollout site with the most units (its share of the first simulated batch): both rules ×
    three cost models (Eq. 2 with P90/P50, Eq. 2 with group means + critical path, the simulator),
    each split simulated on the true lengths; identical splits are simulated once."""
    # the most units; of equal counts the first in the placement (`units` follow it), whatever the hash seed
    site = max(dict.fromkeys(u.site for u in units), key=lambda s: sum(u.site == s for u in units))
    site_idx = [u for u, unit in enumerate(units) if unit.site == site]
    mine = np.isin(gen.unit_of, site_idx)
    lengths, pred = all_lengths[mine], all_pred[mine]
    cost = units[site_idx[0]].cost
    n_units = len(site_idx)
    table: dict[str, dict[str, Any]] = {}
    simulated: dict[tuple[int, int, int], float] = {}

    def sim_of(sp: SkewSplit) -> float:
        key = (sp.num_long, sp.long_batch, sp.regular_batch)
        if key not in simulated:
            simulated[key] = simulate_split(lengths, pred, cost, sp, prompt_tokens=lm.prompt_tokens)
        return simulated[key]

    combos: list[tuple[Rule, Estimate]] = [
        ("sum", "quantile"),
        ("max", "quantile"),
        ("sum", "mean"),
        ("max", "mean"),
        ("max", "simulate"),
    ]
    for rule, est in combos:
        cfg = DispatchConfig("skew_aware", dcfg.alpha, rule, length_estimate=est)
        sp = site_split(pred, cost, n_units, cfg, prompt_tokens=lm.prompt_tokens, length_dist=lengths)
        sim_s = sim_of(sp)
        table[_key(rule, est)] = {
            "rule": rule if est != "simulate" else "-",
            "length_estimate": est,
            "long_tail_units": sp.num_long,
            "regular_units": sp.num_regular,
            "long_tail_batch": sp.long_batch,
            "regular_batch": sp.regular_batch,
            "estimate_s": sp.latency_s,
            "simulated_s": sim_s,
            "abs_error": abs(sp.latency_s - sim_s) / max(sim_s, 1e-12),
        }
    chosen = table[_key(dcfg.rule, dcfg.length_estimate)]
    no_split = sim_of(
        fixed_split(
            list(pred), num_units=n_units, num_long=0, alpha=dcfg.alpha, long_batch=0, regular_batch=cost.max_batch
        )
    )
    return {
        "policy": dcfg.policy,
        "rule": dcfg.rule,
        "length_estimate": dcfg.length_estimate,
        "alpha": dcfg.alpha,
        "site": site,
        "long_tail_units": chosen["long_tail_units"],
        "regular_units": chosen["regular_units"],
        "long_tail_batch": chosen["long_tail_batch"],
        "regular_batch": chosen["regular_batch"],
        "candidates": table,
        "better_rule": _better({r: table[f"{r}/quantile"] for r in ("sum", "max")}),
        "samples_on_site": int(mine.sum()),
        "no_split_simulated_s": no_split,
        "policy_simulated_s": gen.makespan_s,
    }


def _key(rule: str, est: str) -> str:
    return "simulate" if est == "simulate" else f"{rule}/{est}"


def _better(rules: dict[str, Any]) -> str:
    """Which rule's estimate is closer to the simulated time of the split it picked ("tie" if equal)."""
    s, m = rules["sum"]["abs_error"], rules["max"]["abs_error"]
    return "tie" if math.isclose(s, m, rel_tol=1e-9) else ("sum" if s < m else "max")
