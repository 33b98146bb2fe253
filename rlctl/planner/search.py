"""The allocation search: Algorithm 1 over the stage curves (paper rule, fewest GPUs within ε, the baseline), the
order rollout sites fill in, and for an async job the simulated searches (`simulated_split` on a site both
stages share, `simulated_cross` across datacenters) with their bisection and unimodal minimum."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from rlctl.config.job import Job
from rlctl.errors import PlanError
from rlctl.planner import alloc
from rlctl.planner.costs import TrainWorkload
from rlctl.planner.curves import GenCurve, TrainCurve
from rlctl.planner.inputs import PlanOptions
from rlctl.planner.predict import SimCache, simulate_modes
from rlctl.planner.sim import Unit
from rlctl.planner.workload import LengthModel


def mask_fixed(seconds: np.ndarray, fixed: int | None) -> np.ndarray:
    """A role with a fixed GPU count may only use exactly that many."""
    if fixed is None:
        return seconds
    out = np.full_like(seconds, math.inf)
    out[fixed] = seconds[fixed]
    return out


def allocate(
    job: Job,
    gcurves: dict[str, GenCurve],
    train: tuple[np.ndarray, np.ndarray],
    budgets: dict[str, int],
    r_fixed: dict[str, int | None],
    n_train: int,
    shared: bool,
    t_site: str,
) -> tuple[alloc.Choice, alloc.Choice, np.ndarray, alloc.Choice]:
    """(paper rule, fewest GPUs within ε, rollout GPUs per site at each total (`alloc.fill_table`), baseline: even
    split or full allocation).

    `train` = (curve masked to fixed counts, unmasked curve); the baseline ignores fixed counts.
    """
    train_s, train_raw = train
    r_sites = list(gcurves)
    curves = [mask_fixed(gcurves[s].seconds, r_fixed[s]) for s in r_sites]
    order = fill_order(job, gcurves, budgets, r_fixed, t_site if shared else None)
    # the `auto` sites the trainer does not share split what reaches them as finishes soonest: one curve of mixed
    # GPU types, filled in cost order, would put units on the cheaper site while a faster one waits
    searched = [i for i, s in enumerate(r_sites) if r_fixed[s] is None and not (shared and s == t_site)]
    sizes = [budgets[s] for s in r_sites]
    fill = alloc.fill_table([gcurves[s].seconds for s in r_sites], sizes, order, searched=searched)
    combined = alloc.combine_rollout(curves, fill)
    combined[: fixed_total(r_fixed, t_site if shared else None)] = math.inf  # every fixed site holds its count
    raw = alloc.combine_rollout([gcurves[s].seconds for s in r_sites], fill)
    m = sum(budgets.values())
    eps = job.spec.planning.epsilon
    if shared:
        others = m - budgets[t_site]
        n = budgets[t_site]
        shifted = np.full(n + 1, math.inf)
        shifted[1:] = combined[others + 1 : others + n + 1]
        c = alloc.single_dc(shifted, train_s, n)
        paper = alloc.Choice(c.x + others, c.y, c.t_gen_s, c.t_train_s)
        f = alloc.fewest_gpus(shifted, train_s, m=n, n=n, reference_s=c.iteration_s, epsilon=eps, shared=True)
        half = n // 2
        base = alloc.Choice(others + half, n - half, float(raw[others + half]), float(train_raw[n - half]))
        return paper, alloc.Choice(f.x + others, f.y, f.t_gen_s, f.t_train_s), fill, base
    paper = alloc.cross_dc(combined, train_s, m, n_train)
    full = max(float(combined[m]), float(train_s[n_train]))
    fewest = alloc.fewest_gpus(combined, train_s, m=m, n=n_train, reference_s=full, epsilon=eps)
    return paper, fewest, fill, alloc.Choice(m, n_train, float(raw[m]), float(train_raw[n_train]))


def fill_order(
    job: Job, gcurves: dict[str, GenCurve], budgets: dict[str, int], r_fixed: dict[str, int | None], shared: str | None
) -> list[int]:
    """The order rollout sites are filled in (indices into `gcurves`), so that k rollout GPUs are the first k of
    it: the sites whose count the job fixes first (each always holds all of its count), then the others, each
    group by the lowest cost per unit of work at full allocation; a site the trainer shares (`shared`) last, so
    that the count beyond the other sites is its share. The `auto` sites between split what reaches them as
    finishes soonest (`alloc.fill_table`); this order breaks their ties (the cheaper first)."""
    inv = job.inventory.sites
    r_sites = list(gcurves)
    work_cost = [inv[s].gpu_cost_per_hour * budgets[s] * float(gcurves[s].seconds[budgets[s]]) for s in r_sites]
    order = sorted(range(len(r_sites)), key=lambda i: (r_fixed[r_sites[i]] is None, work_cost[i], i))
    if shared is not None:
        order = [i for i in order if r_sites[i] != shared] + [r_sites.index(shared)]
    return order


def fixed_total(r_fixed: dict[str, int | None], shared: str | None) -> int:
    """The rollout GPUs of the sites whose count the job fixes, but for a shared site (filled last): the fewest
    rollout GPUs of a feasible allocation filled in `fill_order`."""
    return sum(f for s, f in r_fixed.items() if f is not None and s != shared)


def units_for(gcurves: dict[str, GenCurve], per_site: dict[str, int]) -> list[Unit]:
    """The rollout units of `per_site` GPUs per site: its curve's configuration at that count."""
    units: list[Unit] = []
    for s, x in per_site.items():
        cfg = gcurves[s].configs[x] if x > 0 else None
        if cfg is not None:
            units += [Unit(s, gcurves[s].costs[cfg.tp])] * cfg.instances
    return units


