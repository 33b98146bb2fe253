"""The planner's trainer memory with LoRA (`trainer.lora`): gradients and AdamW state for the adapters' parameters
only, the policy's frozen weights held once — the figure `rlctl plan`, its FSDP2 choice and `rlctl check` share."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.config.algorithm import GrpoAlgorithm
from rlctl.config.job import Job
from rlctl.config.runtime import TARGETS, Lora
from rlctl.hardware import CATALOG
from rlctl.launch.agentenv import ParallelConfig
from rlctl.models import lora
from rlctl.models.catalog import BUILTIN_MODELS
from rlctl.models.tinygpt import TinyGPT
from rlctl.ops.preflight.memory import trainer_memory_refusal
from rlctl.planner.split import shard_trainer
from rlctl.profiler.analytical import RANK_WORKING_BYTES, training_entry
from rlctl.profiler.traincost import TrainingPasses, lora_params, passes_for
from tests.unit.ops.test_preflight import gpu_job


@pytest.mark.parametrize("targets", [TARGETS, ("q_proj", "v_proj"), ("o_proj", "down_proj")])
def test_the_adapters_priced_are_those_the_trainer_builds(targets: tuple[str, ...]) -> None:
    model = TinyGPT()  # tiny-demo
    lora.add_adapters(model, rank=8, alpha=16, targets=targets)
    built = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert lora_params(BUILTIN_MODELS["tiny-demo"], Lora(rank=8, alpha=16, target_modules=list(targets))) == built
    assert lora_params(BUILTIN_MODELS["tiny-demo"], None) == 0


def test_a_lora_rank_holds_its_frozen_weights_once_and_the_adapters_state() -> None:
    arch, gpu = BUILTIN_MODELS["qwen2.5-7b"], CATALOG["H800"]
    adapters = lora_params(arch, Lora(rank=16, alpha=32))
    assert adapters == pytest.approx(40.37e6, rel=1e-3)  # PEFT's count for Qwen2.5-7B, r 16, all-linear
    full = training_entry(arch, gpu, tp=1, pp=1, algorithm="grpo")
    with_lora = training_entry(arch, gpu, tp=1, pp=1, algorithm="grpo", passes=TrainingPasses(adapter_params=adapters))
    assert full.fixed_bytes_per_gpu + full.sharded_bytes_per_gpu == 16 * arch.params + RANK_WORKING_BYTES
    assert with_lora.sharded_bytes_per_gpu == 12 * adapters  # AdamW's fp32 moments and master of the adapters only
    assert with_lora.fixed_bytes_per_gpu == 4 * arch.params + 4 * adapters + RANK_WORKING_BYTES
    kl = passes_for(
        GrpoAlgorithm(kind="grpo", kl_coef=0.01), adapter_params=adapters
    )  # a KL term's reference weights as before
    with_ref = training_entry(arch, gpu, tp=1, pp=1, algorithm="grpo", passes=kl)
    assert with_ref.fixed_bytes_per_gpu - with_lora.fixed_bytes_per_gpu == 4 * arch.params
    assert "adapter_params" not in TrainingPasses(adapter_params=adapters).model_dump()  # never in a profile


def test_a_7b_lora_trainer_fits_one_h800_where_full_training_shards_or_is_refused(tmp_path: Path) -> None:
    full = gpu_job(tmp_path, trainer_gpus=2, backend="torch")
    trainer = full.spec.trainer.model_copy(update={"lora": Lora(rank=16, alpha=32)})
    lora_job = Job(full.spec.model_copy(update={"trainer": trainer}), full.inventory, full.path)
    # 7.6e9 × 16 B ≈ 122 GB does not fit an 80 GB H800: FSDP2 over 2; with LoRA ≈ 30.5 GB + 0.6 GB: whole
    assert shard_trainer(full, tp=1, pp=1, dp=2) is True
    assert shard_trainer(lora_job, tp=1, pp=1, dp=2) is False
    one = ParallelConfig("trainer", dp=1)
    site = full.inventory.sites["h800"]
    why = trainer_memory_refusal(full.spec, "h800", site, one)
    assert why is not None and "need 123.9 GB each" in why, why
    assert trainer_memory_refusal(lora_job.spec, "h800", site, one) is None
