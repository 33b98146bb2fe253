"""`rlctl launch` of a job on a Qwen3 checkpoint (per-head q/k RMSNorm, an explicit head_dim), on a Llama 3.1 one (its
`llama3` RoPE scaling over a 32-token pretraining context, which the job's prompts and outputs pass), on a Phi3 one
(grouped-query attention; its file's q/k/v one `qkv_proj` and gate/up one `gate_up_proj`) and on a Mistral whose
sliding_window binds as v0.1's does, at exactly the job's context (its longest prompt + max_output_tokens, which `rlctl
check` passes), and on a Qwen3MoE (routed experts, a dense layer) and a Qwen2MoE (the same beside a gated shared
expert): each runs its rollout units and trainer to the end,
every prompt trained once and the weights moving, and the model a checkpoint holds keeps its architecture: its
config.json the starting model's keys (the Mistral's window), its file the tensors transformers writes of it (Phi3's
fused ones, a Qwen3MoE's experts one by one), and transformers loads it and computes rlctl's logits over the job's whole
context. The jobs train with the policy loss's aggregations (GRPO's per-sample mean, Dr. GRPO's constant normaliser, the
token mean)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlctl.agents.common import job_context
from rlctl.config import load_job
from rlctl.models.tinygpt import TinyGPT
from rlctl.models.weightfiles import load_state_dict
from tests.integration.hfdemo import check_and_launch, hf_demo_job

from .test_agents_megatron_job import LENGTH_REWARD

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

# the config.json keys each architecture's export must keep as its starting model has them
KEPT = (
    "architectures",
    "model_type",
    "rope_scaling",
    "head_dim",
    "num_key_value_heads",
    "tie_word_embeddings",
    "sliding_window",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
    "mlp_only_layers",
    "shared_expert_intermediate_size",
)


@pytest.mark.parametrize(
    ("shape", "aggregation"),
    [
        ("tiny-qwen3", "sequence_mean"),
        ("tiny-llama3", "constant"),
        ("tiny-phi3", "token_mean"),
        ("tiny-mistral-window", "token_mean"),
        ("tiny-qwen3moe", "token_mean"),
        ("tiny-qwen2moe", "sequence_mean"),
    ],
)
def test_a_job_on_a_qwen3_llama3_phi3_windowed_mistral_or_moe_checkpoint_trains_and_checkpoints_its_architecture(
    tmp_path: Path, shape: str, aggregation: str
) -> None:
    transformers = pytest.importorskip("transformers")
    job = hf_demo_job(
        tmp_path,
        shape=shape,
        reward=LENGTH_REWARD,
        iterations=3,
        batch={"prompts_per_iteration": 4, "samples_per_prompt": 4},
        checkpoint={"every_iterations": 3},
        algorithm={"kind": "grpo", "lr": 1e-4, "loss_aggregation": aggregation},
    )
    run = tmp_path / "run"
    s = check_and_launch(job, run)
    assert s["state"] == "done" and s["iterations"] == 3
    assert s["ledger"]["prompts"] == s["ledger"]["trained"] == 12
    assert (s["ledger"]["lost"], s["ledger"]["duplicated"]) == (0, 0)
    ckpt = run / "checkpoints" / "iter-3" / "model"
    want = json.loads((tmp_path / "model" / "config.json").read_text())
    got = json.loads((ckpt / "config.json").read_text())
    assert {k: got.get(k) for k in KEPT} == {k: want.get(k) for k in KEPT}
    start, trained = load_state_dict(tmp_path / "model"), load_state_dict(ckpt)
    assert set(trained) == set(start)  # q_norm/k_norm, Phi3's fused tensors, where the architecture has them, kept
    assert not torch.equal(trained["model.norm.weight"], start["model.norm.weight"])  # it trained
    context = job_context(load_job(job).spec)  # 32 prompt + 64 output tokens: past Llama 3.1's 32
    tokens = torch.arange(3, 3 + context).remainder(int(want["vocab_size"])).unsqueeze(0)
    ours = TinyGPT.from_pretrained(ckpt, context=context).eval()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(ckpt, torch_dtype=torch.float32).eval()
    theirs.save_pretrained(tmp_path / "theirs")  # the names transformers writes, none left out (a MoE's experts apart)
    assert set(trained) == set(load_state_dict(tmp_path / "theirs"))
    if shape == "tiny-mistral-window":  # binding (below max_position_embeddings), at the job's context exactly
        assert got["sliding_window"] == theirs.config.sliding_window == context < got["max_position_embeddings"]
    if shape in ("tiny-qwen3moe", "tiny-qwen2moe"):  # routers and experts trained (each rank's gradient of each)
        moved = {
            k.split(".mlp.")[1].split(".")[0] for k in trained if ".mlp." in k and not torch.equal(trained[k], start[k])
        }
        shared = {"shared_expert", "shared_expert_gate"} if shape == "tiny-qwen2moe" else set()
        assert {"gate", "experts", "gate_proj", *shared} <= moved  # (gate_proj: the dense layer's)
    if shape == "tiny-phi3":
        fused = {k.rpartition(".")[0].rpartition(".")[2] for k in trained if k.startswith("model.layers.0.")}
        assert {"qkv_proj", "gate_up_proj"} <= fused and not fused & {"q_proj", "k_proj", "v_proj", "gate_proj"}
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), theirs(tokens).logits, atol=1e-4, rtol=1e-4)
