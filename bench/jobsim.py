"""The simulator's prediction of a real job's iteration time, from a measured profile of this machine.

    measured profile (rlctl profile --source measured's probe: PTL(BS) of the embedded engine on the
    job's model, training seconds per token of the job's algorithm; thread CPU time)
        │
    the job's workload, per iteration, from its ledger: which unit generated which sample, how many
    output tokens, on which prompt
        │
        ▼  per unit: its share in admission order, its engine (PTL at the share's live context, batch cap,
           group barrier): planner.simjob.UnitShare; each unit runs its shares in one engine across
           iterations (planner.engine.run_groups: in async the next share fills the rows this one's tail frees)
    IterationWork per iteration (+ calibrated overheads) ─▶ planner.simjob.simulate_job(mode, η) ─▶ s/iter

The lengths are the job's own (a planner only knows their distribution): this checks the time model
(decode, batching, streaming, the pipeline), not the length model. What the simulator does not price
— the trainer's work beyond training, the units' work beyond decoding, the hops between agents — is
calibrated on separate runs (`calibrate`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from bench.jobrun import JobRun, share_spans
from rlctl.config.algorithm import GrpoAlgorithm, PpoAlgorithm
from rlctl.config.job import JobFile
from rlctl.config.pipeline import rounds_ahead
from rlctl.planner.costs import (
    Sharding,
    ShardRule,
    TrainWorkload,
    decode_cost,
    grad_sync_s,
    host_link_bytes_per_s,
    train_compute_s,
)
from rlctl.planner.curves import live_context
from rlctl.planner.engine import EngineSpec
from rlctl.planner.sim import run_with
from rlctl.planner.simjob import IterationWork, JobTimeline, UnitShare, simulate_job
from rlctl.planner.split import shard_rule
from rlctl.profiler.probe import ProbeSpec, measure_here
from rlctl.profiler.profile import GenerationEntry, TrainingEntry
from rlctl.rl.grpo import group_advantages
from rlctl.rl.source import task_source

KV_CAPACITY_TOKENS = 10**9  # the embedded engine's cache grows with the batch: no KV bound on a CPU
# the ledger states of samples the trainer never got: left out of their group, their group dropped (dynamic
# sampling), their prompt quarantined (`rlctl.agents.ledger`)
UNDELIVERED = ("filtered", "dropped", "quarantined")


@dataclass(frozen=True)
class MeasuredProfile:
    generation: GenerationEntry
    train_s_per_token: float

    def summary(self) -> dict[str, Any]:
        ptl = self.generation.ptl_s[min(1, len(self.generation.contexts) - 1)]
        return {
            "ptl_ms": {
                "context": self.generation.contexts[min(1, len(self.generation.contexts) - 1)],
                **{str(b): round(1e3 * x, 3) for b, x in zip(self.generation.batch_sizes, ptl, strict=True)},
            },
            "prefill_us_per_token": round(1e6 * self.generation.prefill_s_per_token, 2),
            "train_us_per_token": round(1e6 * self.train_s_per_token, 2),
        }


def measure_probes(job: JobFile, *, checkpoint: str | None, repeats: int) -> list[dict[str, Any]]:
    """`repeats` probes of what `rlctl profile --source measured --job JOB` measures on a local site (its
    probe, in-process)."""
    spec = ProbeSpec(
        model=None if checkpoint else job.model.arch.name,
        checkpoint=checkpoint,
        engines=("embedded",),
        kv_capacity_tokens=KV_CAPACITY_TOKENS,
        algorithm=job.algorithm,
        batch=job.batch,
    )
    return [measure_here(spec) for _ in range(repeats)]


def profile_of(probes: list[dict[str, Any]]) -> MeasuredProfile:
    """The median of each grid cell and of the training figure over `probes` (one probe's decode cells
    vary by a quarter on this shared machine)."""
    entries = [GenerationEntry.model_validate(p["generation"][0]) for p in probes]
    median = entries[0].model_copy(
        update={
            "ptl_s": np.median([e.ptl_s for e in entries], axis=0).tolist(),
            "prefill_s_per_token": float(np.median([e.prefill_s_per_token for e in entries])),
            "prefill_fixed_s": float(np.median([e.prefill_fixed_s for e in entries])),
        }
    )
    return MeasuredProfile(median, float(np.median([p["training"]["gpu_s_per_token"] for p in probes])))


@dataclass(frozen=True)
class Replay:
    """A run's iterations as the simulator prices them: work per iteration, and which unit ran each sample."""

    works: list[IterationWork]
    unit_of: list[np.ndarray]  # per iteration, per sample: index of its unit (the same unit, the same index)
    unit_busy_s: list[dict[int, float]]  # per iteration, per unit index: its share's simulated busy seconds

    def with_overheads(self, overheads: Overheads) -> list[IterationWork]:
        """The works with the calibrated overheads: `trainer_s` on the training; each unit's share reaches its
        engine `rollout_s_per_unit` after the weights (it fetches and loads them first). Each sample keeps its
        unit."""
        return [
            replace(
                w,
                train_s=w.train_s + overheads.trainer_s,
                unit_of=units,
                unit_delay_s=overheads.rollout_s_per_unit,
            )
            for w, units in zip(self.works, self.unit_of, strict=True)
        ]


