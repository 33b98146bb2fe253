"""Plan time vs cluster size: 16, 1,000 and 10,000 GPUs over 4 datacenters (trainer + 3 rollout sites).

The trainer is an H800 site; rollout runs on H20, H100 and A100 sites, each in its own datacenter and
linked to the trainer. GPUs are split evenly over the 4 sites. `make_plan` is timed end to end
(stage curves for every GPU count, Algorithm 1, Algorithm 2, the simulator), best of a few runs.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from rlctl.config import load_job
from rlctl.planner.plan import make_plan

SIZES = [16, 1000, 10000]
SITES = [
    ("train", "H800", "dc-a"),
    ("roll-h20", "H20", "dc-b"),
    ("roll-h100", "H100", "dc-c"),
    ("roll-a100", "A100", "dc-d"),
]


def _nodes(name: str, gpus: int) -> list[dict[str, Any]]:
    full, rest = divmod(gpus, 8)
    out: list[dict[str, Any]] = []
    if full:
        out.append({"host": f"{name}-[0001-{full:04d}]" if full > 1 else f"{name}-0001", "gpus": 8})
    if rest:
        out.append({"host": f"{name}-extra", "gpus": rest})
    return out


def write_cluster(directory: Path, total_gpus: int) -> Path:
    per_site = total_gpus // len(SITES)
    inv = {
        "apiVersion": "rlctl/v1",
        "kind": "Inventory",
        "sites": {
            name: {
                "datacenter": dc,
                "scheduler": {"kind": "ssh", "user": "rl"},
                "gpu": gpu,
                "nodes": _nodes(name, per_site),
                "network": {"bandwidth_gbps": 200},
            }
            for name, gpu, dc in SITES
        },
        "links": [{"between": ["train", name], "bandwidth_gbps": 80, "latency_ms": 5} for name, _, _ in SITES[1:]],
    }
    (directory / "inv.yaml").write_text(yaml.safe_dump(inv))
    job = {
        "apiVersion": "rlctl/v1",
        "kind": "Job",
        "name": f"scale-{total_gpus}",
        "inventory": ["inv.yaml"],
        "model": {"kind": "builtin", "name": "qwen2.5-7b"},
        # rows of up to 4,512 tokens, recomputed: a 7B's FSDP2 rank holds a cut's activations (10.2 GB) on the 4
        # trainer GPUs of 16 (`rlctl.profiler.actmem`; the default 20,000 output tokens fit no count of them)
        "task": {"kind": "lengths", "max_output_tokens": 4000},
        "batch": {"prompts_per_iteration": 128, "samples_per_prompt": 8},
        "rollout": {"engine": "vllm", "max_batch_size": 256},
        "trainer": {"activation_checkpointing": True},
        "placement": {"trainer": {"site": "train"}, "rollout": [{"site": n} for n, _, _ in SITES[1:]]},
    }
    path = directory / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def run(*, quick: bool) -> dict[str, Any]:
    repeats = 1 if quick else 3
    seconds: dict[str, float] = {}
    allocations: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        for n in SIZES:
            sub = Path(d) / str(n)
            sub.mkdir()
            job = load_job(write_cluster(sub, n))
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                plan = make_plan(job)
                best = min(best, time.perf_counter() - t0)
            seconds[str(n)] = round(best, 4)
            allocations[str(n)] = {a["site"]: a["gpus_used"] for a in plan["allocation"]}
    return {
        "seconds_by_gpus": seconds,
        "allocation_by_gpus": allocations,
        "datacenters": len(SITES),
        "target": "10,000 GPUs under 1 s and at most a few times the 16-GPU plan",
    }


def summary(result: dict[str, Any]) -> str:
    s = result["seconds_by_gpus"]
    lines = [
        f"{int(n):>6} GPUs over {result['datacenters']} DCs: plan {t:.3f} s  (GPUs used per site: "
        f"{result['allocation_by_gpus'][n]})"
        for n, t in s.items()
    ]
    ratio = s["10000"] / s["16"]
    lines.append(f"10,000-GPU plan / 16-GPU plan = {ratio:.1f}×; target < 1 s: {'yes' if s['10000'] < 1 else 'NO'}")
    return "\n".join(lines)
