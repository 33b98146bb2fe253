"""`rlctl launch` of a job whose torch trainer shards its replica over two ranks with FSDP2 (`trainer.shard:
fsdp`, over gloo on this CPU machine: the code the GPU path runs over NCCL): the plan says so, both ranks build
the sharded model, every prompt is trained once, the units take versions as deltas both ranks encoded from their
own shards, and each rank checkpoints its own part of the policy and of AdamW's state beside the HF model of the
version it published."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlctl.models.weightfiles import load_state_dict
from tests.integration.hfdemo import check_and_launch, hf_demo_job

from .test_agents_megatron_job import LENGTH_REWARD

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_a_job_with_an_fsdp_sharded_trainer_runs_and_checkpoints_each_part(tmp_path: Path) -> None:
    job = hf_demo_job(
        tmp_path,
        reward=LENGTH_REWARD,
        iterations=3,
        batch={"prompts_per_iteration": 4, "samples_per_prompt": 4},
        placement={"trainer": {"site": "local", "gpus": 2}, "rollout": [{"site": "local", "gpus": 1}]},
        trainer={"shard": "fsdp"},
        checkpoint={"every_iterations": 2},
        weight_sync={"mode": "delta"},
    )
    run = tmp_path / "run"
    s = check_and_launch(job, run)
    assert s["state"] == "done" and s["iterations"] == 3
    assert s["ledger"]["prompts"] == s["ledger"]["trained"] == 12
    assert (s["ledger"]["lost"], s["ledger"]["duplicated"]) == (0, 0)
    parallel = json.loads((run / "plan.json").read_text())["trainer"]["parallel"]
    # the tiny model's step of gradients fits beside its shards: FSDP2 reduce-scatters them once a step
    assert parallel == {"tp": 1, "pp": 1, "dp": 2, "fsdp": True, "reduce_per_step": True}
    for rank in (0, 1):
        log = next(run.glob(f"**/trainer-{rank}*.log")).read_text()
        assert "trainer backend torch, tp 1 pp 1 fsdp (gradients reduced once a step)" in log, log[:2000]
    versions = json.loads((run / "summary.json").read_text())["weights"]["versions"]
    assert len(versions) == 3 and versions[0]["encodings"] == {"full": 1}
    start = load_state_dict(tmp_path / "model")
    for it in (2, 3):
        ckpt = run / "checkpoints" / f"iter-{it}"
        ranks = sorted(p.name for p in (ckpt / "ranks").glob("rank-*.pt"))
        assert ranks == ["rank-0.pt", "rank-1.pt"]  # every rank wrote its own part
        halves = [torch.load(ckpt / "ranks" / name, weights_only=True)["module.policy"] for name in ranks]
        gathered = load_state_dict(ckpt / "model")  # the HF directory: the weights both ranks gathered
        for name, full in gathered.items():  # (fp32: the demo's checkpoint dtype)
            assert torch.equal(torch.cat([h[name] for h in halves]), full), name
        assert not torch.equal(gathered["model.norm.weight"], start["model.norm.weight"])  # it trained


def test_a_ppo_job_shards_its_critic_with_the_policy(tmp_path: Path) -> None:
    """PPO with `trainer.shard: fsdp` runs (versus refused by `rlctl check`: 'shards the policy, but not PPO's
    critic'): each rank checkpoints its own rows of the critic (its trunk and value head) beside the policy's."""
    job = hf_demo_job(
        tmp_path,
        reward=LENGTH_REWARD,
        iterations=2,
        batch={"prompts_per_iteration": 4, "samples_per_prompt": 4},
        placement={"trainer": {"site": "local", "gpus": 2}, "rollout": [{"site": "local", "gpus": 1}]},
        trainer={"shard": "fsdp"},
        algorithm={"kind": "ppo"},
        checkpoint={"every_iterations": 2},
    )
    run = tmp_path / "run"
    s = check_and_launch(job, run)
    assert s["state"] == "done" and s["iterations"] == 2
    assert s["ledger"]["prompts"] == s["ledger"]["trained"] == 8
    ckpt = run / "checkpoints" / "iter-2" / "ranks"
    halves = [torch.load(ckpt / f"rank-{r}.pt", weights_only=True) for r in (0, 1)]
    embed = load_state_dict(tmp_path / "model")["model.embed_tokens.weight"]
    critic = [h["module.critic"]["body.model.embed_tokens.weight"] for h in halves]
    assert sum(c.shape[0] for c in critic) == embed.shape[0] and all(c.shape[0] < embed.shape[0] for c in critic)
    head = torch.cat([h["module.critic"]["head.weight"] for h in halves])
    assert head.shape == (1, embed.shape[1]) and head.abs().sum() > 0  # trained from zeros
    assert all(set(h["optimizer.critic"]["state"]) for h in halves)  # each rank's AdamW state of its rows
