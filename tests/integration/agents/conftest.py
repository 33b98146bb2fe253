"""Tiny jobs for the agent integration tests: real processes, real TCP sockets, this machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is not running
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def alive_agent_pids(events: list[dict]) -> list[int]:
    return [e["ident"]["pid"] for e in events if e["event"] == "agent_started" and _alive(e["ident"]["pid"])]


@pytest.fixture
def tiny_job(tmp_path):
    def make(
        mode: str = "async",
        *,
        iterations: int = 3,
        prompts: int = 4,
        group: int = 4,
        max_tokens: int = 24,
        units: int = 2,
        trainer_ranks: int = 1,
        name: str = "tiny",
        transport: dict | None = None,
    ) -> Path:
        data = {
            "apiVersion": "rlctl/v1",
            "kind": "Job",
            "name": name,
            "inventory": [str(REPO / "clusters" / "local.yaml")],
            "model": {"kind": "builtin", "name": "tiny-demo"},
            "task": {"kind": "digits", "median_output_tokens": 8, "max_output_tokens": max_tokens},
            "iterations": iterations,
            "batch": {"prompts_per_iteration": prompts, "samples_per_prompt": group, "train_micro_batch_samples": 8},
            "pipeline": {"mode": mode},
            "placement": {
                "trainer": {"site": "local", "gpus": trainer_ranks},
                "rollout": [{"site": "local", "gpus": units}],
            },
            "warmup": {"sft_steps": 0},
            "checkpoint": {"every_iterations": 0},
        }
        if transport is not None:
            data["transport"] = transport
        path = tmp_path / f"{name}-{mode}.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    return make
