"""`placement.controller_site`: a SLURM controller beside its site's SLURM agents, their jobs and its own placed on
the site's nodes as the inventory gives them (`rlctl.ops.preflight.placement.controller_room_problems`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rlctl.config import load_job
from rlctl.config.job import Job
from rlctl.config.task import DatasetTask
from rlctl.launch.layout import layout
from rlctl.ops import counts
from rlctl.ops.preflight.base import Problem
from rlctl.ops.preflight.placement import controller_room_problems
from tests.conftest import ROOT

H800, H20 = ROOT / "clusters" / "h800-trainer.yaml", ROOT / "clusters" / "h20-rollout.yaml"


def h800_job(
    tmp_path: Path,
    *,
    trainer_gpus: int,
    node: dict[str, Any],
    hosts: str = "h800-[001-016]",
    rollout_at: tuple[str, int] = ("h20", 12),
    **over: Any,
) -> Job:
    """A 7B torch job whose trainer runs on the H800 SLURM site, its nodes (`hosts`) `node`; `over` replaces whole
    sections of the job."""
    inv = yaml.safe_load(H800.read_text())
    inv["sites"]["h800"]["nodes"] = [{"host": hosts, **node}]
    (tmp_path / "h800.yaml").write_text(yaml.safe_dump(inv))
    job = {
        "apiVersion": "rlctl/v1",
        "kind": "Job",
        "name": "room",
        "inventory": [str(tmp_path / "h800.yaml"), str(H20)],
        "model": {"kind": "builtin", "name": "qwen2.5-7b"},
        "task": {"kind": "lengths", "prompt_tokens": 512, "median_output_tokens": 2750, "max_output_tokens": 20000},
        "batch": {"prompts_per_iteration": 128, "samples_per_prompt": 8},
        "placement": {
            "trainer": {"site": "h800", "gpus": trainer_gpus},
            "rollout": [{"site": rollout_at[0], "gpus": rollout_at[1]}],
        },
        "rollout": {"engine": "vllm", "tensor_parallel": 2},
        "trainer": {"backend": "torch"},
        "warmup": {"sft_steps": 0},
        **over,
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    return load_job(tmp_path / "job.yaml")


def room(job: Job, *, reward_workers: int) -> list[Problem]:
    """The check's refusals for the job's agents, its controller scoring with `reward_workers` processes."""
    task = DatasetTask.model_construct(kind="dataset", path="d.jsonl", reward_workers=reward_workers)
    spec = job.spec.model_copy(update={"task": task})
    return controller_room_problems(job, layout(counts.plan_counts(job, job.spec), job.inventory.sites, spec))


def test_a_controller_on_a_site_without_cpus_asks_one_slots_memory_and_fits_beside_the_agents(
    tmp_path: Path,
) -> None:
    """16 nodes of 8 GPUs and 2048 GB, no `cpus`; the trainer on 124 GPUs leaves half a node (1024 GB). The
    controller's 5 cores (4 reward workers) each asked a whole slot's 256 GB, 1280 GB, and check refused it; it
    now asks one slot's 256 GB in all, which fits there."""
    node = {"gpus": 8, "memory_gb": 2048}
    assert room(h800_job(tmp_path, trainer_gpus=124, node=node), reward_workers=4) == []
    # every GPU taken: every GB too, so the controller has no room whatever it asks
    (full,) = room(h800_job(tmp_path, trainer_gpus=128, node=node), reward_workers=4)
    assert "memory: the controller's job asks 244140 MiB" in full.message, full.message  # 256 GB


def test_a_controller_that_fits_the_sites_free_cores_in_all_but_no_one_node_is_refused(tmp_path: Path) -> None:
    """Two nodes of 4 GPUs and 8 cores: the trainer's job (4 ranks × 1 thread) takes one node's GPUs and 4 of its
    cores, the rollout units (4 × 1 GPU × 1 thread) the other's GPUs and 4 cores: 4 cores left on each. The
    controller (7 reward workers: 8 cores, one task on one node) was compared with the 8 left in all and passed;
    its job has no node to start on, and the agents wait for it for ever."""
    one_thread = {
        "rollout": {"engine": "vllm", "tensor_parallel": 1, "threads_per_unit": 1},
        "trainer": {"backend": "torch", "threads_per_rank": 1},
    }
    node = {"gpus": 4, "cpus": 8}
    job = h800_job(tmp_path, trainer_gpus=4, node=node, hosts="h800-[001-002]", rollout_at=("h800", 4), **one_thread)
    (p,) = room(job, reward_workers=7)
    assert p.field == "placement.controller_site"
    assert p.message == (
        "site h800: cores: the controller's job asks 8 cores of one node, and no node has that left beside the "
        "agents' jobs, though the site's nodes have that in all (nodes[].cpus): the controller's SLURM job starts "
        "first and holds its share until the job ends, so an agent's job there waits for it for ever"
    )
    assert "or fewer threads" in p.hint
    # 4 cores fit one node's 4 left; so do 8 where the agents leave one node whole (the rollout units elsewhere)
    assert room(job, reward_workers=3) == []
    job = h800_job(tmp_path, trainer_gpus=4, node=node, hosts="h800-[001-002]", **one_thread)
    assert room(job, reward_workers=7) == []