SEARCH_GRID = 9  # splits of the shared site simulated before the search narrows around the best


SAME_TIME = 1e-9  # simulated times this close (relative) are one: their difference is float rounding


class Stages(NamedTuple):
    """What a search of the allocation simulates: the job, its workload and stage curves, the sites' GPU budgets
    and the rollout GPUs per site at each total (`alloc.fill_table`); `cache`: what the simulations keep (the plan's
    own allocation among them)."""

    job: Job
    lm: LengthModel
    gcurves: dict[str, GenCurve]
    tcurve: TrainCurve
    tw: TrainWorkload
    budgets: dict[str, int]
    fill: np.ndarray
    opts: PlanOptions
    cache: SimCache


def simulated_split(
    stages: Stages,
    *,
    t_site: str,
    streamed_fraction: float,
    seeds: tuple[int, ...],
) -> tuple[alloc.Choice, dict[str, Any]]:
    """The split of the site both stages share that the job simulator finds fastest in async mode: there a unit's
    next iteration fills the rows its current one's long tail frees (`_shares`), so generation costs less than one
    iteration's makespan and Algorithm 1, which balances that makespan against training, gives rollout too many
    GPUs (docs/planning.md). Rollout gets x of the site's n GPUs (after every other rollout site's whole budget), the
    trainer the fastest configuration within n − x. Minimised over x by `search_min` on a grid of SEARCH_GRID
    splits and `seeds` (rollout GPU counts: Algorithm 1's, its fewest-GPUs alternative, the even split, and the site's
    fastest trainer beside every other GPU: the simulated iteration moves in steps of whole units and hosts, not
    smoothly in x)."""
    gcurves, budgets, fill = stages.gcurves, stages.budgets, stages.fill
    r_sites = list(gcurves)
    n = budgets[t_site]
    others = sum(budgets.values()) - n
    gen = alloc.combine_rollout([gcurves[s].seconds for s in r_sites], fill)
    train = np.asarray(stages.tcurve.seconds, dtype=float)
    fastest, fastest_at = alloc.prefix_min(train[:n])  # the fastest trainer within n − x GPUs, and where
    feasible = [x for x in range(1, n) if math.isfinite(gen[others + x]) and math.isfinite(fastest[n - x])]
    if not feasible:
        raise PlanError(f"site {t_site!r}: no split of its {n} GPUs runs both stages")
    runs: dict[int, tuple[int, float]] = {}  # x → (trainer GPUs, simulated async iteration s)
    simulated = _async_iteration(stages, train=train, streamed_fraction=streamed_fraction)

    def iteration(x: int) -> float:
        y = int(fastest_at[n - x])
        runs[x] = (y, simulated(others + x, y))
        return runs[x][1]

    def nearest(x: int) -> int:  # the feasible split nearest a seed (a combined rollout count)
        return min(feasible, key=lambda v: (abs(v - (x - others)), v))

    # and the site's fastest trainer beside every other GPU: fewer rollout GPUs leave the trainer as it is there,
    # and the simulated iteration need not fall smoothly with the rollout's units between (a 7B FSDP2 trainer on 8 of
    # 32: 16 rollout GPUs 17.66 s, 20 17.71 s, 24 17.54 s, which the grid around the seeds missed)
    starts = {nearest(x) for x in seeds} | {nearest(others + n - int(fastest_at[n - 1]))}
    best = search_min(iteration, feasible, grid=SEARCH_GRID, seeds=sorted(starts))
    y = runs[best][0]
    chosen = alloc.Choice(others + best, y, float(gen[others + best]), float(train[y]))
    evaluated = [
        {"rollout_gpus": others + x, "trainer_gpus": yx, "iteration_s": s} for x, (yx, s) in sorted(runs.items())
    ]
    return chosen, {"mode": "async", "kind": "shared_site", "site": t_site, "chosen": chosen.x, "evaluated": evaluated}


