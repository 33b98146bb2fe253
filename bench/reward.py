"""What a reward that hangs costs a job: the hf-demo job (untrained tiny Qwen2, its dataset and its reward, one
trainer rank and two rollout units on this machine) run to its end through `rlctl launch`, once with its reward
and once with the same reward sleeping past `reward_timeout_s` on 2 % of calls, back to back in this run, at
η = 1 and η = 2.

Rewards are scored beside the controller as samples arrive (8 reward workers: a hung call holds its worker
until the timeout kills it, or until its sample is filtered out and the call cancelled), and a group occupies
the earliest staleness buffer that keeps every reservation within the bound (`rlctl.agents.buffers`); a sample
whose reward holds the trainer's iteration past the stall limit is filtered out and its group trains without it
(a group that would keep fewer than 2 samples is generated again and a finished later group takes its place:
`ControllerCore.unstick`). Per η:

- `period_s_clean`, `period_s_hung`: mean time per iteration after the first (between `trained` rows);
- `hung_loss` = 1 − period_clean / period_hung: the share of the job's time lost to the hung calls (the
  issue's goal: ≤ 0.10 with 2 % of calls hung);
- `wall_s_*`: `rlctl launch` end to end; `timeouts`: the calls that hit the timeout (the summary's
  reward_failures); `filtered`: samples left out of their group because their reward held the trainer,
  `aborted`: groups generated again for it, and `discarded_tokens` the tokens that threw away.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
HANG_RATE = 0.02
TIMEOUT_S = 2.0
WORKERS = 8

REWARD = """
import importlib.util, random, time

_spec = importlib.util.spec_from_file_location("hf_demo_reward", {base!r})
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if random.random() < {rate!r}:  # a hung call: sleeps well past the job's reward_timeout_s
        time.sleep(600)
    return _base.compute_score(data_source, solution_str, ground_truth, extra_info)
"""


def _build(root: Path) -> None:
    argv = [sys.executable, str(REPO / "jobs/hf-demo/build.py"), "--out", str(root), "--sft-steps=0", "--rows=512"]
    subprocess.run(argv, check=True, capture_output=True, timeout=600)


def _job(root: Path, name: str, *, rate: float, eta: int, iterations: int) -> Path:
    (root / f"{name}.py").write_text(REWARD.format(base=str(REPO / "jobs/hf-demo/reward.py"), rate=rate))
    inv = {
        "apiVersion": "rlctl/v1",
        "kind": "Inventory",
        "sites": {
            "here": {
                "datacenter": "dc",
                "scheduler": {"kind": "local"},
                "gpu": "CPU",
                "nodes": [{"host": "localhost", "gpus": 3}],
            }
        },
    }
    (root / "inventory.yaml").write_text(yaml.safe_dump(inv))
    job = yaml.safe_load((REPO / "jobs/hf-demo.yaml").read_text())
    job.update(
        name=name,
        inventory=["inventory.yaml"],
        model={"kind": "hf", "path": "model"},
        iterations=iterations,
        batch={"prompts_per_iteration": 8, "samples_per_prompt": 8, "train_micro_batch_tokens": 1024},
        pipeline={"mode": "async", "staleness": eta},
        placement={"trainer": {"site": "here", "gpus": 1}, "rollout": [{"site": "here", "gpus": 2}]},
        tracking=[],
    )
    job["task"].update(
        path="data.jsonl", reward=f"{name}.py:compute_score", reward_timeout_s=TIMEOUT_S, reward_workers=WORKERS
    )
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _launch(root: Path, name: str, **kw: Any) -> dict[str, Any]:
    job = _job(root, name, **kw)
    run = root / f"run-{name}"
    argv = [sys.executable, "-m", "rlctl", "launch", str(job), "--job-dir", str(run), "-o", "json"]
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=REPO)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"job {name} failed (exit {proc.returncode}): {proc.stderr.strip()[-600:]}")
    s = json.loads(proc.stdout)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    ends = sorted(r["t"] for r in rows)
    return {
        "wall_s": round(wall, 2),
        "period_s": (ends[-1] - ends[0]) / (len(ends) - 1),
        "timeouts": int(s["reward_failures"]),
        "discarded_tokens": int(s["ledger"].get("discarded_tokens", 0)),
        "aborted": int(s["ledger"].get("aborted", 0)),
        "filtered": int(s["ledger"].get("filtered", 0)),
        "lost": s["ledger"]["lost"],
        "duplicated": s["ledger"]["duplicated"],
    }


def run(*, quick: bool) -> dict[str, Any]:
    iterations = 6 if quick else 16
    etas = [1] if quick else [1, 2]
    out: dict[str, Any] = {"hang_rate": HANG_RATE, "reward_timeout_s": TIMEOUT_S, "iterations": iterations}
    with tempfile.TemporaryDirectory(prefix="rlctl-bench-reward-") as tmp:
        root = Path(tmp)
        _build(root)
        for eta in etas:
            clean = _launch(root, f"clean-eta{eta}", rate=0.0, eta=eta, iterations=iterations)
            hung = _launch(root, f"hung-eta{eta}", rate=HANG_RATE, eta=eta, iterations=iterations)
            out[f"eta{eta}"] = {
                "period_s_clean": round(clean["period_s"], 3),
                "period_s_hung": round(hung["period_s"], 3),
                "hung_loss": round(1 - clean["period_s"] / hung["period_s"], 3),
                "wall_s_clean": clean["wall_s"],
                "wall_s_hung": hung["wall_s"],
                "timeouts": hung["timeouts"],
                "discarded_tokens": hung["discarded_tokens"],
                "aborted": hung["aborted"],
                "filtered": hung["filtered"],
                "lost": clean["lost"] + hung["lost"],
                "duplicated": clean["duplicated"] + hung["duplicated"],
            }
    out["hung_loss"] = statistics.fmean(out[f"eta{e}"]["hung_loss"] for e in etas)
    return out


def summary(r: dict[str, Any]) -> str:
    lines = [f"{r['hang_rate']:.0%} of reward calls hang past reward_timeout_s={r['reward_timeout_s']:g} s"]
    for key in sorted(k for k in r if k.startswith("eta")):
        e = r[key]
        lines.append(
            f"  η={key[3:]}: {e['period_s_clean']:.3f} s/iteration clean, {e['period_s_hung']:.3f} s hung "
            f"({e['timeouts']} timeouts): {e['hung_loss']:.1%} of the time lost; "
            f"{e['filtered']} samples filtered, {e['aborted']} groups aborted, "
            f"{e['discarded_tokens']} tokens discarded; "
            f"wall {e['wall_s_clean']:.0f} s vs {e['wall_s_hung']:.0f} s"
        )
    return "\n".join(lines)