def train_step_s(
    job: JobFile, prof: MeasuredProfile, row_tokens: np.ndarray, *, dp: int, layout: Sharding, rule: ShardRule
) -> float:
    """A replayed step's training (its rows' `row_tokens`, prompt + output) as `rlctl plan` prices the trainer
    at `dp` ranks and `layout` (`rlctl.planner.costs.train_time_s`): its cuts' passes, each cut at its busiest
    rank's share padded to its longest row (`train_compute_s`, at the profile's seconds per padded token: one
    rank's), and the gradient reduction at the layout on one CPU host (`grad_sync_s` over gloo; `rule`: the job's
    `split.shard_rule`, its gradients' bytes).
    Not the planner's optimizer step (`TRAIN_STEP_OVERHEAD_S`, a GPU's): on this machine the trainer's CPU beyond this
    price is calibrated (`Overheads.trainer_s`)."""
    rows = tuple(float(x) for x in row_tokens)
    if not rows:  # every group without signal: the learner trains nothing (its step reduces zero gradients)
        return 0.0
    w = TrainWorkload(
        sum(rows),
        len(rows),
        job.batch.train_micro_batch_samples,
        micro_batch_tokens=job.batch.train_micro_batch_tokens,
        row_tokens=rows,
        **{f.name: getattr(rule, f.name) for f in fields(rule)},
    )
    # the profile's one figure, one rank's; its memory is not priced here (the run's plan held it)
    entry = TrainingEntry(
        tp=1, pp=1, gpu_s_per_token=prof.train_s_per_token, fixed_bytes_per_gpu=0.0, sharded_bytes_per_gpu=0.0
    )
    # this machine's ranks: processes of one CPU host reducing over gloo (the profile is of this machine)
    sync = grad_sync_s(
        entry, dp, w, layout=layout, node_bytes_per_s=None, host_bytes_per_s=host_link_bytes_per_s("CPU")
    )
    return train_compute_s(entry, dp, w) + w.optimizer_steps * sync


def trained_samples(entries: list[dict[str, Any]], algorithm: GrpoAlgorithm | PpoAlgorithm) -> np.ndarray:
    """Which of an iteration's samples (its ledger rows) the learner trains: those delivered to it and, under GRPO
    without a KL term, of a group with signal alone: `StreamingLearner.add` skips a group whose advantages are all 0
    (its rewards all equal, `rl.grpo.group_advantages`: its loss is 0 whatever the weights)."""
    delivered = np.array([e["state"] not in UNDELIVERED for e in entries], dtype=bool)
    if algorithm.kind != "grpo" or algorithm.kl_coef > 0:
        return delivered
    idx = np.flatnonzero(delivered).tolist()
    adv = group_advantages([entries[i]["reward"] for i in idx], [entries[i]["prompt_id"] for i in idx])
    signal = {entries[i]["prompt_id"] for i, a in zip(idx, adv, strict=True) if a}
    return delivered & np.array([e["prompt_id"] in signal for e in entries], dtype=bool)


