"""The plan's rebalance advice: δ' of one more rollout unit on the best site with room for one (on one host, in
the slots the trainer leaves), and whether the controller's rule would add it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from rlctl.config.hostfill import trainer_slots
from rlctl.launch.backends import kind_of
from rlctl.planner.curves import GenCurve, units_that_fit
from rlctl.planner.placement import rollout_hosts
from rlctl.planner.search import SAME_WITHIN


def free_gpus_per_site(allocation: list[dict[str, Any]], inv: Any) -> dict[str, int]:
    used: dict[str, int] = {}
    for a in allocation:
        used[a["site"]] = used.get(a["site"], 0) + a["gpus_used"]
    return {s: inv.sites[s].total_gpus - u for s, u in used.items()}


def room_for_unit(
    allocation: list[dict[str, Any]], inv: Any, t_site: str, *, order_tp: int
) -> Callable[[str, int], bool]:
    """Whether one more rollout unit of `tp` GPUs fits on a site: on one host (tensor parallel stays inside a
    node), in the slots the trainer leaves (its tp groups fill the first hosts: `hostfill.trainer_slots`), beside
    the site's units, which fill the hosts in the order `GpuPool.take` does (`rollout_hosts`)."""
    t = allocation[0]
    site = inv.sites[t_site]
    placed = trainer_slots(
        [g for _, g in site.hosts],
        t["gpus_used"],
        tp=t["config"]["tp"],
        slurm=kind_of(site).ranks_are_tasks,
        order_tp=order_tp,
    )
    assert placed is not None  # the trainer curve holds only configurations that place
    trainer = placed[0]
    units = {a["site"]: a["instances"] for a in allocation if a["role"] == "rollout"}

    def fits(site: str, tp: int) -> bool:
        slots = inv.sites[site].total_gpus - (trainer if site == t_site else 0)
        hosts = rollout_hosts(inv.sites[site], shared=site == t_site, trainer_tp=order_tp)
        return slots > 0 and int(units_that_fit(hosts, tp, slots)[slots]) > units[site]

    return fits


def rebalance_advice(
    gcurves: dict[str, GenCurve],
    per_site: dict[str, int],
    free: dict[str, int],
    room: Callable[[str, int], bool],
    predicted: dict[str, Any],
    *,
    one_more: Callable[[str, int], float] | None = None,
) -> dict[str, Any]:
    """δ' = reduction of generation time from one more DP unit on the best site with room for one (`room`).

    P_gen comes from the stage curve of the planning workload; as lengths grow the controller
    re-estimates it from recent lengths (the rule itself: add a unit when δ = T_gen − T_train ≥ δ').

    Where iterations overlap (async at η > 0; `one_more(site, tp)`: the simulated async iteration with one more
    unit there) a unit's next iteration fills its current one's tail, so the stage makespans overstate what
    generation holds back: δ is the simulated iteration minus T_train (the trainer's wait) and δ' what the unit
    saves of that iteration; a unit that saves less than SAME_WITHIN of it (generation bound by its longest
    samples, not by units) is not added. The controller's rule measures the same δ at η > 0, with δ' = period /
    (N + 1)
    (`rlctl.agents.rebalance`)."""
    delta = predicted["t_gen_s"] - predicted["t_train_s"]
    options = []  # (room for it, gain, site, tp): one more instance of the site's current TP
    for s, x in per_site.items():
        cfg = gcurves[s].configs[x] if x else None
        tp = cfg.tp if cfg else min(gcurves[s].costs)
        est = gcurves[s].estimators[tp]
        n = cfg.instances if cfg else 0
        gain = est.time_s(n) - est.time_s(n + 1) if n else math.inf
        options.append((room(s, tp), gain, s, tp))
    has_room, gain, site, tp = max(options)
    pays = True
    if one_more is not None:
        t = float(predicted["iteration_s"]["async"])
        delta, gain = t - predicted["t_train_s"], t - one_more(site, tp)
        pays = gain >= SAME_WITHIN * t
    out = {
        "basis": "simulated_async" if one_more is not None else "stage_times",
        "delta_s": delta,
        "delta_prime_s": gain,
        "site": site,
        "unit_gpus": tp,
        "free_gpus": free[site],
        "add_unit": bool(has_room and pays and delta >= gain * (1 - 1e-9)),  # 1e-9: a unit closing the gap exactly
    }
    if not has_room:
        out["reason"] = (
            "no rollout site has room for another unit (its TP degree free on one host; δ' is what one would gain)"
        )
    elif not pays:
        out["reason"] = (
            f"not needed: one more unit saves < {SAME_WITHIN:.0%} of the simulated iteration (generation is bound "
            "by its longest samples, not by units)"
        )
    return out
