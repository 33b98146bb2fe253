"""`rlctl launch` of a LoRA job on gate/up/down of a Qwen2MoE (`hf-demo --shape tiny-qwen2moe`: top 2 of 4 experts and
a gated shared expert in layers 0 and 2, layer 1 dense): the trainer adapts each routed expert's projections, the
shared expert's and the dense layer's, never a router (`mlp.gate`, `mlp.shared_expert_gate`), and the adapters its
checkpoint holds are those `rlctl plan` and `rlctl check` price (`traincost.lora_params`). Its merged model moves the
experts alone, and transformers (its experts one 3-D tensor a layer) loads it and computes rlctl's logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlctl.config.runtime import Lora
from rlctl.models.hfdir import check_hf_dir
from rlctl.models.tinygpt import TinyGPT
from rlctl.models.weightfiles import load_state_dict
from rlctl.profiler.traincost import lora_params
from tests.integration.hfdemo import check_and_launch, hf_demo_job

from .test_agents_megatron_job import LENGTH_REWARD

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_a_lora_job_on_a_qwen2_moe_trains_an_adapter_on_each_expert_as_priced(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    adapters = Lora(rank=4, alpha=8, target_modules=["gate_proj", "up_proj", "down_proj"])
    job = hf_demo_job(
        tmp_path,
        shape="tiny-qwen2moe",
        reward=LENGTH_REWARD,
        iterations=2,
        batch={"prompts_per_iteration": 4, "samples_per_prompt": 4},
        checkpoint={"every_iterations": 2},
        trainer={"backend": "torch", "lora": adapters.model_dump()},
    )
    run = tmp_path / "run"
    s = check_and_launch(job, run)
    assert s["state"] == "done" and s["ledger"]["trained"] == 8
    held = torch.load(run / "checkpoints/iter-2/ranks/rank-0.pt", weights_only=False)["module.lora"]
    owners = {k.removeprefix("adapters.").rsplit("-", 1)[0].replace("-", ".") for k in held}
    expert = [f"model.layers.{n}.mlp.{m}.{p}_proj" for n in (0, 2) for m in ("experts.0", "experts.3", "shared_expert")
              for p in ("gate", "up", "down")]  # fmt: skip
    assert set(expert) | {f"model.layers.1.mlp.{p}_proj" for p in ("gate", "up", "down")} <= owners
    assert len(owners) == 2 * (4 + 1) * 3 + 3 and not any(o.endswith((".gate", "shared_expert_gate")) for o in owners)
    assert sum(t.numel() for t in held.values()) == lora_params(check_hf_dir(tmp_path / "model").arch, adapters)
    start, trained = load_state_dict(tmp_path / "model"), load_state_dict(run / "checkpoints/iter-2/model")
    moved = {k for k in start if not torch.equal(trained[k], start[k])}
    assert moved and all(".mlp." in k and k.endswith("_proj.weight") for k in moved)  # routers, attention frozen
    tokens = torch.arange(3, 40).remainder(int(check_hf_dir(tmp_path / "model").arch.vocab)).unsqueeze(0)
    ours = TinyGPT.from_pretrained(run / "checkpoints/iter-2/model").eval()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(run / "checkpoints/iter-2/model").eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), theirs(tokens).logits, atol=1e-4, rtol=1e-4)
