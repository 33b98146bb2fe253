"""Staleness beyond one step (issue 25): the demo job in sync mode and at η = 1, 2, 4, and at η = 1 without
migration, each run as `rlctl launch` runs it (controller, trainer and two rollout units as processes), the
same iterations and seeds, configurations interleaved (the machine is shared).

Per configuration (mean over the seeds, and each seed's figure):

- `samples_per_s`: trained samples over the run (first dispatch → last optimizer step);
- `discarded_tokens`: generated, then thrown away (a group with no buffer left within its bound);
- `all_idle`: the share of the run during which no unit held a sample in flight (the ledger's dispatch and
  finish times of each sample's last attempt: the time every unit waited at once — for weights, for the
  trainer's next version);
- `tail_share`: per iteration, the time from its 90 % finished sample to its last, over its generation span
  (first dispatch → last finish): the long tail's share; migration moves the tail's work to idle units;
- `migrated`: samples units gave back to go to a unit with free rows; `resumed`, `resumed_tokens`: samples
  that continued from an earlier attempt's output and the tokens that kept from being generated again;
- `reward_last`, `heldout_exact`: the sampled reward of the last iterations and held-out greedy accuracy
  of the final policy; `staleness_violations` (must be 0).

`eta4_over_eta1`, `eta2_over_eta1`: throughput at η = 4 and 2 over η = 1 in the same run (the issue's goal:
η = 4 ≥ 1.3 × η = 1 on the skewed demo); `tail_share_migration`: η = 1 with and without migration.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench import demo
from bench.jobrun import JobRun, launch

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "jobs" / "demo.yaml"
# name → (pipeline mode, η, migration)
CONFIGS: dict[str, tuple[str, int, bool]] = {
    "sync": ("sync", 0, True),
    "eta1": ("async", 1, True),
    "eta2": ("async", 2, True),
    "eta4": ("async", 4, True),
    "eta1_no_migration": ("async", 1, False),
}
TAIL_QUANTILE = 0.9
SVG = ROOT / "docs" / "staleness-curves.svg"  # the full run's reward curves (`--quick` writes nothing)
# the plot's label and colour of each configuration
LABELS = {"sync": "sync", "eta1": "η 1", "eta2": "η 2", "eta4": "η 4", "eta1_no_migration": "η 1 no migr."}
COLORS = {"sync": "#1f77b4", "η 1": "#d62728", "η 2": "#ff7f0e", "η 4": "#2ca02c", "η 1 no migr.": "#9467bd"}


def _job(mode: str, eta: int, migrate: bool, *, seed: int, iterations: int, quick: bool) -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load(JOB.read_text())
    job["inventory"] = [str(ROOT / "clusters" / "local.yaml")]
    job["iterations"] = iterations
    job["seed"] = seed
    job["pipeline"] = {"mode": mode} if mode == "sync" else {"mode": mode, "staleness": eta}
    job["rollout"] = {**job.get("rollout", {}), "migrate": migrate}
    job["checkpoint"] = {"every_iterations": 0}
    if quick:
        job["warmup"] = {"sft_steps": 50}
        job["evaluation"] = {"heldout_prompts": 32}
    return job


def all_idle(ledger: list[dict[str, Any]]) -> float:
    """The share of [first dispatch, last finish] when no unit held a sample in flight."""
    spans = sorted(
        (e["dispatched_at"], e["finished_at"])
        for e in ledger
        if e["dispatched_at"] is not None and e["finished_at"] is not None
    )
    if not spans:
        return 0.0
    start, end = spans[0][0], max(t1 for _, t1 in spans)
    covered, reach = 0.0, start
    for t0, t1 in spans:
        if t1 > reach:
            covered += t1 - max(t0, reach)
            reach = t1
    return round(1 - covered / (end - start), 4) if end > start else 0.0


def tail_share(ledger: list[dict[str, Any]], *, skip: int = 1) -> float:
    """Mean over iterations (after the first `skip`) of (last finish − 90 % finish) / (last finish − first dispatch)."""
    by_it: dict[int, list[dict[str, Any]]] = {}
    for e in ledger:
        by_it.setdefault(e["iteration"], []).append(e)
    shares = []
    for it, es in sorted(by_it.items()):
        if it < skip:
            continue
        ends = sorted(e["finished_at"] for e in es)
        first = min(e["dispatched_at"] for e in es)
        q = ends[int(TAIL_QUANTILE * (len(ends) - 1))]
        if ends[-1] > first:
            shares.append((ends[-1] - q) / (ends[-1] - first))
    return round(statistics.fmean(shares), 4) if shares else 0.0


def figures(run: JobRun) -> dict[str, Any]:
    s = run.summary
    led = s["ledger"]
    held = s.get("heldout") or {}
    return {
        "samples_per_s": s["samples_per_s"],
        "run_s": s["run_s"],
        "discarded_tokens": led["discarded_tokens"],
        "all_idle": all_idle(run.ledger),
        "tail_share": tail_share(run.ledger),
        "migrated": led["migrated"],
        "resumed": led["partials"]["resumed"],
        "resumed_tokens": led["partials"]["resumed_tokens"],
        "reward_last": s["reward_last"],
        "heldout_exact": held.get("greedy_exact_last"),
        "staleness_violations": s["staleness_violations"],
        "lost": led["lost"],
        "duplicated": led["duplicated"],
        "reward_curve": s["reward_curve"],
    }


def _mean(runs: list[dict[str, Any]], key: str) -> float | None:
    xs = [r[key] for r in runs if r[key] is not None]
    return round(statistics.fmean(xs), 4) if xs else None


def run(*, quick: bool) -> dict[str, Any]:
    seeds, iterations = ((0,), 12) if quick else ((0, 1, 2), 60)
    per: dict[str, list[dict[str, Any]]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="rlctl-bench-staleness-") as tmp:
        for i, seed in enumerate(seeds):
            order = list(CONFIGS) if i % 2 == 0 else list(reversed(CONFIGS))
            for name in order:
                mode, eta, migrate = CONFIGS[name]
                job = _job(mode, eta, migrate, seed=seed, iterations=iterations, quick=quick)
                per[name].append(figures(launch(job, workdir=Path(tmp), name=f"{name}-s{seed}")))
    keys = ("samples_per_s", "discarded_tokens", "all_idle", "tail_share", "migrated", "resumed", "resumed_tokens")
    res: dict[str, Any] = {
        "iterations": iterations,
        "seeds": list(seeds),
        "configs": {
            name: {
                **{k: _mean(runs, k) for k in (*keys, "reward_last", "heldout_exact")},
                "per_seed": {k: [r[k] for r in runs] for k in ("samples_per_s", "reward_last", "heldout_exact")},
                "reward_curves": [r["reward_curve"] for r in runs],
            }
            for name, runs in per.items()
        },
        "staleness_violations": sum(r["staleness_violations"] for runs in per.values() for r in runs),
        "lost": sum(r["lost"] for runs in per.values() for r in runs),
        "duplicated": sum(r["duplicated"] for runs in per.values() for r in runs),
    }
    sps = {name: res["configs"][name]["samples_per_s"] for name in CONFIGS}
    res["eta4_over_eta1"] = round(sps["eta4"] / sps["eta1"], 3)
    res["eta2_over_eta1"] = round(sps["eta2"] / sps["eta1"], 3)
    res["eta1_over_sync"] = round(sps["eta1"] / sps["sync"], 3)
    res["tail_share_migration"] = {
        "with": res["configs"]["eta1"]["tail_share"],
        "without": res["configs"]["eta1_no_migration"]["tail_share"],
    }
    if not quick:
        SVG.write_text(curves(res))
    return res


def curves(result: dict[str, Any]) -> str:
    """The sampled reward curves of every configuration and seed (docs/staleness-curves.svg)."""
    runs = [
        {"mode": LABELS[name], "seed": seed, "reward_curve": curve}
        for name, c in result["configs"].items()
        for seed, curve in zip(result["seeds"], c["reward_curves"], strict=True)
    ]
    return demo.svg(runs, colors=COLORS)


def summary(result: dict[str, Any]) -> str:
    lines = [f"{len(result['seeds'])} seed(s) × {result['iterations']} iterations per configuration"]
    for name, c in result["configs"].items():
        lines.append(
            f"  {name:18s} {c['samples_per_s']:6.1f} samples/s  discarded {c['discarded_tokens']:7.0f} tokens  "
            f"all idle {c['all_idle']:.3f}  tail {c['tail_share']:.3f}  migrated {c['migrated']:5.0f}  "
            f"reward {c['reward_last']:.3f}  held-out {c['heldout_exact']}"
        )
    tail = result["tail_share_migration"]
    lines.append(
        f"  η4/η1 {result['eta4_over_eta1']:.2f} (goal ≥ 1.3)  η2/η1 {result['eta2_over_eta1']:.2f}  η1/sync "
        f"{result['eta1_over_sync']:.2f}  tail share with/without migration {tail['with']:.3f} / "
        f"{tail['without']:.3f}  staleness violations {result['staleness_violations']}"
    )
    return "\n".join(lines)
