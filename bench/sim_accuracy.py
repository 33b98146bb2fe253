"""Simulator accuracy: the predicted vs the measured iteration time of real CPU jobs, per pipeline mode.

    calibration jobs (sync and async, other prompts) ─▶ overheads (bench/jobsim.py) ─┐
                                                                                     ▼
    each job: measured profile (the probe of `rlctl profile --source measured`, median of 5), then
    `rlctl launch JOB.yaml -o json` ─▶ ledger + metrics ─▶ simulator (with that profile) ─▶ predicted s/iter
      demo job (tiny-demo, digits) × {sync, stream, async} × {1, 2, 3} rollout units   (--quick: 1 unit)
      demo job × modes × 1 unit with the trainer at dp 2 (two torch ranks over gloo)   (full run only)
      HF job (jobs/hf-demo: Qwen2-layout checkpoint, dataset, reward workers) × modes × {1, 3} units
                                                                                     ▼
    mape[mode] = mean over that mode's jobs of |predicted − measured| / measured

Measured iteration time = mean time between training ends after the first `warmup` iterations
(process start, first weights), on the dedicated-core clock (bench/cpuclock.py): the job's agents
share this 2-core machine with each other and with other work, while the simulator gives every agent
its own core (a local site's "GPU"); the clock removes the time the job's threads waited for a core,
as the profile's thread CPU time does. Wall-clock figures are reported beside it (`mape_wall`).

The simulator gets each iteration's real lengths, unit assignment and training granularity from the
job's ledger, and trains them as the learner does and `rlctl plan` simulates it (whole GRPO groups, a group
without signal untrained, in cuts of rows and padded tokens, each cut priced at its busiest rank's share
padded): this checks the time model (decode, batching, streaming, pipeline),
not the length model. The overheads it does not price (the trainer's CPU beyond training,
the units' CPU beyond decoding, the hops between agents) are calibrated per job on separate runs with
other seeds and prompts (a sync run with 2 units: the trainer's CPU for sync jobs, the units' CPU per unit
and iteration — each fetches and loads the whole weights — and the hops; an async run with 1 unit: the
trainer's CPU for async jobs, where samples arrive while it trains and it takes 2–3× as much; stream jobs
take the mean of both; --quick: the sync run for all of it), never on the evaluated runs;
`mape_uncalibrated` leaves them out.

Each run (calibration or evaluated) is priced by a profile of its own minutes: the median of 5 probes
right before it and 5 right after it (--quick: 1 before). This shared machine's speed moves by 10–20 %
over minutes (other tenants), enough to miss the goal with one profile for the whole benchmark, and one
probe's cells are noisy (6 probes of the demo model back to back: the decode cells' coefficient of
variation 0.24 in the median, training per token 0.10; one probe in six measured decode steps at batch
8–16 twice as long). `mape_before_only` prices each run (and calibrates) with its probes before it only,
as a user runs `rlctl profile` and then `rlctl launch`. `machine_drift` is
how much slower each run's profile measured than the job kind's first one (median decode step, training
per token); `mape_one_profile` prices every run with that first profile instead.

Per phase: `error_generation` (below) and `error_training`, each step as priced (`bench.jobsim.train_step_s`
at the run's dp, with the calibrated trainer overhead) against the busiest trainer rank's main-thread CPU
(`trainer_cpu_s`); `mape_by_dp` puts the dp-2 cases beside the dp-1 ones. The dp-2 cases are not in --quick: one
adds a probe and a launch of two trainer ranks, about 20 s on this machine. The calibration runs stay at dp 1.

The HF job runs when jobs/hf-demo is built (`python jobs/hf-demo/build.py`, as `make demo` does).
`engine_batches` (full run only) is the earlier check of one generation stage (bench/sim_batches.py).
Set RLCTL_BENCH_KEEP=1 to keep the jobs' directories (their path is in `workdir`). `--modes async
--units 2,3` (`--dp 2`) runs only those cases (after the same profile and calibration runs), to iterate on one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from bench.jobrun import REPO, JobRun, launch
from bench.jobsim import (
    MeasuredProfile,
    Overheads,
    calibrate,
    measure_probes,
    predict,
    predict_iteration_s,
    profile_of,
    replay,
)
from bench.sim_batches import run_batches, summary_batches
from rlctl.config.job import JobFile
from rlctl.planner.simjob import MODES, Mode

HF_DIR = REPO / "jobs" / "hf-demo"
SFT_STEPS = 200  # enough for the format (long-tailed answers); jobs/demo.yaml's 800 take minutes once
PROMPTS, GROUP = 8, 8  # 64 samples per iteration: one unit admits them all (max_batch_size 64)


class Case(NamedTuple):
    job: str  # the job kind: demo or hf
    mode: Mode
    units: int  # rollout units
    dp: int = 1  # the torch trainer's data-parallel ranks (gloo on this CPU: a core-slot each)


@dataclass(frozen=True)
class Plan:
    iterations: int
    warmup: int  # iterations left out of the mean (start-up, the pipeline filling)
    cases: list[Case]
    kinds: list[str]
    sft_steps: int  # the demo job's SFT warm-up (cached on disk; 0: start from the random model)
    probes: int  # probes of the job kind's first profile, median taken
    run_probes: int  # probes of the profile measured right before each run
    bracket: bool  # … and as many right after it, the profile the median of both
    calibration: list[tuple[Mode, int]]  # calibration runs (mode, units): sync, and async (the trainer's CPU)


def plan_for(
    *,
    quick: bool,
    hf_built: bool,
    modes: list[Mode] | None = None,
    units: list[int] | None = None,
    dps: list[int] | None = None,
) -> Plan:
    """The runs; `modes` / `units` / `dps` (the trainer's data-parallel ranks) keep only those evaluated cases (and
    the jobs they need profiled)."""
    kinds = ["demo"] + (["hf"] if hf_built and not quick else [])
    if quick:
        plan = Plan(
            4,
            1,
            [Case("demo", m, 1) for m in MODES],
            kinds,
            sft_steps=0,
            probes=1,
            run_probes=1,
            bracket=False,
            calibration=[("sync", 2)],
        )
    else:
        cases = [Case("demo", m, u) for m in MODES for u in (1, 2, 3)]
        cases += [Case("demo", m, 1, dp=2) for m in MODES]  # the trainer at dp 2: its cuts' shares, the reduction
        if hf_built:
            cases += [Case("hf", m, u) for m in MODES for u in (1, 3)]
        plan = Plan(
            40,
            2,
            cases,
            kinds,
            sft_steps=SFT_STEPS,
            probes=5,
            run_probes=5,
            bracket=True,
            calibration=[("sync", 2), ("async", 1)],
        )
    chosen = [
        c
        for c in plan.cases
        if c.mode in (modes or MODES) and (units is None or c.units in units) and (dps is None or c.dp in dps)
    ]
    if not chosen:
        have = ", ".join(f"{c.mode} × {c.units} × dp {c.dp}" for c in plan.cases)
        raise ValueError(
            f"no case with modes {modes}, units {units} and dp {dps}; this run has {have} (mode × units × trainer dp)"
        )
    return replace(plan, cases=chosen, kinds=[k for k in kinds if any(c.job == k for c in chosen)])


def job_dict(
    kind: str,
    *,
    mode: Mode,
    units: int,
    iterations: int,
    sft_steps: int = 0,
    calibration: bool = False,
    dp: int = 1,
) -> dict[str, Any]:
    """The demo or HF job at bench size, its trainer on `dp` slots (the torch trainer: data parallel, one
    replica a rank); `calibration` draws other prompts (a separate workload)."""
    common: dict[str, Any] = {
        "apiVersion": "rlctl/v1",
        "kind": "Job",
        "name": f"simacc-{kind}",
        "inventory": [str(REPO / "clusters" / "local.yaml")],
        "iterations": iterations,
        "batch": {"prompts_per_iteration": PROMPTS, "samples_per_prompt": GROUP, "train_micro_batch_tokens": 1024},
        "pipeline": {"mode": mode},
        "placement": {"trainer": {"site": "local", "gpus": dp}, "rollout": [{"site": "local", "gpus": units}]},
        "rollout": {"engine": "embedded", "max_batch_size": 64, "dispatch": "skew_aware"},
        "checkpoint": {"every_iterations": 0},
    }
    seed = 1 if calibration else 0  # calibration: other prompts, other samples (and its own SFT warm-up)
    if kind == "demo":  # jobs/demo.yaml with a shorter SFT warm-up (cached on disk after its first run)
        return {
            **common,
            "model": {"kind": "builtin", "name": "tiny-demo"},
            "task": {"kind": "digits", "seed": seed},
            "algorithm": {"kind": "grpo", "lr": 3.0e-4},
            "warmup": {"sft_steps": sft_steps},
            "seed": seed,
        }
    return {  # jobs/hf-demo.yaml
        **common,
        "model": {"kind": "hf", "path": str(HF_DIR / "model")},
        "task": {
            "kind": "dataset",
            "path": str(HF_DIR / "data.jsonl"),
            "reward": f"{HF_DIR / 'reward.py'}:compute_score",
            "max_prompt_tokens": 32,
            "max_output_tokens": 64,
            "reward_workers": 2,
            "reward_timeout_s": 5,
            "shuffle_seed": seed,
        },
        "algorithm": {"kind": "grpo", "lr": 1.0e-4},
        "warmup": {"sft_steps": 0},
        "seed": seed,
    }


@dataclass(frozen=True)
class Probed:
    """A finished job and its profiles: `prof` of the probes right before and (`Plan.bracket`) right after it,
    `prof_before` of those before it only."""

    run: JobRun
    prof: MeasuredProfile
    prof_before: MeasuredProfile


def _launch(
    spec: dict[str, Any], *, workdir: Path, name: str, plan: Plan, before: list[dict[str, Any]] | None = None
) -> Probed:
    """Profile the job (`plan.run_probes` probes; `before`: such probes made right before this call), run it, and
    (`plan.bracket`) profile it again: this shared machine's speed moves by 10–20 % over minutes, so a run is priced
    by a profile of its own minutes."""
    job = JobFile.model_validate(spec)
    before = before if before is not None else _probes(job, repeats=plan.run_probes)
    run = launch(spec, workdir=workdir, name=name)
    after = _probes(job, repeats=plan.run_probes) if plan.bracket else []
    return Probed(run, profile_of(before + after), profile_of(before))


def _probes(job: JobFile, *, repeats: int) -> list[dict[str, Any]]:
    """Probes of the job's measured profile: the HF job's checkpoint, or the demo's built-in model (speed only)."""
    return measure_probes(job, checkpoint=str(HF_DIR / "model") if job.model.kind == "hf" else None, repeats=repeats)