# simulated async iterations this close count as the same: across datacenters a stage gives up GPUs while the
# iteration stays within it of the full allocation's, and the plan advises no unit that saves less
SAME_WITHIN = 0.01


def simulated_cross(
    stages: Stages,
    *,
    n_train: int,
    search_rollout: bool,
    search_trainer: bool,
    min_rollout: int,
    streamed_fraction: float,
) -> tuple[alloc.Choice, dict[str, Any]]:
    """Across datacenters every site's GPUs are there to use; what a plan decides is how few of them it needs.
    Algorithm 1 shrinks the stage that is faster by its makespan to the other's time; in async mode a unit's next
    iteration fills its current one's tail, so that makespan overstates what generation costs and Algorithm 1
    keeps rollout GPUs the job does not need. Here the job simulator decides: from the full allocation (its
    simulated async iteration T), a stage whose GPU count is `auto` gives up GPUs while the iteration stays within
    SAME_WITHIN of T (the fewest found by `search_first`, on the simulated times), one stage then the other; of the
    two orders, the one that costs less per iteration (the sites' `gpu_cost_per_hour`) is chosen. Rollout sites
    whose count the job fixes come first in the fill order and hold it: rollout counts below `min_rollout`
    (their sum) are not tried."""
    job, gcurves, budgets, fill = stages.job, stages.gcurves, stages.budgets, stages.fill
    r_sites = list(gcurves)
    inv = job.inventory.sites
    t_site = job.spec.placement.trainer.site
    sizes = [budgets[s] for s in r_sites]
    m = sum(sizes)
    gen = alloc.combine_rollout([gcurves[s].seconds for s in r_sites], fill)
    train = np.asarray(stages.tcurve.seconds, dtype=float)
    fastest, fastest_at = alloc.prefix_min(train[: n_train + 1])  # the fastest trainer within y GPUs, and where
    xs = [x for x in range(max(1, min_rollout), m + 1) if math.isfinite(gen[x])] if search_rollout else [m]
    ys = sorted({int(fastest_at[y]) for y in range(1, n_train + 1) if math.isfinite(fastest[y])})
    ys = ys if search_trainer else [n_train]
    if not xs or not ys or xs[-1] != m or not math.isfinite(train[ys[-1]]):
        raise PlanError(f"{job.spec.name}: the full allocation ({m} rollout, {n_train} trainer GPUs) cannot run")
    runs: dict[tuple[int, int], float] = {}
    simulated = _async_iteration(stages, train=train, streamed_fraction=streamed_fraction)

    def iteration(x: int, y: int) -> float:
        if (x, y) not in runs:
            runs[x, y] = simulated(x, y)
        return runs[x, y]

    bound = iteration(m, ys[-1]) * (1 + SAME_WITHIN)

    def cost(x: int, y: int) -> float:
        per_site = alloc.split_combined(x, fill)
        per_hour = sum(inv[s].gpu_cost_per_hour * g for s, g in zip(r_sites, per_site, strict=True))
        return (per_hour + inv[t_site].gpu_cost_per_hour * y) * iteration(x, y)

    def fewest_rollout(y: int) -> int:
        return search_first(lambda x: iteration(x, y) <= bound, xs)

    def fewest_trainer(x: int) -> int:
        return search_first(lambda y: iteration(x, y) <= bound, ys)

    ends = []
    x = fewest_rollout(ys[-1])  # rollout first, then the trainer
    y = fewest_trainer(x)
    ends.append((cost(x, y), iteration(x, y), x + y, x, y))
    y = fewest_trainer(m)  # the trainer first, then rollout
    x = fewest_rollout(y)
    ends.append((cost(x, y), iteration(x, y), x + y, x, y))
    _, _, _, x, y = min(ends)
    chosen = alloc.Choice(x, y, float(gen[x]), float(train[y]))
    evaluated = [{"rollout_gpus": xe, "trainer_gpus": ye, "iteration_s": t} for (xe, ye), t in sorted(runs.items())]
    search = {
        "mode": "async",
        "kind": "across_datacenters",
        "sites": [*r_sites, t_site],
        "within": SAME_WITHIN,
        "chosen": x,
        "chosen_trainer": y,
        "evaluated": evaluated,
    }
    return chosen, search


