"""One allocation's predicted times: its batches drawn and generated on its rollout units (`Batch`), each unit's
shares run through the job simulator per pipeline mode beside the trainer step and the weight sync, and the
cache (`SimCache`) a search that simulates many allocations keeps."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from rlctl.config.job import Job
from rlctl.config.pipeline import rounds_ahead
from rlctl.planner.costs import TrainWorkload
from rlctl.planner.dispatchreport import dispatch_report
from rlctl.planner.engine import Barrier
from rlctl.planner.inputs import PlanOptions, host_order_tp
from rlctl.planner.sim import (
    DispatchConfig,
    GenResult,
    Unit,
    simulate_generation,
)
from rlctl.planner.simjob import MODES, EngineSpec, IterationWork, Mode, UnitShare, simulate_job
from rlctl.planner.weightsync import slowest_weight_sync_s
from rlctl.planner.workload import LengthModel, noise_for_recall, predict_lengths

MIN_SIM_ITERATIONS = 6  # iterations simulated per mode (batches repeat when `sim_iterations` is less), 1 warm-up


UnitsKey = tuple[tuple[str, int], ...]  # rollout units by site and cost (`_units_key`)


@dataclass
class SimCache:
    """What `simulate_modes` keeps across the allocations a search simulates (the plan's own among them), each by what
    it depends on: the simulated batches by rollout units (the same beside every trainer), and a mode's simulated
    iteration by those units, their weight sync and the trainer's step and dp (its learner's cuts), so two
    allocations that differ only in GPUs left idle (13 and 15 GPUs of tp 4 units) or a trainer count whose fastest
    configuration is another's are simulated once."""

    batches: dict[UnitsKey, list[Batch]] = field(default_factory=dict)
    # (units, weight sync s, train s, at-step s, reduce_per_step, dp, mode) → the simulated iteration (s)
    iterations: dict[tuple[UnitsKey, float, float, float, bool, int, Mode], float] = field(default_factory=dict)


def _units_key(units: list[Unit]) -> UnitsKey:
    return tuple((u.site, id(u.cost)) for u in units)


@lru_cache(maxsize=16)
def _noise(recall: float, sigma: float) -> float:
    return noise_for_recall(recall, sigma=sigma)


def simulate_modes(
    job: Job,
    lm: LengthModel,
    units: list[Unit],
    tw: TrainWorkload,
    train: tuple[float, float],
    per_site: dict[str, int],
    opts: PlanOptions,
    *,
    modes: tuple[Mode, ...] = MODES,
    report: bool = True,
    cache: SimCache | None = None,
    reduce_per_step: bool = False,
    dp: int = 1,
) -> dict[str, Any]:
    """`train` = (trainer seconds per iteration, the part of them that waits for the whole batch); the iteration
    time of each of `modes`, and with `report` the dispatch report. `cache`: what a search that simulates many
    allocations keeps (`SimCache`). `reduce_per_step`: the trainer's FSDP2 reduces in a step's last cut alone (the
    plan's `reduce_per_step`), so its learner holds the last cut until the last sample is in. `dp`: the trainer's
    data-parallel ranks, whose shares of a cut the learner's budgets bound (`rlctl.rl.cuts`)."""
    spec = job.spec
    train_s, at_step_s = train
    cache = SimCache() if cache is None else cache
    key = _units_key(units)
    if key not in cache.batches:
        cache.batches[key] = _batches(job, lm, units, opts)
    batches = cache.batches[key]
    groups = np.arange(spec.batch.prompts_per_iteration).repeat(spec.batch.samples_per_prompt)  # prompt-major
    works = [
        IterationWork(
            g.finish_s,
            (lengths + lm.prompt_tokens).astype(float),
            train_s,
            spec.batch.train_micro_batch_samples,
            at_step_s=at_step_s,
            unit_of=g.unit_of,
            micro_batch_tokens=spec.batch.train_micro_batch_tokens,
            group_of=groups if spec.algorithm.kind == "grpo" else None,  # GRPO trains whole groups
            shares=shares,
            reduce_per_step=reduce_per_step,
            dp=dp,
        )
        for lengths, _, g, shares in batches
    ]
    gens = [g for _, _, g, _ in batches]
    first_len, first_pred = batches[0][0], batches[0][1]
    w_s = slowest_weight_sync_s(job, per_site, order_tp=host_order_tp(job, opts))
    # the pipeline needs a steady state: at least MIN_SIM_ITERATIONS, then η more that only follow them into the
    # engines (an async iteration's tail shares them with the next η; without those its gap is about T_train).
    # From η = steady on, no simulated iteration waits for weights (its shares reach the engines at the start) and
    # a larger η only adds works queued behind `steady` whole iterations in each engine (older first): the same
    # iteration time, at a cost quadratic in η (`simulate_job` runs each engine over i + η shares; η 10^4: minutes)
    # (η as the controller runs it: no more rounds ahead than MAX_SAMPLES_AHEAD holds, `rounds_ahead`)
    steady = max(len(works), MIN_SIM_ITERATIONS)
    eta = drain = min(rounds_ahead(spec.pipeline.eta, spec.batch.samples_per_iteration), steady)
    works = [works[i % len(works)] for i in range(steady + drain)]
    iteration: dict[Mode, float] = {}
    for m in modes:
        # the works are the batches' (by `key`) with this trainer step, and the job's eta and drain
        done = (key, w_s, train_s, at_step_s, reduce_per_step, dp, m)
        t = cache.iterations.get(done)
        if math.isinf(w_s):  # no route the weight plane takes reaches a site of this allocation: none it can run
            t = math.inf
        elif t is None:
            run = simulate_job(works, mode=m, weight_sync_s=w_s, eta=eta if m == "async" else 0, drain=drain)
            t = cache.iterations[done] = run.iteration_s()
        iteration[m] = t
    t_gen = float(np.mean([g.makespan_s for g in gens]))
    out: dict[str, Any] = {
        "predicted": {
            "t_gen_s": t_gen,
            "t_train_s": train_s,
            "weight_sync_s": w_s,
            "iteration_s": iteration,
            "samples_per_s": {m: tw.samples / t for m, t in iteration.items()},
        },
    }
    if report:
        dcfg = DispatchConfig(spec.rollout.dispatch, spec.rollout.long_tail_fraction, spec.planning.dispatch_rule)
        out["dispatch"] = dispatch_report(lm, units, first_len, first_pred, dcfg, gens[0])
    return out


