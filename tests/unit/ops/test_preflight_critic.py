"""`rlctl check` judges a PPO trainer rank with its critic (`rlctl.rl.ppo.ValueModel`, a copy of the policy's trunk):
its weights, gradients and AdamW state beside the policy's (`traincost.TRAINED_MODELS`), whole on every rank (the
torch trainer does not shard the critic: FSDP2 with PPO is refused), and its activations where they are the larger
(`rlctl.profiler.actmem.Activations.rank_bytes`)."""

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
        "(recomputed) of a cut's 512 tokens a rank 1.9 GB), and a H800 holds 80 GB (90% usable) (hint: a site whose "
        "GPUs hold the policy and its critic whole (the torch trainer does not shard PPO's critic), the megatron "
        "backend (trainer.backend: megatron, with tensor/pipeline parallel), or GRPO (no critic))"
    )
    assert line in res.stderr.splitlines()  # (the others: a planning-only model and task, the site's ssh key)


def test_a_ppo_rank_is_judged_with_its_critic_whole_where_the_plan_would_shard(tmp_path: Path) -> None:
    """Two GPUs: the plan shards the replica with FSDP2, which PPO's critic does not run (`trainer.shard` refused);
    its ranks' memory is judged as they run, the critic's state and the policy's whole, not as 128.6 GB of state ÷ 2
    (72.7 GB a rank, refused at batch.train_micro_batch_tokens with a hint to shorten the rows, which cannot help)."""
    job = load_job(qwen3_4b_job(tmp_path, algorithm="ppo", gpus=2))
    assert counts.plan_counts(job, job.spec)["trainer"]["parallel"] == {"tp": 1, "pp": 1, "dp": 2, "fsdp": True}
    assert [p.message.split(":")[0] for p in refused(job, "trainer.shard")] == ["FSDP (needed"]
    (p,) = refused(job, "placement.trainer.gpus")
    assert "at tp 1 pp 1 dp 2 need 132.6 GB each (the policy's and its critic's weights and gradients" in p.message
