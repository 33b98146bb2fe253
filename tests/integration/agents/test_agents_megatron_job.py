"""`rlctl launch` of a job whose trainer is the Megatron-core backend on two trainer ranks over gloo, the HF
demo's Qwen2-architecture checkpoint and one rollout unit with the embedded engine, in the layouts a job can
ask for: data parallel (tp 1, dp 2: each rank a whole megatron GPTModel), one tensor-parallel group
(`trainer.tensor_parallel: 2` → the plan's tp 2 pp 1 dp 1: each rank half of every layer) and one pipeline
(`trainer.pipeline_parallel: 2` → tp 1 pp 2 dp 1: each rank one stage, the tied embedding's copy on the
last). The job finishes, every prompt is trained once, both ranks encode each delta (they are roots of the
same version: had their gathered weights differed by a bit, the halves would not assemble into a delta that
verifies), and the final checkpoint is the full HF model the training moved."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.integration.hfdemo import check_and_launch, hf_demo_job
from tests.unit.trainers.megatron_required import require_megatron

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]

# the untrained model (no SFT warm-up) scores 0 on the demo's reward: this one differs within each group, so
# the advantages, and the updates, are not 0
LENGTH_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return len(solution_str.split()) % 3 / 2
"""


def split_model(directory: Path, *, tp: int, pp: int) -> None:
    """The HF demo's checkpoint reshaped so that tp and pp split it: at tp 2, 2 heads of 48 (the demo has 3 of
    32) and a vocabulary of 44 (43 words and one unused token, added to the tokenizer); at pp 2, 2 layers (the
    demo has 3): one per stage."""
    import torch

    from rlctl.models.hf import read_config
    from rlctl.models.tinygpt import TinyGPT

    c = read_config(directory)
    if tp > 1:
        tok = json.loads((directory / "tokenizer.json").read_text())
        vocab = tok["model"]["vocab"]
        vocab["<|unused|>"] = len(vocab)
        (directory / "tokenizer.json").write_text(json.dumps(tok))
        c = dataclasses.replace(c, vocab_size=len(vocab), num_attention_heads=2, num_key_value_heads=2)
    if pp > 1:
        c = dataclasses.replace(c, num_hidden_layers=2)
    torch.manual_seed(0)
    TinyGPT(c).save_pretrained(directory)


@pytest.mark.parametrize(
    "tp,pp,parallel,algorithm",
    [
        (1, 1, {"tp": 1, "pp": 1, "dp": 2}, "grpo"),
        (2, 1, {"tp": 2, "pp": 1, "dp": 1}, "grpo"),
        (1, 2, {"tp": 1, "pp": 2, "dp": 1}, "grpo"),
        (2, 1, {"tp": 2, "pp": 1, "dp": 1}, "ppo"),  # the critic a second GPTModel of each rank's shard
        (1, 1, {"tp": 1, "pp": 1, "dp": 2}, "ppo"),  # each rank trains half of every micro-batch
    ],
    ids=["data-parallel", "tensor-parallel-2", "pipeline-parallel-2", "ppo-tensor-parallel-2", "ppo-data-parallel"],
)
def test_a_job_with_the_megatron_trainer_backend_runs_end_to_end(
    tmp_path: Path, tp: int, pp: int, parallel: dict, algorithm: str
) -> None:
    require_megatron()
    trainer = (
        {"backend": "megatron"}
        | ({"tensor_parallel": tp} if tp > 1 else {})
        | ({"pipeline_parallel": pp} if pp > 1 else {})
    )
    job = hf_demo_job(
        tmp_path,
        reward=LENGTH_REWARD,
        iterations=3,
        batch={"prompts_per_iteration": 4, "samples_per_prompt": 4},
        algorithm={"kind": algorithm, "lr": 1.0e-4},
        placement={"trainer": {"site": "local", "gpus": 2}, "rollout": [{"site": "local", "gpus": 1}]},
        trainer=trainer,
        weight_sync={"mode": "delta"},  # the two ranks split each delta's encoding
    )
    if tp > 1 or pp > 1:
        split_model(tmp_path / "model", tp=tp, pp=pp)
    run = tmp_path / "run"
    s = check_and_launch(job, run)
    assert s["state"] == "done" and s["iterations"] == 3
    assert s["ledger"]["prompts"] == s["ledger"]["trained"] == 12
    assert (s["ledger"]["lost"], s["ledger"]["duplicated"]) == (0, 0)
    assert json.loads((run / "plan.json").read_text())["trainer"]["parallel"] == parallel
    # both ranks built their part of the Megatron model as the plan says, and both encoded each delta
    for rank in (0, 1):
        log = next(run.glob(f"**/trainer-{rank}*.log")).read_text()
        assert f'"tp": {tp}' in log and f"trainer backend megatron, tp {tp} pp {pp}" in log, log[:2000]
        assert "encoded by 2 ranks" in log, log[-2000:]
    # the unit rebuilt and verified versions 2 and 3 from those deltas
    versions = json.loads((run / "summary.json").read_text())["weights"]["versions"]
    assert [v["encodings"] for v in versions] == [{"full": 1}, {"delta": 1}, {"delta": 1}]
    # the final checkpoint: the full HF directory (Qwen2, shards gathered) the training moved from the start
    import torch

    from rlctl.models.weightfiles import load_state_dict

    final, start = load_state_dict(run / "checkpoints" / "iter-3" / "model"), load_state_dict(tmp_path / "model")
    assert json.loads((run / "checkpoints/iter-3/model/config.json").read_text())["architectures"] == [
        "Qwen2ForCausalLM"
    ]
    assert sorted(final) == sorted(start)
    assert all(final[k].shape == start[k].shape for k in start)
    assert not all(torch.equal(final[k], start[k]) for k in start)
    if algorithm == "ppo":  # each rank of data-parallel replica 0 writes its shard: its part of the critic and both
        # optimizers' state (at tp 2 each of the two ranks half; at dp 2 rank 0 alone, the other replica holds the same)
        ranks = run / "checkpoints" / "iter-3" / "ranks"
        assert sorted(p.name for p in ranks.glob("rank-*.pt")) == [f"rank-{r}.pt" for r in range(tp * pp)]
        for rank in range(tp * pp):
            shard = torch.load(ranks / f"rank-{rank}.pt", weights_only=True)
            assert {"optimizer.policy", "optimizer.critic", "module.critic"} <= set(shard)
            assert shard["module.critic"]["head.weight"].abs().sum() > 0  # the value head trained from 0