def _drift(prof: MeasuredProfile, first: MeasuredProfile) -> dict[str, float]:
    """How much slower the machine ran when `prof` was measured than at the first profile (1.0: as fast)."""
    return {
        "generation": round(float(np.median(np.array(prof.generation.ptl_s) / np.array(first.generation.ptl_s))), 3),
        "training": round(prof.train_s_per_token / first.train_s_per_token, 3),
    }


def _predict(p: Probed, cal: Calibration, *, warmup: int, first: MeasuredProfile) -> dict[str, Any]:
    """`p` predicted with its own profile and the calibrated overheads; diagnostics: without the overheads, with
    the probes before the run only (as a user profiles, then launches), and with the job kind's first profile
    (measured once, minutes earlier), the overheads priced the same way."""
    run = p.run
    job: JobFile = run.jobdir.read_job()
    rep = replay(run, p.prof)
    works = rep.with_overheads(cal.overheads.for_mode(job.pipeline.mode))
    tl = predict(rep, job, cal.overheads)
    predicted, periods = tl.iteration_s(warmup), tl.periods_s()
    bare, _ = predict_iteration_s(rep, job, Overheads(), warmup=warmup)
    before, _ = predict_iteration_s(replay(run, p.prof_before), job, cal.before_only, warmup=warmup)
    one, _ = predict_iteration_s(replay(run, first), job, cal.with_first, warmup=warmup)
    measured = run.iteration_s(warmup=warmup)
    wall = run.iteration_s(warmup=warmup, dedicated=False)
    err = lambda x: round((x - measured) / measured, 4)  # noqa: E731
    # each iteration's slowest unit share as simulated (from its release, in the unit's engine) and as run
    gen_pred = [max(u.values(), default=0.0) for u in tl.unit_gen_s]
    gen_meas = run.generation_s()
    train_pred, train_meas = [w.train_s for w in works], trainer_cpu_s(run)
    return {
        "predicted_s": round(predicted, 4),
        "measured_s": round(measured, 4),
        "error": err(predicted),
        "error_uncalibrated": err(bare),
        "error_before_only": err(before),
        "error_one_profile": err(one),
        "machine_drift": _drift(p.prof, first),
        "measured_wall_s": round(wall, 4),
        "error_wall": round((predicted - wall) / wall, 4),
        "cpu_share": round(run.cpu_share, 3),
        # the generation model alone: each iteration's slowest unit share, predicted (priced by the profile,
        # with the calibrated per-unit overhead) against the ledger's dispatch → last finish
        "error_generation": round(float(np.mean(gen_pred[warmup:]) / np.mean(gen_meas[warmup:]) - 1), 4),
        "error_training": round(float(np.mean(train_pred[warmup + 1 :]) / np.mean(train_meas[warmup:]) - 1), 4),
        "micro_batch_samples": [w.micro_batch_samples for w in works],
        "periods_s": {
            "predicted": [round(x, 3) for x in periods],
            "measured": [round(x, 3) for x in run.periods_s()],
        },
        "t_gen_s": {
            "predicted": [round(x, 3) for x in gen_pred],
            "measured": [round(x, 3) for x in gen_meas],
            "measured_wall": [round(x, 3) for x in run.generation_s(dedicated=False)],
        },
        "t_train_s": {
            "predicted": [round(x, 3) for x in train_pred],
            "measured_cpu": [round(x, 3) for x in train_meas],  # from iteration 1 (interval 0)
            "measured_wall": [r["t_train_s"] for r in run.rows],
        },
        "agent_cpu_s": {a: [round(x, 3) for x in v] for a, v in run.agent_cpu_s.items()},
        "agent_main_thread_cpu_s": {a: [round(x, 3) for x in v] for a, v in run.agent_main_cpu_s.items()},
        "samples_per_unit": [
            dict(sorted(Counter(e["agent"] for e in run.ledger if e["iteration"] == i).items()))
            for i in range(len(works))
        ],
        "profile": _profile_json(p.prof),
    }


