"""`rlctl check` judges a PPO trainer rank with its critic (`rlctl.rl.ppo.ValueModel`, a copy of the policy's trunk):
its weights, gradients and AdamW state beside the policy's (`traincost.TRAINED_MODELS`), divided over dp as the
policy's where FSDP2 shards them (`rlctl.trainers.fsdp.shard_critic`), whole on every rank otherwise, and its
activations where they are the larger (`rlctl.profiler.actmem.Activations.rank_bytes`)."""

from __future__ import annotations

from pathlib import Path

from rlctl.config import load_job
from rlctl.ops import counts
from tests.conftest import run_cli
from tests.unit.ops.test_preflight import GPU_CLUSTERS, load, refused


def qwen3_4b_job(tmp_path: Path, *, algorithm: str, gpus: int) -> Path:
    """Qwen3-4B on H800s, rows of up to 512 tokens, recomputed: as GRPO one rank holds its 16 B a parameter and the
    cut's activations (68.3 GB of 72 usable); PPO's critic doubles the state."""
    job = load(
        tmp_path,
        inventory=GPU_CLUSTERS,
        model={"kind": "builtin", "name": "qwen3-4b"},
        task={"kind": "lengths", "prompt_tokens": 128, "median_output_tokens": 300, "max_output_tokens": 384},
        batch={"prompts_per_iteration": 16, "samples_per_prompt": 8, "train_micro_batch_tokens": 512},
        placement={"trainer": {"site": "h800", "gpus": gpus}, "rollout": [{"site": "h20", "gpus": 8}]},
        rollout={"engine": "vllm", "tensor_parallel": 1},
        trainer={"backend": "torch", "activation_checkpointing": True},
        algorithm={"kind": algorithm},
    )
    return job.path


def test_a_ppo_job_that_fits_as_grpo_is_refused_with_its_critic(tmp_path: Path) -> None:
    grpo = load_job(qwen3_4b_job(tmp_path, algorithm="grpo", gpus=1))
    assert refused(grpo, "placement.trainer.gpus") == refused(grpo, "batch.train_micro_batch_tokens") == []
    path = qwen3_4b_job(tmp_path, algorithm="ppo", gpus=1)
    res = run_cli("check", str(path))
    assert res.exit_code == 2
    line = (
        f"rlctl: error: {path}: placement.trainer.gpus: the trainer's 1 rank(s) at tp 1 pp 1 dp 1 need 132.6 GB each "
        "(the policy's and its critic's weights and gradients 34.2 GB, optimizer state 96.5 GB, activations "
        "(recomputed) of a cut's 512 tokens a rank 1.9 GB), and a H800 holds 80 GB (90% usable) (hint: give the "
        "trainer more GPUs and let it shard (trainer.shard: auto or fsdp), or a bigger site)"
    )
    assert line in res.stderr.splitlines()  # (the others: a planning-only model and task, the site's ssh key)


def test_a_ppo_rank_is_judged_with_its_critic_sharded_where_the_plan_shards(tmp_path: Path) -> None:
    """Where the plan shards the replica with FSDP2, PPO's critic is sharded with the policy: check runs what plan
    chose (no trainer.shard refusal, versus 'FSDP (needed…) shards the policy, but not PPO's critic') and judges the
    critic's state ÷ dp as the policy's: on 2 H800s 128.6 GB of state ÷ 2 (72.7 GB a rank, 0.7 GB over: refused at
    the cut's rows), on 4 nothing refused, versus 132.6 GB a rank however many GPUs."""
    job = load_job(qwen3_4b_job(tmp_path, algorithm="ppo", gpus=2))
    assert counts.plan_counts(job, job.spec)["trainer"]["parallel"] == {"tp": 1, "pp": 1, "dp": 2, "fsdp": True}
    assert refused(job, "trainer.shard") == refused(job, "placement.trainer.gpus") == []
    (p,) = refused(job, "batch.train_micro_batch_tokens")
    state = "the policy's and its critic's weights, gradients and optimizer state 128.6 GB ÷ 2 (FSDP2)"
    assert f"at tp 1 pp 1 dp 2 need 72.7 GB each ({state}" in p.message
    (tmp_path / "four").mkdir()
    four = load_job(qwen3_4b_job(tmp_path / "four", algorithm="ppo", gpus=4))
    assert counts.plan_counts(four, four.spec)["trainer"]["parallel"] == {"tp": 1, "pp": 1, "dp": 4, "fsdp": True}
    for field in ("trainer.shard", "placement.trainer.gpus", "batch.train_micro_batch_tokens"):
        assert refused(four, field) == [], field
