"""A synthetic job directory as the controller leaves it: job.json, metrics.jsonl, events.jsonl."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ITERATIONS = 12
JOINS_AT = 6


def write_lines(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def metrics_row(i: int) -> dict[str, Any]:
    """Iteration i of a 2-unit run that gets a third unit at JOINS_AT: T_gen drops, rollouts get idler."""

    def busy(per_iteration_s: float, after_join_s: float, since: int = 1) -> float:
        return sum(per_iteration_s if k < JOINS_AT else after_join_s for k in range(since, i + 1))

    agents: dict[str, Any] = {
        "trainer-0": {"role": "trainer", "site": "h800", "busy_s": busy(1.5, 1.5), "state": "running"},
        "rollout-0": {"role": "rollout", "site": "h20", "busy_s": busy(2.0, 1.4), "state": "running"},
        "rollout-1": {"role": "rollout", "site": "h20", "busy_s": busy(1.8, 1.2), "state": "running"},
    }
    if i >= JOINS_AT:
        agents["rollout-2"] = {"role": "rollout", "site": "h20", "busy_s": busy(0.0, 1.3, JOINS_AT), "state": "running"}
    t_gen = 3.0 if i < JOINS_AT else 2.2
    return {
        "iteration": i,
        "reward_mean": 0.1 + 0.05 * i,
        "t_gen_s": t_gen,
        "t_train_s": 1.5,
        "delta_s": t_gen - 1.5,
        "samples_per_s": 20.0,
        "tokens_per_s": 4000.0,
        "weight_version": i,
        "staleness": {"0": 64},
        "loss": 0.01,
        "period_s": 2.0,
        "wall_s": 2.0 * i,
        "delta_prime_s": 0.9,
        "rollout_units": 2 if i < JOINS_AT else 3,
        "agents": agents,
    }


def make_job_dir(root: Path, *, metrics: bool = True) -> Path:
    d = root / "demo-20260101-000000"
    d.mkdir()
    job = {"name": "demo", "pipeline": {"mode": "stream"}, "iterations": ITERATIONS}
    (d / "job.json").write_text(json.dumps({"source": "jobs/demo.yaml", "job": job}))
    if metrics:
        write_lines(d / "metrics.jsonl", [metrics_row(i) for i in range(1, ITERATIONS + 1)])
        scale = {
            "t": 1767225600.0,
            "event": "scale",
            "direction": "out",
            "agent": "rollout-2",
            "site": "h20",
            "reason": "rebalance",
            "iteration": JOINS_AT,
            "delta_s": 1.5,
            "delta_prime_s": 0.9,
        }
        joined = {"t": 1767225601.0, "event": "agent_joined", "agent": "rollout-2", "role": "rollout"}
        write_lines(d / "events.jsonl", [scale, joined])
    return d