def trainer_cpu_s(run: JobRun) -> list[float]:
    """The training phase as run: per CPU interval (interval k ends with iteration k + 1's training), the busiest
    trainer rank's main-thread CPU (the loop that trains; at dp > 1 each rank trains its share of every cut, and
    gloo reduces the gradients in threads of its own). `_predict` sets each step's price (at the run's dp, with the
    calibrated trainer overhead) against it."""
    ranks = [v for a, v in run.agent_main_cpu_s.items() if a.startswith("trainer-")]
    return [max(x) for x in zip(*ranks, strict=True)]


def _profile_json(prof: MeasuredProfile) -> dict[str, Any]:
    return {
        **prof.summary(),
        "generation": prof.generation.model_dump(mode="json"),
        "train_s_per_token": prof.train_s_per_token,
    }


@dataclass(frozen=True)
class Calibration:
    overheads: Overheads  # each calibration run priced by its own profile
    before_only: Overheads  # … by its probes before it only (the `error_before_only` diagnostic)
    with_first: Overheads  # … by the job kind's first profile (the `error_one_profile` diagnostic)
    report: dict[str, Any]


NO_OVERHEADS = Calibration(Overheads(), Overheads(), Overheads(), {})


def _calibrate(
    kind: str, plan: Plan, first: MeasuredProfile, *, workdir: Path, first_probes: list[dict[str, Any]]
) -> Calibration:
    """The calibration runs; the first is priced by `first_probes` (the job kind's first profile's, made right before
    it: the probe measures the model, engine, algorithm and batch, which the calibration jobs share with the probe
    job) when they are as many as a run's, versus probing the same thing again at once."""
    runs: dict[str, Probed] = {}
    for i, (mode, units) in enumerate(plan.calibration):
        spec = job_dict(
            kind, mode=mode, units=units, iterations=plan.iterations, sft_steps=plan.sft_steps, calibration=True
        )
        before = first_probes if i == 0 and len(first_probes) == plan.run_probes else None
        runs[mode] = _launch(spec, workdir=workdir, name=f"{kind}-calibration-{mode}", plan=plan, before=before)
    sync, cpu = runs["sync"], runs.get("async", runs["sync"])
    o = calibrate(sync.run, cpu.run, sync.prof, cpu_prof=cpu.prof, warmup=plan.warmup)
    o_before = calibrate(sync.run, cpu.run, sync.prof_before, cpu_prof=cpu.prof_before, warmup=plan.warmup)
    o_first = calibrate(sync.run, cpu.run, first, warmup=plan.warmup)
    return Calibration(
        o,
        o_before,
        o_first,
        {
            "runs": [f"{m}, {u} unit(s), other prompts" for m, u in plan.calibration],
            "agent_cpu_from": cpu.run.name,
            "trainer_s": round(o.trainer_s, 4),
            "trainer_s_overlapped": round(o.for_mode("async").trainer_s, 4),
            "rollout_s_per_unit": round(o.rollout_s_per_unit, 4),
            "weight_sync_s": round(o.weight_sync_s, 4),
            "with_first_profile": {k: round(v, 6) for k, v in asdict(o_first).items()},
            "detail": {m: _predict(p, NO_OVERHEADS, warmup=plan.warmup, first=first) for m, p in runs.items()},
        },
    )