def replay(run: JobRun, prof: MeasuredProfile) -> Replay:
    """Each iteration's generation (per unit, from the ledger) and training cost, priced by the profile;
    trained as the job's learner trains, as `rlctl plan` simulates it: whole groups (GRPO; a group without signal
    generated, not trained: `trained_samples`, versus trained and priced until 2026-12-08), in the
    learner's cuts (`train_micro_batch_samples` rows, `train_micro_batch_tokens` padded tokens a share of each of
    the trainer's dp ranks: `rlctl.rl.cuts`), the last held to the flush where FSDP2 reduces once a step, each step
    priced at that dp (`train_step_s`): the split the run's plan.json says (`trainer.parallel`, as its launch wrote
    it). A split of tp or pp > 1 is refused: the profile prices one rank of the whole model."""
    job = run.jobdir.read_job()
    trainer = run.jobdir.read_plan()["trainer"]
    parallel = trainer.get("parallel") or {}  # (none in a plan of before the split: every rank a whole replica)
    if int(parallel.get("tp", 1)) * int(parallel.get("pp", 1)) > 1:
        raise ValueError(
            f"{run.jobdir.plan_json}: trainer.parallel tp {parallel.get('tp', 1)} pp {parallel.get('pp', 1)}: "
            "jobsim prices tp 1 pp 1 (the profile's one training figure); replay a run of data parallelism alone"
        )
    dp = int(parallel.get("dp", trainer["ranks"]))
    layout = Sharding(bool(parallel.get("fsdp")), bool(parallel.get("reduce_per_step")))
    rule = shard_rule(job, job.model.arch)  # (an HF model's architecture is its directory read: once)
    source = task_source(job, run.jobdir.path, run.jobdir.init_model)
    prompt_len: dict[str, int] = {}
    agents = sorted({e["agent"] for e in run.ledger})  # one index per unit across the run
    works, unit_of, busy = [], [], []
    for it in range(job.iterations):
        entries = [e for e in run.ledger if e["iteration"] == it]
        for e in entries:
            if e["prompt_id"] not in prompt_len:
                prompt_len[e["prompt_id"]] = len(source.prompt_tokens(e["prompt_id"]))
        finish = np.zeros(len(entries))
        units = np.zeros(len(entries), dtype=int)
        tokens = np.array([prompt_len[e["prompt_id"]] + e["output_tokens"] for e in entries], dtype=float)
        groups = np.unique([e["prompt_id"] for e in entries], return_inverse=True)[1]
        trains = trained_samples(entries, job.algorithm)
        busy_s: dict[int, float] = {}
        shares: dict[int, UnitShare] = {}
        for unit in sorted({e["agent"] for e in entries}):
            idx = np.array([i for i, e in enumerate(entries) if e["agent"] == unit])
            lengths = np.array([max(1, entries[i]["output_tokens"]) for i in idx], dtype=np.int64)
            prompt = round(float(np.mean([prompt_len[entries[i]["prompt_id"]] for i in idx])))
            order = np.argsort(-lengths, kind="stable")  # the controller admits longest (predicted) first
            ctx = live_context(prompt, lengths, padded=prof.generation.padded_attention)
            cost = decode_cost(
                prof.generation, context=ctx, seq_tokens=ctx, engine_max_batch=job.rollout.max_batch_size
            )
            f = run_with(cost, lengths[order], batch_cap=job.rollout.max_batch_size, prompt_tokens=prompt)
            finish[idx[order]] = f
            units[idx] = agents.index(unit)
            busy_s[agents.index(unit)] = float(f.max())
            engine = EngineSpec(
                cost.ptl_s,
                job.rollout.max_batch_size,
                prefill_s=prompt * cost.prefill_s_per_token,
                admit_fixed_s=cost.admit_fixed_s,
                compact_fraction=cost.compact_fraction,
                barrier=job.rollout.group_barrier if job.rollout.engine == "embedded" else "never",
            )
            shares[agents.index(unit)] = UnitShare(idx[order], lengths[order], engine)
        works.append(
            IterationWork(
                finish,
                tokens,
                train_step_s(job, prof, tokens[trains], dp=dp, layout=layout, rule=rule),
                job.batch.train_micro_batch_samples,
                micro_batch_tokens=job.batch.train_micro_batch_tokens,
                group_of=groups if job.algorithm.kind == "grpo" else None,
                shares=shares,
                reduce_per_step=layout.reduce_per_step,
                dp=dp,
                trained=trains,
            )
        )
        unit_of.append(units)
        busy.append(busy_s)
    return Replay(works, unit_of, busy)