class Batch(NamedTuple):
    """One simulated batch: its output lengths, the ranker's predictions, its generation and the units' shares."""

    lengths: np.ndarray
    pred: np.ndarray
    gen: GenResult
    shares: dict[int, UnitShare]


def _batches(job: Job, lm: LengthModel, units: list[Unit], opts: PlanOptions) -> list[Batch]:
    """The plan's `sim_iterations` batches (drawn from the job's seed) generated on `units`."""
    spec = job.spec
    rng = np.random.default_rng(spec.seed)
    noise = _noise(opts.ranker_recall, lm.sigma)
    dcfg = DispatchConfig(spec.rollout.dispatch, spec.rollout.long_tail_fraction, spec.planning.dispatch_rule)
    # may a unit's next iteration fill the rows its current one's tail frees (vLLM: always)
    barrier = spec.rollout.group_barrier if spec.rollout.engine == "embedded" else "never"
    out: list[Batch] = []
    for _ in range(opts.sim_iterations):
        lengths = lm.sample(spec.batch.prompts_per_iteration, spec.batch.samples_per_prompt, rng)
        pred = predict_lengths(lengths, noise_sigma=noise, rng=rng)
        # Algorithm 2 decides N_l on the first batch; later batches keep it (as a controller would)
        g = simulate_generation(
            lengths,
            pred,
            units,
            dcfg,
            prompt_tokens=lm.prompt_tokens,
            rng=rng,
            keep_splits=out[0].gen.splits if out else None,
        )
        out.append(Batch(lengths, pred, g, _shares(g, lengths, units, prompt_tokens=lm.prompt_tokens, barrier=barrier)))
    return out


def _shares(
    g: GenResult, lengths: np.ndarray, units: list[Unit], *, prompt_tokens: int, barrier: Barrier
) -> dict[int, UnitShare]:
    """Each unit's share of a simulated batch, in its admission order, with its engine: the job simulator runs
    a unit's shares of successive iterations in one engine (in async the next fills this one's tail)."""
    out = {}
    for u, (idx, cap) in g.queues.items():
        cost = units[u].cost
        engine = EngineSpec(
            cost.ptl_s,
            cap,
            prefill_s=prompt_tokens * cost.prefill_s_per_token,
            admit_fixed_s=cost.admit_fixed_s,
            compact_fraction=cost.compact_fraction,
            barrier=barrier,
        )
        out[u] = UnitShare(np.array(idx, dtype=int), lengths[idx], engine)
    return out
