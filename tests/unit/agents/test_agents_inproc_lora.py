"""A LoRA job end to end in one process (the real controller, trainer and rollout agents over inproc): the trainer
trains adapters alone, the rollout engines compute with the merged weights it publishes what its adapted policy
computes, and the checkpoint's HF directory is that merged model (transformers loads it and agrees)."""

from __future__ import annotations

import pytest
import torch

from rlctl.config.runtime import Lora
from rlctl.models import lora
from rlctl.models.tinygpt import TinyGPT
from tests.unit.agents.test_agents_inproc_job import _job, run_inproc

LORA = Lora(rank=4, alpha=16, target_modules=["q_proj", "v_proj", "down_proj"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("mode", "kl_coef"), [("sync", 0.0), ("stream", 0.0), ("sync", 0.05)]
)  # stream: each version a delta of the merged weights; a KL term: the reference is the base model, no adapters
def test_a_lora_job_runs_and_its_engines_compute_the_trainers_merged_policy(
    tmp_path, mode: str, kl_coef: float
) -> None:
    torch.manual_seed(0)
    job = _job(mode)
    algorithm = job.algorithm.model_copy(update={"kl_coef": kl_coef})
    job = job.model_copy(update={"trainer": job.trainer.model_copy(update={"lora": LORA}), "algorithm": algorithm})
    agents: list = []
    jd, _ = run_inproc(job, tmp_path, f"lora-{mode}", agents_out=agents)
    s = jd.read_json(jd.summary_json)
    assert s["state"] == "done" and s["ledger"]["trained"] == 9
    trainer, units = agents[0], agents[1:]
    policy = trainer.backend.model
    ref = trainer.learner.ref_model
    assert (ref is not None) == (kl_coef > 0) and (ref is None or lora.adapters(ref) == {})
    start = TinyGPT.from_pretrained(jd.init_model).state_dict()
    now = policy.state_dict()
    assert all(torch.equal(now[k], start[k]) for k in start)  # the base weights frozen
    assert any(lin.lora_B.any() for lin in lora.adapters(policy).values())  # the adapters trained
    tokens = torch.randint(0, policy.config.vocab_size, (2, 9))
    with torch.no_grad():
        want = policy(tokens)
        for unit in units:
            assert unit.engine.version == trainer.version == 3
            torch.testing.assert_close(unit.engine.model(tokens), want, rtol=1e-4, atol=1e-5)
    # the last checkpoint's HF directory: the merged model, which transformers loads and computes alike
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(jd.checkpoint(3) / "model", torch_dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, want, rtol=1e-4, atol=1e-4)
