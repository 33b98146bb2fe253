"""Run a real job the way users do (`rlctl launch JOB.yaml -o json`) and read what it measured.

    job dict ─▶ JOB.yaml ─▶ python -m rlctl launch JOB.yaml -o json --job-dir DIR   (agents: local processes)
                               │  DedicatedClock samples the launch process's tree (bench/cpuclock.py)
                               ▼
    DIR/metrics.jsonl (one row per trained iteration: t, period_s, t_gen_s, t_train_s …)
    DIR/samples.jsonl + checkpoints/<N>/ledger.json (every sample: iteration, unit, output tokens, when it was
                                     dispatched, finished, delivered and trained: the controller's wall clock)
    DIR/events.jsonl (trained, weights_applied …)

Iteration times are taken between consecutive `trained` rows, on the wall clock and on the
dedicated-core clock; the first `warmup` iterations (process start, first weights) are left out.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.cpuclock import DedicatedClock
from rlctl.agents.appliedlog import unit_rows
from rlctl.checkpoint.controller import sample_rows
from rlctl.launch.jobdir import JobDir

REPO = Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT_S = 900.0


@dataclass
class JobRun:
    """One finished job: its directory, rows and per-iteration times on both clocks."""

    name: str
    job: dict[str, Any]
    jobdir: JobDir
    rows: list[dict[str, Any]]
    ledger: list[dict[str, Any]]  # the final checkpoint's ledger entries
    events: list[dict[str, Any]]
    end_wall_s: np.ndarray  # time.time() when each iteration was trained (metrics row `t`)
    end_dedicated_s: np.ndarray  # the same instants on the dedicated-core clock
    cpu_share: float  # of the time the job's threads were runnable, the fraction they ran
    wall_s: float
    agent_cpu_s: dict[str, list[float]]  # per agent, CPU seconds between consecutive training ends
    agent_main_cpu_s: dict[str, list[float]]  # … of its main thread only (its loop: the serial part)
    # per iteration, per unit: its share's generation (first dispatch → last finish, the ledger's times)
    gen_wall_s: list[dict[str, float]]
    gen_dedicated_s: list[dict[str, float]]  # the same on the dedicated-core clock
    summary: dict[str, Any] = field(default_factory=dict)  # what `rlctl launch -o json` printed

    def iteration_s(self, *, warmup: int, dedicated: bool = True) -> float:
        """Mean time per iteration after the first `warmup` ones (between training ends)."""
        ends = self.end_dedicated_s if dedicated else self.end_wall_s
        return float((ends[-1] - ends[warmup]) / (len(ends) - 1 - warmup))

    def generation_s(self, *, dedicated: bool = True) -> list[float]:
        """Per iteration, its slowest unit's share: dispatch to last finish (a unit busy with the previous
        share when this one was dispatched counts that wait too)."""
        per_unit = self.gen_dedicated_s if dedicated else self.gen_wall_s
        return [max(u.values()) for u in per_unit]

    def periods_s(self, *, dedicated: bool = True) -> list[float]:
        ends = self.end_dedicated_s if dedicated else self.end_wall_s
        return [float(x) for x in np.diff(ends)]


def launch(job: dict[str, Any], *, workdir: Path, name: str) -> JobRun:
    """Write `job` as a YAML job file, run it through `rlctl launch` and read its job directory."""
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    jobdir = JobDir(workdir / name)
    cmd = [sys.executable, "-m", "rlctl", "launch", str(path), "-o", "json", "--job-dir", str(jobdir.path)]
    with (workdir / f"{name}.stderr").open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO)
        clock = DedicatedClock(proc.pid).start()
        try:
            out, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
        finally:
            clock.stop()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if proc.returncode != 0:
        tail = (workdir / f"{name}.stderr").read_text().strip().splitlines()[-3:]
        raise RuntimeError(f"job {name} failed (exit {proc.returncode}): {' | '.join(tail)}")
    summary = json.loads(out)
    rows = sorted(jobdir.read_lines(jobdir.metrics), key=lambda r: r["iteration"])
    ends = np.array([r["t"] for r in rows], dtype=float)
    # every sample, as the ledger held it: the sample log and the final checkpoint's ledger
    ledger = sample_rows(jobdir, job["iterations"])
    events = unit_rows(jobdir.read_lines(jobdir.events))  # (a version's weights_applied: one row per unit)
    pids = {e["agent"]: e["ident"]["pid"] for e in events if e["event"] == "agent_started" and "pid" in e["ident"]}
    agent_cpu = {a: [clock.cpu_s(pid, t0, t1) for t0, t1 in itertools.pairwise(ends)] for a, pid in pids.items()}
    main_cpu = {
        a: [clock.cpu_s(pid, t0, t1, main_thread=True) for t0, t1 in itertools.pairwise(ends)]
        for a, pid in pids.items()
    }
    spans = share_spans(ledger, job["iterations"])
    virtual = lambda t: float(clock.virtual(np.array([t]))[0])  # noqa: E731
    return JobRun(
        name=name,
        job=job,
        jobdir=jobdir,
        rows=rows,
        ledger=ledger,
        events=events,
        end_wall_s=ends,
        end_dedicated_s=clock.virtual(ends),
        cpu_share=clock.cpu_share,
        wall_s=float(summary.get("wall_s") or 0.0),
        agent_cpu_s=agent_cpu,
        agent_main_cpu_s=main_cpu,
        gen_wall_s=[{a: t1 - t0 for a, (t0, t1) in sp.items()} for sp in spans],
        gen_dedicated_s=[{a: virtual(t1) - virtual(t0) for a, (t0, t1) in sp.items()} for sp in spans],
        summary=summary,
    )


def share_spans(ledger: list[dict[str, Any]], iterations: int) -> list[dict[str, tuple[float, float]]]:
    """Per iteration, per unit: its share's (first dispatch, last finish), the ledger's wall clock."""
    spans: list[dict[str, tuple[float, float]]] = [{} for _ in range(iterations)]
    for e in ledger:
        mine = spans[e["iteration"]]
        t0, t1 = mine.get(e["agent"], (e["dispatched_at"], e["finished_at"]))
        mine[e["agent"]] = (min(t0, e["dispatched_at"]), max(t1, e["finished_at"]))
    return spans
