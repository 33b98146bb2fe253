"""Pipeline modes on this CPU: the demo workload in sync, stream and async modes, as real processes.

Each mode runs the controller, one trainer and `ROLLOUT_UNITS` rollout agents over TCP (the launch
backend and agents of `rlctl launch`), starting from the same SFT warm-up, in segments interleaved
with the other modes (the machine is shared; load drifts over minutes). Reported per mode:
samples/s over the runs (first dispatch → last optimizer step), the bubble fraction of each stage
(1 − busy time / run time; rollout = mean over units), staleness violations (must be 0) and the
reward. StreamRL Table 3 for comparison: streaming +15 % over the naive disaggregated baseline,
one-step async +25 % on top. Two single-thread processes (one rollout unit + the trainer) match the
two cores here, as in the prototype (DESIGN §10: async/sync 1.80 against an ideal of 1.88).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from rlctl.config import load_job
from rlctl.launch.jobdir import JobDir
from rlctl.ops.counts import resolve_job
from rlctl.ops.jobprep import prepare
from rlctl.ops.run import JobRun

JOB = Path(__file__).resolve().parent.parent / "jobs" / "demo.yaml"
MODES = ("sync", "stream", "async")
ROLLOUT_UNITS = 1
PAPER = {"stream_over_sync": 1.15, "async_over_sync": 1.15 * 1.25}


def run_mode(mode: str, *, iterations: int, root: Path) -> dict[str, Any]:
    job = load_job(JOB)
    spec = resolve_job(job, iterations=iterations, mode=mode)
    plan = {
        "source": "bench",
        "trainer": {"site": "local", "ranks": 1},
        "rollout": [{"site": "local", "units": ROLLOUT_UNITS}],
        "controller_site": "local",
    }
    jd = JobDir.create(f"pipeline-{mode}", explicit=root / mode)
    prepare(jd, spec, plan, source=str(JOB), job=job)
    run = JobRun(jd, spec, plan)
    try:
        run.start()
        summary = run.wait(poll_s=1.0)
    finally:
        run.stop()
    return summary


def _combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode's segments as one run: rates over the summed run time, fractions weighted by it."""
    span = sum(r["run_s"] for r in runs)
    samples = sum(r["ledger"]["trained_samples"] for r in runs)

    def weighted(get: Any) -> float:
        return round(sum(get(r) * r["run_s"] for r in runs) / span, 4)

    staleness: dict[str, int] = {}
    for r in runs:
        for k, n in r["staleness"].items():
            staleness[k] = staleness.get(k, 0) + n
    return {
        "samples_per_s": round(samples / span, 2),
        "run_s": round(span, 2),
        "bubble_fraction": {
            stage: weighted(lambda r, stage=stage: r["bubble_fraction"][stage]) for stage in ("rollout", "trainer")
        },
        "t_gen_s": weighted(lambda r: r["t_gen_s"]),
        "t_train_s": weighted(lambda r: r["t_train_s"]),
        "staleness": staleness,
        "staleness_violations": sum(r["staleness_violations"] for r in runs),
        "reward": [runs[0]["reward_first"], runs[0]["reward_last"]],
        "trained_prompts": sum(r["ledger"]["trained"] for r in runs),
        "prompts": sum(r["ledger"]["prompts"] for r in runs),
        "duplicated": sum(r["ledger"]["duplicated"] for r in runs),
        "states": [r["state"] for r in runs],
    }


def ideal_overlap(t_gen: float, t_train: float, iterations: int | None = None) -> float:
    """async/sync under perfect overlap, from the sync runs' stage times: (G + T) / max(G, T) in steady state; over
    N iterations the pipeline fills once (the first round's generation has no train step beside it) and drains
    once (nor the last train step a generation), N·(G + T) / (N·max + min)."""
    if iterations is None:
        return (t_gen + t_train) / max(t_gen, t_train)
    return iterations * (t_gen + t_train) / (iterations * max(t_gen, t_train) + min(t_gen, t_train))


def run(*, quick: bool) -> dict[str, Any]:
    """Modes run in interleaved segments (sync, stream, async, then reversed …): the machine is shared,
    and load that changes over minutes would otherwise favour whichever mode ran in a quiet spell."""
    segments, iterations = (1, 8) if quick else (3, 12)
    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="rlctl-bench-pipeline-") as tmp:
        for seg in range(segments):
            for mode in MODES if seg % 2 == 0 else tuple(reversed(MODES)):
                runs[mode].append(run_mode(mode, iterations=iterations, root=Path(tmp) / f"seg{seg}"))
    res = {m: _combine(runs[m]) for m in MODES}
    sps = {m: res[m]["samples_per_s"] for m in MODES}
    # what perfect overlap would give, from the sync runs' own stage times (DESIGN §10: ideal 1.88)
    t_gen, t_train = res["sync"]["t_gen_s"], res["sync"]["t_train_s"]
    return {
        "iterations": iterations,
        "segments": segments,
        "rollout_units": ROLLOUT_UNITS,
        "trainer_ranks": 1,
        "samples_per_s": sps,
        "bubble_fraction": {m: res[m]["bubble_fraction"] for m in MODES},
        "staleness_violations": sum(res[m]["staleness_violations"] for m in MODES),
        "staleness": {m: res[m]["staleness"] for m in MODES},
        "async_over_sync": round(sps["async"] / sps["sync"], 3),
        "stream_over_sync": round(sps["stream"] / sps["sync"], 3),
        "ideal_async_over_sync": round(ideal_overlap(t_gen, t_train), 3),
        "ideal_async_over_sync_at_horizon": round(ideal_overlap(t_gen, t_train, iterations), 3),
        "paper": PAPER,
        # other work on the machine takes the cores the overlapped stages need; recorded for context
        "load_average": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
        "cpu_count": os.cpu_count(),
        "t_gen_s": {m: res[m]["t_gen_s"] for m in MODES},
        "t_train_s": {m: res[m]["t_train_s"] for m in MODES},
        "per_segment_samples_per_s": {m: [r["samples_per_s"] for r in runs[m]] for m in MODES},
        "reward": {m: res[m]["reward"] for m in MODES},
        "ledger": {m: {k: res[m][k] for k in ("prompts", "trained_prompts", "duplicated")} for m in MODES},
        "state": {m: res[m]["states"] for m in MODES},
    }


def summary(result: dict[str, Any]) -> str:
    lines = [
        f"{result['segments']} interleaved segment(s) of {result['iterations']} iterations per mode, "
        f"{result['rollout_units']} rollout unit(s) + 1 trainer rank"
    ]
    for m in MODES:
        b = result["bubble_fraction"][m]
        lines.append(
            f"  {m:6s} {result['samples_per_s'][m]:7.1f} samples/s   bubble rollout {b['rollout']:.2f} "
            f"trainer {b['trainer']:.2f}   reward {result['reward'][m][0]:.3f} → {result['reward'][m][1]:.3f}"
        )
    lines.append(
        f"  stream/sync {result['stream_over_sync']:.2f} (paper 1.15)   async/sync "
        f"{result['async_over_sync']:.2f} (paper ≈1.44; target ≥ 1.5 here)   staleness violations "
        f"{result['staleness_violations']}"
    )
    lines.append(
        f"  ideal async/sync from the sync stage times {result['ideal_async_over_sync']:.2f} "
        f"({result['ideal_async_over_sync_at_horizon']:.2f} over {result['iterations']} iterations); load average "
        f"{result['load_average']['before']:.1f} → {result['load_average']['after']:.1f} on {result['cpu_count']} cores"
    )
    return "\n".join(lines)