def run(
    *, quick: bool, modes: list[Mode] | None = None, units: list[int] | None = None, dps: list[int] | None = None
) -> dict[str, Any]:
    """`modes` / `units` / `dps`: only those evaluated cases (the profile and calibration runs are always made)."""
    hf_built = (HF_DIR / "model" / "config.json").exists() and (HF_DIR / "data.jsonl").exists()
    plan = plan_for(quick=quick, hf_built=hf_built, modes=modes, units=units, dps=dps)
    workdir = Path(tempfile.mkdtemp(prefix="rlctl-sim-accuracy-"))
    first: dict[str, MeasuredProfile] = {}
    calibration: dict[str, Calibration] = {}
    for kind in plan.kinds:
        probe_job = JobFile.model_validate(job_dict(kind, mode="sync", units=1, iterations=plan.iterations))
        probes = _probes(probe_job, repeats=plan.probes)
        first[kind] = profile_of(probes)
        calibration[kind] = _calibrate(kind, plan, first[kind], workdir=workdir, first_probes=probes)
    cases = []
    for kind, mode, n, dp in plan.cases:
        spec = job_dict(kind, mode=mode, units=n, iterations=plan.iterations, sft_steps=plan.sft_steps, dp=dp)
        name = f"{kind}-{mode}-{n}" + (f"-dp{dp}" if dp > 1 else "")
        p = _launch(spec, workdir=workdir, name=name, plan=plan)
        cases.append(
            {
                "job": kind,
                "mode": mode,
                "units": n,
                "dp": dp,
                **_predict(p, calibration[kind], warmup=plan.warmup, first=first[kind]),
            }
        )
    out: dict[str, Any] = {
        "mape": _mape(cases, "error"),
        "mape_uncalibrated": _mape(cases, "error_uncalibrated"),
        "mape_before_only": _mape(cases, "error_before_only"),
        "mape_one_profile": _mape(cases, "error_one_profile"),
        "mape_wall": _mape(cases, "error_wall"),
        "mape_generation": _mape(cases, "error_generation"),
        "mape_training": _mape(cases, "error_training"),
        # the cases of each trainer dp apart (every mode): the cost model's split of a step over the ranks
        "mape_by_dp": {
            str(dp): round(float(np.mean([abs(c["error"]) for c in cases if c["dp"] == dp])), 4)
            for dp in sorted({c["dp"] for c in cases})
        },
        "goal": 0.05,
        "iterations": plan.iterations,
        "warmup_iterations": plan.warmup,
        "calibration": {k: c.report for k, c in calibration.items()},
        "profiles": {k: _profile_json(p) for k, p in first.items()},
        "cases": cases,
        "hf_job": "measured" if "hf" in plan.kinds else ("not in --quick" if hf_built else "not built"),
        "workdir": str(workdir),
    }
    if os.environ.get("RLCTL_BENCH_KEEP") != "1":
        shutil.rmtree(workdir)
        out["workdir"] = None
    if not quick:
        out["engine_batches"] = run_batches(quick=False)
    return out