def _async_iteration(stages: Stages, *, train: np.ndarray, streamed_fraction: float) -> Callable[[int, int], float]:
    """The simulated async iteration (s) with x rollout GPUs (split per site as the stages' fill table says) and
    the trainer configuration at index y of `train` (the trainer curve's seconds), its learner cutting as that
    configuration's trainer does (its priced `reduce_per_step`, `costs.trainer_layout`), as the plan simulates its
    choice (it simulated every candidate reducing once a cut before)."""
    job, lm, gcurves, tcurve, tw, _, fill, opts, cache = stages
    r_sites = list(gcurves)

    def run(x: int, y: int) -> float:
        per_site = dict(zip(r_sites, alloc.split_combined(x, fill), strict=True))
        units = units_for(gcurves, per_site)
        cfg = tcurve.configs[y]
        return simulated_async_s(
            job,
            lm,
            units,
            tw,
            float(train[y]),
            per_site,
            opts,
            streamed_fraction=streamed_fraction,
            cache=cache,
            reduce_per_step=cfg is not None and cfg.layout.reduce_per_step,
            dp=cfg.dp if cfg is not None else 1,
        )

    return run


def simulated_async_s(
    job: Job,
    lm: LengthModel,
    units: list[Unit],
    tw: TrainWorkload,
    train_s: float,
    per_site: dict[str, int],
    opts: PlanOptions,
    *,
    streamed_fraction: float,
    cache: SimCache | None = None,
    reduce_per_step: bool = False,
    dp: int = 1,
) -> float:
    """The simulated async iteration (s) of `units` (GPUs `per_site`) beside a trainer step of `train_s`
    (`reduce_per_step`, `dp`: the trainer's, `simulate_modes`)."""
    at_step = train_s * (1 - streamed_fraction)
    sim = simulate_modes(
        job,
        lm,
        units,
        tw,
        (train_s, at_step),
        per_site,
        opts,
        modes=("async",),
        report=False,
        cache=cache,
        reduce_per_step=reduce_per_step,
        dp=dp,
    )
    return float(sim["predicted"]["iteration_s"]["async"])


def search_first(ok: Callable[[int], bool], xs: list[int]) -> int:
    """The first x of `xs` (ascending) for which `ok` holds, by bisection (exact when `ok` is monotone: false, then
    true); `ok(xs[-1])` is taken to hold."""
    lo, hi = 0, len(xs) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(xs[mid]):
            hi = mid
        else:
            lo = mid + 1
    return xs[lo]


def search_min(f: Callable[[int], float], xs: list[int], *, grid: int, seeds: Sequence[int] = ()) -> int:
    """An x of `xs` (ascending) minimising f, evaluating f at most once per x: f at `grid` evenly spaced xs and
    the seeds, then at the midpoint (in `xs`) between the best so far and each evaluated neighbour, until the best
    one's neighbours are adjacent in `xs`. Exact for a strictly unimodal f; for another, a local minimum near the best
    grid point. Ties (within SAME_TIME: float rounding) go to the smaller x. Seeds not in `xs` are left out."""
    seen: dict[int, float] = {}
    pos = {x: i for i, x in enumerate(xs)}
    seeds = [x for x in seeds if x in pos]

    def at(x: int) -> None:
        if x not in seen:
            seen[x] = f(x)

    k = len(xs)
    grid = max(grid, 2)
    first = xs if k <= grid else [xs[round(i * (k - 1) / (grid - 1))] for i in range(grid)]
    for x in [*first, *seeds]:
        at(x)
    while True:
        done = sorted(seen)
        low = min(seen.values())
        # ties to the smaller x, a tie within float noise too (a trainer-bound iteration: 41.645674772565364 s
        # beside 9 rollout GPUs, 41.64567477256537 s beside 2, the same pipeline)
        best = next(x for x in done if seen[x] <= low + abs(low) * SAME_TIME)
        i = done.index(best)
        mids = [xs[(pos[best] + pos[nb]) // 2] for nb in done[max(i - 1, 0) : i + 2] if abs(pos[nb] - pos[best]) > 1]
        if not mids:
            return best
        for x in mids:
            at(x)
