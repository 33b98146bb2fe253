"""Simulator accuracy: the predicted vs the measured iteration time of real CPU jobs, per pipeline mode.

    measured profile (the probe of `rlctl profile --source measured`, median of 3) ──┐
    calibration jobs (sync and async, other prompts) ─▶ overheads (bench/jobsim.py) ─┤
                                                                                     ▼
    evaluated jobs: `rlctl launch JOB.yaml -o json` ─▶ ledger + metrics ─▶ simulator ─▶ predicted s/iter
      demo job (tiny-demo, digits) × {sync, stream, async} × {1, 2, 3} rollout units   (--quick: 1 unit)
      HF job (jobs/hf-demo: Qwen2-layout checkpoint, dataset, reward workers) × modes × {1, 3} units
                                                                                     ▼
    mape[mode] = mean over that mode's jobs of |predicted − measured| / measured

Measured iteration time = mean time between training ends after the first `warmup` iterations
(process start, first weights), on the dedicated-core clock (bench/cpuclock.py): the job's agents
share this 2-core machine with each other and with other work, while the simulator gives every agent
its own core (a local site's "GPU"); the clock removes the time the job's threads waited for a core,
as the profile's thread CPU time does. Wall-clock figures are reported beside it (`mape_wall`).

The simulator gets each iteration's real lengths, unit assignment and training granularity from the
job's ledger, and trains them as the learner does and `rlctl plan` simulates it (whole GRPO groups, in
cuts of rows and padded tokens): this checks the time model (decode, batching, streaming, pipeline),
not the length model. The overheads it does not price (the trainer's CPU beyond training,
the units' CPU beyond decoding, the hops between agents) are calibrated per job on separate runs with
other seeds and prompts (an async run with 1 unit for the agents' CPU, a sync run with 2 for the hops
and, with the async one, to split the units' CPU into per unit — each fetches and loads the weights
every iteration — and per sample; --quick: the sync run for both, all per sample), never on the
evaluated runs; `mape_uncalibrated` leaves them out. `machine_drift` is a
short engine probe around each run over the one right after profiling (CPU time per step moves with
what else runs); `mape_drift_corrected` scales the prediction by it (a diagnostic: the probe is noisy).

The HF job runs when jobs/hf-demo is built (`python jobs/hf-demo/build.py`, as `make demo` does).
`engine_batches` (full run only) is the earlier check of one generation stage (bench/sim_batches.py).
Set RLCTL_BENCH_KEEP=1 to keep the jobs' directories (their path is in `workdir`). `--modes async
--units 2,3` runs only those cases (after the same profile and calibration runs), to iterate on one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.jobrun import REPO, JobRun, launch
from bench.jobsim import (
    MeasuredProfile,
    Overheads,
    calibrate,
    measure_profile,
    predict,
    predict_iteration_s,
    replay,
    scaled,
    speed_probe,
)
from bench.sim_batches import run_batches, summary_batches
from rlctl.config.job import JobFile
from rlctl.planner.simjob import MODES, Mode

HF_DIR = REPO / "jobs" / "hf-demo"
SFT_STEPS = 200  # enough for the format (long-tailed answers); jobs/demo.yaml's 800 take minutes once
PROMPTS, GROUP = 8, 8  # 64 samples per iteration: one unit admits them all (max_batch_size 64)


@dataclass(frozen=True)
class Plan:
    iterations: int
    warmup: int  # iterations left out of the mean (start-up, the pipeline filling)
    cases: list[tuple[str, Mode, int]]  # (job kind, mode, rollout units)
    kinds: list[str]
    sft_steps: int  # the demo job's SFT warm-up (cached on disk; 0: start from the random model)
    probes: int  # profile probes, median taken
    calibration: list[tuple[Mode, int]]  # calibration runs (mode, units): sync, and async for the agents' CPU


def plan_for(*, quick: bool, hf_built: bool, modes: list[Mode] | None = None, units: list[int] | None = None) -> Plan:
    """The runs; `modes` / `units` keep only those evaluated cases (and the jobs they need profiled)."""
    kinds = ["demo"] + (["hf"] if hf_built and not quick else [])
    if quick:
        plan = Plan(4, 1, [("demo", m, 1) for m in MODES], kinds, sft_steps=0, probes=1, calibration=[("sync", 2)])
    else:
        cases = [("demo", m, u) for m in MODES for u in (1, 2, 3)]
        if hf_built:
            cases += [("hf", m, u) for m in MODES for u in (1, 3)]
        plan = Plan(20, 2, cases, kinds, sft_steps=SFT_STEPS, probes=3, calibration=[("sync", 2), ("async", 1)])
    chosen = [c for c in plan.cases if c[1] in (modes or MODES) and (units is None or c[2] in units)]
    if not chosen:
        have = ", ".join(f"{m} × {u}" for _, m, u in plan.cases)
        raise ValueError(f"no case with modes {modes} and units {units}; this run has {have} (mode × units)")
    return replace(plan, cases=chosen, kinds=[k for k in kinds if any(c[0] == k for c in chosen)])


def job_dict(
    kind: str, *, mode: Mode, units: int, iterations: int, sft_steps: int = 0, calibration: bool = False
) -> dict[str, Any]:
    """The demo or HF job at bench size; `calibration` draws other prompts (a separate workload)."""
    common: dict[str, Any] = {
        "apiVersion": "rlctl/v1",
        "kind": "Job",
        "name": f"simacc-{kind}",
        "inventory": [str(REPO / "clusters" / "local.yaml")],
        "iterations": iterations,
        "batch": {"prompts_per_iteration": PROMPTS, "samples_per_prompt": GROUP, "train_micro_batch_tokens": 1024},
        "pipeline": {"mode": mode},
        "placement": {"trainer": {"site": "local", "gpus": 1}, "rollout": [{"site": "local", "gpus": units}]},
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
    """A finished job and how fast the machine ran the engine around it, relative to profiling time."""

    run: JobRun
    drift: float  # speed probe before and after the run / the probe right after profiling (1.0: as fast)


def _launch(spec: dict[str, Any], *, workdir: Path, name: str, reference_s: float) -> Probed:
    before = speed_probe()
    run = launch(spec, workdir=workdir, name=name)
    return Probed(run, (before + speed_probe()) / 2 / reference_s)


@dataclass(frozen=True)
class Calibrated:
    raw: Overheads  # from the calibration runs' own seconds
    overheads: Overheads  # in the profile's seconds (each calibration run divided by its drift)


NO_OVERHEADS = Calibrated(Overheads(), Overheads())


def _predict(p: Probed, prof: MeasuredProfile, cal: Calibrated, *, warmup: int) -> dict[str, Any]:
    run, drift = p.run, p.drift
    job: JobFile = run.jobdir.read_job()
    rep = replay(run, prof)
    works = rep.with_overheads(cal.raw)
    tl = predict(rep, job, cal.raw)
    predicted, periods = tl.iteration_s(warmup), tl.periods_s()
    drifted = predict_iteration_s(rep, job, cal.overheads, warmup=warmup)[0] * drift
    bare, _ = predict_iteration_s(rep, job, Overheads(), warmup=warmup)
    measured = run.iteration_s(warmup=warmup)
    wall = run.iteration_s(warmup=warmup, dedicated=False)
    err = lambda x: round((x - measured) / measured, 4)  # noqa: E731
    # each iteration's slowest unit share as simulated (from its release, in the unit's engine) and as run
    gen_pred = [max(u.values(), default=0.0) for u in tl.unit_gen_s]
    gen_meas = run.generation_s()
    return {
        "predicted_s": round(predicted, 4),
        "measured_s": round(measured, 4),
        "error": err(predicted),
        "error_uncalibrated": err(bare),
        "machine_drift": round(drift, 3),
        "error_drift_corrected": err(drifted),
        "measured_wall_s": round(wall, 4),
        "error_wall": round((predicted - wall) / wall, 4),
        "cpu_share": round(run.cpu_share, 3),
        # the generation model alone: each iteration's slowest unit share, predicted (priced by the profile,
        # with the calibrated per-unit and per-sample overheads) against the ledger's dispatch → last finish
        "error_generation": round(float(np.mean(gen_pred[warmup:]) / np.mean(gen_meas[warmup:]) - 1), 4),
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
            "predicted": [round(w.train_s, 3) for w in works],
            "measured_wall": [r["t_train_s"] for r in run.rows],
        },
        "agent_cpu_s": {a: [round(x, 3) for x in v] for a, v in run.agent_cpu_s.items()},
        "agent_main_thread_cpu_s": {a: [round(x, 3) for x in v] for a, v in run.agent_main_cpu_s.items()},
        "samples_per_unit": [
            dict(sorted(Counter(e["agent"] for e in run.ledger if e["iteration"] == i).items()))
            for i in range(len(works))
        ],
    }


def _calibrate(
    kind: str, plan: Plan, prof: MeasuredProfile, *, workdir: Path, reference_s: float
) -> tuple[Calibrated, dict[str, Any]]:
    runs: dict[str, Probed] = {}
    for mode, units in plan.calibration:
        spec = job_dict(
            kind, mode=mode, units=units, iterations=plan.iterations, sft_steps=plan.sft_steps, calibration=True
        )
        runs[mode] = _launch(spec, workdir=workdir, name=f"{kind}-calibration-{mode}", reference_s=reference_s)
    sync, cpu = runs["sync"], runs.get("async", runs["sync"])
    cal = Calibrated(
        calibrate(sync.run, cpu.run, prof, warmup=plan.warmup),
        calibrate(scaled(sync.run, 1 / sync.drift), scaled(cpu.run, 1 / cpu.drift), prof, warmup=plan.warmup),
    )
    o = cal.raw
    return cal, {
        "runs": [f"{m}, {u} unit(s), other prompts" for m, u in plan.calibration],
        "agent_cpu_from": cpu.run.name,
        "trainer_s": round(o.trainer_s, 4),
        "rollout_s_per_sample": round(o.rollout_s_per_sample, 6),
        "rollout_s_per_unit": round(o.rollout_s_per_unit, 4),
        "weight_sync_s": round(o.weight_sync_s, 4),
        "drift_corrected": {k: round(v, 6) for k, v in asdict(cal.overheads).items()},
        "detail": {
            m: _predict(p, prof, Calibrated(Overheads(), Overheads()), warmup=plan.warmup) for m, p in runs.items()
        },
    }


def run(*, quick: bool, modes: list[Mode] | None = None, units: list[int] | None = None) -> dict[str, Any]:
    """`modes` / `units`: only those evaluated cases (the profile and calibration runs are always made)."""
    hf_built = (HF_DIR / "model" / "config.json").exists() and (HF_DIR / "data.jsonl").exists()
    plan = plan_for(quick=quick, hf_built=hf_built, modes=modes, units=units)
    workdir = Path(tempfile.mkdtemp(prefix="rlctl-sim-accuracy-"))
    profiles: dict[str, MeasuredProfile] = {}
    reference: dict[str, float] = {}
    calibration: dict[str, dict[str, Any]] = {}
    calibrated: dict[str, Calibrated] = {}
    for kind in plan.kinds:
        probe_job = JobFile.model_validate(job_dict(kind, mode="sync", units=1, iterations=plan.iterations))
        profiles[kind] = measure_profile(
            probe_job, checkpoint=str(HF_DIR / "model") if kind == "hf" else None, repeats=plan.probes
        )
        reference[kind] = speed_probe()
        calibrated[kind], calibration[kind] = _calibrate(
            kind, plan, profiles[kind], workdir=workdir, reference_s=reference[kind]
        )
    cases = []
    for kind, mode, units in plan.cases:
        spec = job_dict(kind, mode=mode, units=units, iterations=plan.iterations, sft_steps=plan.sft_steps)
        p = _launch(spec, workdir=workdir, name=f"{kind}-{mode}-{units}", reference_s=reference[kind])
        cases.append(
            {
                "job": kind,
                "mode": mode,
                "units": units,
                **_predict(p, profiles[kind], calibrated[kind], warmup=plan.warmup),
            }
        )
    out: dict[str, Any] = {
        "mape": _mape(cases, "error"),
        "mape_uncalibrated": _mape(cases, "error_uncalibrated"),
        "mape_drift_corrected": _mape(cases, "error_drift_corrected"),
        "mape_wall": _mape(cases, "error_wall"),
        "mape_generation": _mape(cases, "error_generation"),
        "goal": 0.05,
        "iterations": plan.iterations,
        "warmup_iterations": plan.warmup,
        "calibration": calibration,
        "profiles": {
            k: {
                **p.summary(),
                "speed_probe_ms": round(1e3 * reference[k], 3),
                "generation": p.generation.model_dump(mode="json"),
                "train_s_per_token": p.train_s_per_token,
            }
            for k, p in profiles.items()
        },
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
        f"{'job':<5} {'mode':<6} {'units':>5} {'predicted s':>11} {'measured s':>10} {'error':>7} "
        f"{'gen':>7} {'uncal.':>7} {'drift':>6} {'corr.':>7} {'wall s':>7} {'cpu share':>9}"
    ]
    for c in r["cases"]:
        lines.append(
            f"{c['job']:<5} {c['mode']:<6} {c['units']:>5} {c['predicted_s']:>11.3f} {c['measured_s']:>10.3f} "
            f"{c['error']:>+7.1%} {c['error_generation']:>+7.1%} {c['error_uncalibrated']:>+7.1%} "
            f"{c['machine_drift']:>6.2f} {c['error_drift_corrected']:>+7.1%} {c['measured_wall_s']:>7.3f} "
            f"{c['cpu_share']:>9.2f}"
        )
    for kind, cal in r["calibration"].items():
        lines.append(
            f"calibration ({kind}: {'; '.join(cal['runs'])}): trainer_s {cal['trainer_s']:.3f}, "
            f"rollout_s_per_sample {cal['rollout_s_per_sample']:.5f}, rollout_s_per_unit "
            f"{cal['rollout_s_per_unit']:.4f}, weight_sync_s {cal['weight_sync_s']:.3f}"
        )
    fmt = lambda d: ", ".join(f"{m} {v:.1%}" for m, v in d.items())  # noqa: E731
    lines.append(f"MAPE per mode (goal ≤ {r['goal']:.0%}): {fmt(r['mape'])}")
    lines.append(f"  uncalibrated: {fmt(r['mape_uncalibrated'])}; against wall-clock times: {fmt(r['mape_wall'])}")
    lines.append(f"  drift-corrected (simulated × drift): {fmt(r['mape_drift_corrected'])}")
    lines.append(f"  the generation model alone (gen: each iteration's slowest unit): {fmt(r['mape_generation'])}")
    lines.append(
        "measured = mean time between training ends after the first iterations, on the dedicated-core clock "
        "(time the job's threads waited for a core removed; cpu share = ran / runnable); drift = the engine's "
        "speed probe around the run / right after profiling"
    )
    if "engine_batches" in r:
        lines.append("one generation stage (engine batches):")
        lines.append(summary_batches(r["engine_batches"]))
    return "\n".join(lines)