def _mape(cases: list[dict[str, Any]], key: str) -> dict[str, float]:
    return {
        m: round(float(np.mean([abs(c[key]) for c in cases if c["mode"] == m])), 4)
        for m in MODES
        if any(c["mode"] == m for c in cases)
    }


def summary(r: dict[str, Any]) -> str:
    lines = [
        f"{'job':<5} {'mode':<6} {'units':>5} {'dp':>2} {'predicted s':>11} {'measured s':>10} {'error':>7} "
        f"{'gen':>7} {'train':>7} {'uncal.':>7} {'1 prof.':>7} {'drift':>10} {'wall s':>7} {'cpu share':>9}"
    ]
    for c in r["cases"]:
        drift = c["machine_drift"]
        lines.append(
            f"{c['job']:<5} {c['mode']:<6} {c['units']:>5} {c['dp']:>2} {c['predicted_s']:>11.3f} "
            f"{c['measured_s']:>10.3f} {c['error']:>+7.1%} {c['error_generation']:>+7.1%} "
            f"{c['error_training']:>+7.1%} {c['error_uncalibrated']:>+7.1%} "
            f"{c['error_one_profile']:>+7.1%} {drift['generation']:>5.2f}/{drift['training']:<4.2f} "
            f"{c['measured_wall_s']:>7.3f} {c['cpu_share']:>9.2f}"
        )
    for kind, cal in r["calibration"].items():
        lines.append(
            f"calibration ({kind}: {'; '.join(cal['runs'])}): trainer_s {cal['trainer_s']:.3f} "
            f"(async: {cal['trainer_s_overlapped']:.3f}), "
            f"rollout_s_per_unit "
            f"{cal['rollout_s_per_unit']:.4f}, weight_sync_s {cal['weight_sync_s']:.3f}"
        )
    fmt = lambda d: ", ".join(f"{m} {v:.1%}" for m, v in d.items())  # noqa: E731
    lines.append(f"MAPE per mode (goal ≤ {r['goal']:.0%}): {fmt(r['mape'])}")
    lines.append(f"  uncalibrated: {fmt(r['mape_uncalibrated'])}; against wall-clock times: {fmt(r['mape_wall'])}")
    lines.append(f"  each run with its probes before it only (not after): {fmt(r['mape_before_only'])}")
    lines.append(
        f"  each run with the job's first profile (one profile, minutes earlier): {fmt(r['mape_one_profile'])}"
    )
    lines.append(f"  the generation model alone (gen: each iteration's slowest unit): {fmt(r['mape_generation'])}")
    lines.append(
        f"  the training model alone (train: each step, its busiest rank's main-thread CPU): {fmt(r['mape_training'])}"
    )
    lines.append(f"  per trainer dp (every mode): {', '.join(f'dp {d} {v:.1%}' for d, v in r['mape_by_dp'].items())}")
    lines.append(
        "measured = mean time between training ends after the first iterations, on the dedicated-core clock "
        "(time the job's threads waited for a core removed; cpu share = ran / runnable); drift = the run's profile / "
        "the first profile (decode step / training per token)"
    )
    if "engine_batches" in r:
        lines.append("one generation stage (engine batches):")
        lines.append(summary_batches(r["engine_batches"]))
    return "\n".join(lines)