@dataclass(frozen=True)
class Overheads:
    """Per-iteration costs the simulator does not price, calibrated on a separate run (`calibrate`)."""

    trainer_s: float = 0.0  # trainer CPU per iteration beyond the profile's training cost: scoring, publishing
    rollout_s_per_unit: float = 0.0  # rollout CPU per unit and iteration beyond decoding: the weights, the samples
    weight_sync_s: float = 0.0  # training end → next generation: the controller's hops, dispatch
    # `trainer_s` when samples arrive all the while the trainer trains (async); None: `trainer_s`
    trainer_s_overlapped: float | None = None

    def for_mode(self, mode: str) -> Overheads:
        """The overheads of a job in pipeline `mode`, `trainer_s` its own: sync's (the samples are in before it
        trains), async's (the next iteration's arrive all the while), or for stream, whose samples arrive while
        it trains the part of the iteration that overlaps generation, the mean of both. Resolved: applying it
        again changes nothing."""
        if self.trainer_s_overlapped is None:
            return self
        own = {"sync": self.trainer_s, "stream": (self.trainer_s + self.trainer_s_overlapped) / 2}
        return replace(self, trainer_s=own.get(mode, self.trainer_s_overlapped), trainer_s_overlapped=None)


def predict_iteration_s(rep: Replay, job: JobFile, overheads: Overheads, *, warmup: int) -> tuple[float, list[float]]:
    """(mean iteration time after `warmup`, every iteration's time) as the simulator sees the job."""
    tl = predict(rep, job, overheads)
    return tl.iteration_s(warmup), tl.periods_s()


def predict(rep: Replay, job: JobFile, overheads: Overheads) -> JobTimeline:
    overheads = overheads.for_mode(job.pipeline.mode)
    works = rep.with_overheads(overheads)
    eta = rounds_ahead(job.pipeline.eta, job.batch.samples_per_iteration)  # as the controller ran it
    return simulate_job(works, mode=job.pipeline.mode, weight_sync_s=overheads.weight_sync_s, eta=eta)


def _rollout_extra_s(run: JobRun, rep: Replay, *, warmup: int) -> tuple[float, float]:
    """(units with a share, the units' CPU seconds beyond the profile's price of their decoding), per
    CPU interval on average, over the intervals after `warmup` (training end `warmup` → the last one). A share
    counts by the fraction of its generation (the ledger's first dispatch → last finish) that lies in that
    window: in async a unit generates iteration i + 1 while i trains, and idles in the last interval, so
    interval k's CPU is not iteration k + 1's. `rep`: `run` priced by its profile."""
    lo, hi = float(run.end_wall_s[warmup]), float(run.end_wall_s[-1])
    intervals = len(run.end_wall_s) - 1 - warmup
    cpu = sum(sum(v[warmup:]) for a, v in run.agent_cpu_s.items() if a.startswith("rollout"))
    agents = sorted({e["agent"] for e in run.ledger})  # as `replay` numbers the units
    units = busy = 0.0
    for it, spans in enumerate(share_spans(run.ledger, len(rep.works))):
        for agent, (t0, t1) in spans.items():
            inside = max(0.0, min(t1, hi) - max(t0, lo)) / max(t1 - t0, 1e-9)
            units += inside
            busy += inside * rep.unit_busy_s[it][agents.index(agent)]
    return units / intervals, (cpu - busy) / intervals


def _trainer_extra_s(run: JobRun, rep: Replay, *, warmup: int) -> float:
    """The trainer's main-thread CPU per iteration beyond the profile's price of its training (`rep`: `run` priced
    by its profile), after `warmup`."""
    trainer = run.agent_main_cpu_s["trainer-0"]
    return float(np.mean([trainer[i - 1] - rep.works[i].train_s for i in range(warmup + 1, len(rep.works))]))


def cpu_overheads(
    cpu_run: JobRun, cpu_prof: MeasuredProfile, units_run: JobRun, units_prof: MeasuredProfile, *, warmup: int
) -> Overheads:
    """The agents' CPU time per iteration beyond the profile's price of their work, each run priced by its own
    profile. `trainer_s` (scoring, unpacking, publishing): its main thread's, the loop that trains (its other
    threads, reading the controller's messages and serving the weights to every unit, run beside it), on
    `units_run` (sync: the samples are in before it trains); `trainer_s_overlapped` on `cpu_run` (async: they
    arrive while it trains, and it takes them in between micro-batches); stream jobs take their mean
    (`Overheads.for_mode`). The two differ by 2–3× for the demo job: 0.015 / 0.020 s on the sync
    calibration runs of two benchmarks against 0.042 / 0.043 s on the async ones, and its evaluated runs
    measured 0.015–0.030 s in sync against 0.035–0.061 s in async; the mean for every mode priced every
    async case short, and its excess over the sync run's own figure came off the hops fitted on that run.
    `rollout_s_per_unit` (fetching, hashing and loading the whole weights every iteration, receiving and
    sending the samples), on `units_run` (sync: a unit does nothing beside its share), all of it per unit and
    iteration. Split into per unit and per sample from two runs with 1 and 2 units per iteration, it was the
    difference of two runs' residuals against the decode model on different prompts: 0.07–0.16 s per unit for
    the demo job (the weight fetch takes 5–12 ms), which priced every run with 2–3 units too slow."""
    units_rep = replay(units_run, units_prof)
    trainer_s = _trainer_extra_s(units_run, units_rep, warmup=warmup)
    overlapped = (
        trainer_s if cpu_run is units_run else _trainer_extra_s(cpu_run, replay(cpu_run, cpu_prof), warmup=warmup)
    )
    units, extra = _rollout_extra_s(units_run, units_rep, warmup=warmup)
    return Overheads(
        max(0.0, trainer_s), rollout_s_per_unit=max(0.0, extra / units), trainer_s_overlapped=max(0.0, overlapped)
    )


def calibrate(
    sync_run: JobRun,
    cpu_run: JobRun,
    prof: MeasuredProfile,
    *,
    warmup: int,
    cpu_prof: MeasuredProfile | None = None,
) -> Overheads:
    """The overheads from two calibration runs: the agents' own (`cpu_overheads`: the trainer's on each, by
    pipeline kind, the units' on `sync_run`), then `weight_sync_s` as what a sync
    iteration (weight sync + generation + training, in series) still measures over the simulated one: the
    hops between the agents, which cost no agent CPU. `prof` prices `sync_run`, `cpu_prof` (default `prof`)
    `cpu_run`: each run by the profile measured right before it."""
    job = sync_run.jobdir.read_job()
    assert job.pipeline.mode == "sync", "weight_sync_s is fitted on a sync run: every part is in series"
    own = cpu_overheads(cpu_run, cpu_prof or prof, sync_run, prof, warmup=warmup)
    simulated, _ = predict_iteration_s(replay(sync_run, prof), job, own, warmup=warmup)
    return replace(own, weight_sync_s=max(0.0, sync_run.iteration_s(warmup=warmup) - simulated))
