"""The planner's trainer memory with LoRA (`trainer.lora`): gradients and AdamW state for the adapters' parameters
only, the policy's frozen weights held once — the figure `rlctl plan`, its FSDP2 choice and `rlctl check` share."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlctl.config import load_job
from rlctl.config.algorithm import GrpoAlgorithm
from rlctl.config.job import Job
from rlctl.config.model import BuiltinModel
from rlctl.config.runtime import TARGETS, Lora
from rlctl.hardware import CATALOG
from rlctl.launch.agentenv import ParallelConfig
from rlctl.models import lora
from rlctl.models.catalog import BUILTIN_MODELS
from rlctl.models.tinygpt import TinyGPT
from rlctl.ops.preflight.memory import trainer_memory_refusal
from rlctl.planner.costs import TRAIN_STEP_OVERHEAD_S, fsdp_gathered_bytes, train_compute_s
from rlctl.planner.inputs import PlanOptions, job_passes, length_model, profile_for, train_cost
from rlctl.planner.plan import make_plan, train_workload
from rlctl.planner.split import launch_layout
from rlctl.planner.view import plan_table
from rlctl.profiler.analytical import RANK_WORKING_BYTES, training_entry
from rlctl.profiler.profile import ProfileFile
from rlctl.profiler.traincost import (
    TrainingPasses,
    flops_per_token,
    lora_params,
    lora_passes,
    passes_for,
    streamed_units,
)
from tests.unit.hf_checkpoints import config_reads
from tests.unit.ops.test_preflight import GPU_CLUSTERS, gpu_job, hf_dataset_job, load


def shorter_rows(job: Job, *, cut_tokens: int | None = None, **task: int) -> Job:
    """`job` with rows of up to 4,512 tokens (default), or the task's fields `task`, and `cut_tokens` a cut
    (batch.train_micro_batch_tokens): its cut's activations small enough to sit beside a LoRA rank's frozen weights
    (`rlctl.profiler.actmem`)."""
    data = yaml.safe_load(job.path.read_text())
    data["task"] |= task or {"max_output_tokens": 4000}
    if cut_tokens is not None:
        data["batch"]["train_micro_batch_tokens"] = cut_tokens
    job.path.write_text(yaml.safe_dump(data))
    return load_job(job.path)


def with_lora(job: Job, adapters: Lora) -> Job:
    trainer = job.spec.trainer.model_copy(update={"lora": adapters})
    return Job(job.spec.model_copy(update={"trainer": trainer}), job.inventory, job.path)


def test_a_jobs_passes_read_an_hf_models_directory_for_its_adapters_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without LoRA the passes hold no adapters, and the model's directory (config.json, every weight file's header)
    was read for them all the same: once for each of the plan's calls."""
    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})
    adapters = Lora(rank=4, alpha=8)
    arch = job.spec.model.arch
    reads = config_reads(monkeypatch)
    assert job_passes(job, None) == passes_for(job.spec.algorithm, None)
    assert reads == []
    assert job_passes(with_lora(job, adapters), None).adapter_params == lora_params(arch, adapters) > 0
    assert reads == [tmp_path / "model" / "config.json"]


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
    # a KL term's reference weights as before
    kl = lora_passes(GrpoAlgorithm(kind="grpo", kl_coef=0.01), arch=arch, lora=Lora(rank=16, alpha=32))
    with_ref = training_entry(arch, gpu, tp=1, pp=1, algorithm="grpo", passes=kl)
    assert with_ref.fixed_bytes_per_gpu - with_lora.fixed_bytes_per_gpu == 4 * arch.params
    assert "adapter_params" not in TrainingPasses(adapter_params=adapters).model_dump()  # never in a profile


def test_a_7b_lora_trainer_fits_one_h800_where_full_training_shards_or_is_refused(tmp_path: Path) -> None:
    full = shorter_rows(gpu_job(tmp_path, trainer_gpus=2, backend="torch"))
    lora_job = with_lora(full, Lora(rank=16, alpha=32))
    # 7.6e9 × 16 B ≈ 122 GB does not fit an 80 GB H800: FSDP2 over 2; with LoRA ≈ 30.5 GB + 0.6 GB (and a cut's
    # recomputed activations, 19.6 GB at 8,192 tokens): whole
    assert launch_layout(full, tp=1, pp=1, dp=2).fsdp is True
    assert launch_layout(lora_job, tp=1, pp=1, dp=2).fsdp is False
    one = ParallelConfig("trainer", dp=1)
    site = full.inventory.sites["h800"]
    why = trainer_memory_refusal(full.spec, "h800", site, one)
    assert why is not None and "need 143.5 GB each" in why, why
    assert trainer_memory_refusal(lora_job.spec, "h800", site, one) is None


def test_a_lora_update_computes_no_weight_gradient_of_the_frozen_policy() -> None:
    """Forward 2P + 2A, the activations' gradients 2P + 2A, the adapters' weight gradients 2A: 4P + 6A a token, ≈ 2/3
    of a full update's 6P; the reference forward (KL) 2P as before, a recomputed forward 2P + 2A."""
    arch = BUILTIN_MODELS["qwen2.5-7b"]
    p, a = arch.params, lora_params(arch, Lora(rank=16, alpha=32))
    lora_only = TrainingPasses(adapter_params=a)
    assert flops_per_token("grpo", lora_only, p) == pytest.approx(4 * p + 6 * a)
    assert flops_per_token("grpo", TrainingPasses(), p) == pytest.approx(6 * p)
    kl = TrainingPasses(adapter_params=a, reference=True, recompute=True)
    assert flops_per_token("grpo", kl, p) == pytest.approx(2 * p + (4 * p + 6 * a) + (2 * p + 2 * a))
    assert streamed_units("grpo", lora_only, params=p) == pytest.approx(2 + 3 * a / p)


def test_a_lora_trainer_steps_in_two_thirds_of_a_full_fine_tunes_time() -> None:
    """The roofline's seconds per token at tp 1 (compute alone) scale with the FLOPs: (4P + 6A) / 6P; at tp 2 the
    all-reduces of the activations' gradients stay a full update's."""
    arch, gpu = BUILTIN_MODELS["qwen2.5-7b"], CATALOG["H800"]
    p, a = arch.params, lora_params(arch, Lora(rank=16, alpha=32))
    full, with_lora = TrainingPasses(), TrainingPasses(adapter_params=a)
    one = [training_entry(arch, gpu, tp=1, pp=1, algorithm="grpo", passes=x).gpu_s_per_token for x in (full, with_lora)]
    assert one[1] / one[0] == pytest.approx((4 * p + 6 * a) / (6 * p)) == pytest.approx(0.672, abs=1e-3)
    two = [training_entry(arch, gpu, tp=2, pp=1, algorithm="grpo", passes=x).gpu_s_per_token for x in (full, with_lora)]
    comm = two[0] - 2 * one[0] / 2  # tp × (compute / tp + comm): the full update's all-reduces
    assert two[1] == pytest.approx(one[1] + comm)


def test_plan_prices_a_lora_jobs_training_as_its_passes(tmp_path: Path) -> None:
    """`rlctl plan`'s training cost for a LoRA job: its FLOPs, its adapters named, and a profile priced without them
    (a file: a full fine-tune's) scaled by (4P + 6A) / 6P; the roofline built for the job is not scaled again. (The
    job recomputes its activations: a forward of 2P + 2A more, and the full fine-tune's 2P.)"""
    full = gpu_job(tmp_path, trainer_gpus=2, backend="torch")
    lora_job = with_lora(full, Lora(rank=16, alpha=32))
    arch = full.spec.model.arch
    p, a = arch.params, lora_params(arch, Lora(rank=16, alpha=32))
    own = profile_for(lora_job, None)
    t = train_cost(lora_job, own, TrainingPasses())
    recomputed = 2 * p + 2 * a
    assert t["flops_per_token"] == pytest.approx(4 * p + 6 * a + recomputed)
    assert t["scale_of_profile"] == pytest.approx(1.0)
    as_file = ProfileFile.model_validate(profile_for(full, None).model_dump(by_alias=True, mode="json"))
    scale = train_cost(lora_job, as_file, TrainingPasses())["scale_of_profile"]
    assert scale == pytest.approx((4 * p + 6 * a + recomputed) / (6 * p + 2 * p))
    assert train_cost(full, as_file, TrainingPasses())["scale_of_profile"] == 1.0
    plan = make_plan(lora_job, None, PlanOptions(sim_iterations=1, curves_in_output=False))
    assert "LoRA (40.4 M adapter parameters)" in plan_table(plan)


def test_an_fsdp_lora_rank_gathers_its_layer_without_the_frozen_weights_gradients(tmp_path: Path) -> None:
    """FSDP2 gathers the root and the layer computed in bf16; with LoRA only the layer's adapters get fp32 gradients
    before the reduce-scatter. 72B at r 16 over 4 H20s (86.4 GB usable): 2 + 294.2 / 4 + 6.8 + 2.3 (a 512-token cut's
    recomputed activations) = 84.6 GB a rank, fits, versus 98.1 GB (refused) with gradients of every gathered weight."""
    arch = BUILTIN_MODELS["qwen2.5-72b"]
    a = lora_params(arch, Lora(rank=16, alpha=32))
    root = 2 * arch.vocab * arch.hidden
    layer = (arch.params - root) / arch.layers
    assert fsdp_gathered_bytes(arch, adapter_params=0.0) == pytest.approx(6 * (root + layer))
    assert fsdp_gathered_bytes(arch, adapter_params=a) == pytest.approx(2 * (root + layer) + 6 * a / arch.layers)
    # rows of 512 tokens at most, a cut of one: a rank's recomputed activations ≈ 2.3 GB
    base = shorter_rows(
        gpu_job(tmp_path, trainer_gpus=4, backend="torch"),
        prompt_tokens=256,
        median_output_tokens=128,
        max_output_tokens=256,
        cut_tokens=512,
    )
    spec = base.spec.model_copy(update={"model": BuiltinModel(kind="builtin", name="qwen2.5-72b")})
    trainer = spec.trainer.model_copy(update={"lora": Lora(rank=16, alpha=32), "shard": "fsdp"})
    spec = spec.model_copy(update={"trainer": trainer})
    four = ParallelConfig("trainer", dp=4, fsdp=True)
    assert trainer_memory_refusal(spec, "h20", base.inventory.sites["h20"], four) is None
    why = trainer_memory_refusal(spec, "h20", base.inventory.sites["h20"], ParallelConfig("trainer", dp=3, fsdp=True))
    assert why is not None and "need 109.1 GB each" in why and "layers gathered 6.8 GB" in why, why


def as_measured(prof: ProfileFile) -> ProfileFile:
    """`prof` as `rlctl profile --source measured` writes it: its training memory the formula's for the whole
    policy trained (`rlctl.profiler.build._measured_training`), read back from the file."""
    data = prof.model_dump(by_alias=True, mode="json")
    data["source"] = "measured"
    for site in data["sites"].values():
        for e in site["training"]:
            e["backend"] = "torch"
    return ProfileFile.model_validate(data)


def test_a_lora_job_planned_from_a_measured_profile_gets_its_own_memory_and_time(tmp_path: Path) -> None:
    """A measured profile planned for a LoRA job: each trainer entry holds the LoRA rank's memory and its seconds
    scale to the job's passes, so the plan is the one the roofline built for the LoRA job gives. 72B at r 16 on 4
    H20s: FSDP2, 84.6 GB a rank (its cuts of 512 tokens recomputed), versus 'training state does not fit' (a full
    fine-tune's 16 B a parameter)."""
    full = gpu_job(tmp_path, trainer_gpus=2, backend="torch")
    lora_job = with_lora(full, Lora(rank=16, alpha=32))
    measured = as_measured(profile_for(full, None))
    arch, gpu = full.spec.model.arch, full.inventory.sites["h800"].spec
    passes = TrainingPasses(adapter_params=lora_params(arch, Lora(rank=16, alpha=32)))
    for e in profile_for(lora_job, measured).sites["h800"].training:
        want = training_entry(arch, gpu, tp=e.tp, pp=e.pp, algorithm="grpo", passes=passes)
        assert (e.fixed_bytes_per_gpu, e.sharded_bytes_per_gpu) == (
            want.fixed_bytes_per_gpu,
            want.sharded_bytes_per_gpu,
        )
    assert profile_for(full, measured) == measured  # a full fine-tune's plan reads the file as it is

    def big(adapters: Lora | None) -> Job:
        job = load(
            tmp_path,
            inventory=GPU_CLUSTERS,
            model={"kind": "builtin", "name": "qwen2.5-72b"},
            placement={"trainer": {"site": "h20", "gpus": 4}, "rollout": [{"site": "h800", "gpus": 16}]},
            rollout={"engine": "vllm", "tensor_parallel": 4},
            # a rank's recomputed activations of 512 tokens a cut (≈ 2.3 GB) beside the frozen 72B's shards
            batch={"train_micro_batch_tokens": 512},
            trainer={"backend": "torch", "activation_checkpointing": True},
        )
        return with_lora(job, adapters) if adapters is not None else job

    measured = as_measured(profile_for(big(None), None))
    opts = PlanOptions(sim_iterations=1, curves_in_output=False)
    from_file, own = (
        make_plan(big(Lora(rank=16, alpha=32)), measured, opts),
        make_plan(big(Lora(rank=16, alpha=32)), None, opts),
    )
    (t_file,) = [a for a in from_file["allocation"] if a["role"] == "trainer"]
    (t_own,) = [a for a in own["allocation"] if a["role"] == "trainer"]
    # LoRA: FSDP2 holds the adapters' small gradients over a step and reduce-scatters them once
    assert t_file["config"] == t_own["config"] == {"tp": 1, "pp": 1, "dp": 4, "fsdp": True, "reduce_per_step": True}
    assert from_file["predicted"]["t_train_s"] == pytest.approx(own["predicted"]["t_train_s"])


FOUR_ROWS = {"train_micro_batch_samples": 4, "train_micro_batch_tokens": None}  # a rank's share of a cut


def test_a_lora_trainer_all_reduces_its_adapters_gradients_alone(tmp_path: Path) -> None:
    """Data-parallel ranks sum the trained parameters' gradients (`rlctl.rl.learner`): a LoRA job's adapters (fp32,
    4 B each: 161 MB for a 7B at r 16), not the policy's 30.5 GB. 16 H800s over 2 nodes: the step is half of 8's
    (one node) but for the step overhead, where the policy's gradients over the nodes add ≈ 1.1 s (30.5 GB in a ring
    over 2 nodes of 400 Gbit/s)."""
    arch = BUILTIN_MODELS["qwen2.5-7b"]
    a = lora_params(arch, Lora(rank=16, alpha=32))
    opts = PlanOptions(sim_iterations=1, curves_in_output=False)
    t_train = {}
    for gpus in (8, 16):
        # rows of up to 2,512 tokens: 4 a rank (10,048 tokens) keep their activations beside a LoRA rank's whole
        # frozen weights (`profiler.actmem`), as the launch runs it (no FSDP2); 32 rows a rank (the default with no
        # token budget, 80,384 tokens) would not
        full = shorter_rows(
            gpu_job(tmp_path, trainer_gpus=gpus, backend="torch"), median_output_tokens=1000, max_output_tokens=2000
        )
        full.spec = full.spec.model_copy(update={"batch": full.spec.batch.model_copy(update=FOUR_ROWS)})
        lora_job = with_lora(full, Lora(rank=16, alpha=32))
        tcost = train_cost(lora_job, profile_for(lora_job, None), TrainingPasses())
        assert train_workload(lora_job, arch, tcost, tokens=1e6).grad_bytes == 4 * a
        assert (
            train_workload(
                full, arch, train_cost(full, profile_for(full, None), TrainingPasses()), tokens=1e6
            ).grad_bytes
            == 4 * arch.params  # fp32, as every backend sums them (test_dp_grad_bytes.py)
        )
        plan = make_plan(lora_job, None, opts)
        (t,) = [x for x in plan["allocation"] if x["role"] == "trainer"]
        assert t["config"] == {"tp": 1, "pp": 1, "dp": gpus}
        site = profile_for(lora_job, None).sites["h800"]
        (entry,) = [e for e in site.training if (e.tp, e.pp) == (1, 1)]
        lm, n = length_model(lora_job), lora_job.spec.batch.samples_per_iteration
        w = train_workload(lora_job, arch, tcost, tokens=float(lm.quantiles(n).sum() + n * lm.prompt_tokens))
        # beside the compute (each cut at its busiest rank's share padded: the last 4 rows of 64 at dp 16, of 32 at 8)
        t_train[gpus] = plan["predicted"]["t_train_s"] - train_compute_s(entry, gpus, w)
    # the adapters over the nodes: ≈ 0.006 s a step (the policy's gradients: ≈ 1.1 s)
    assert t_train[16] == pytest.approx(TRAIN_STEP_OVERHEAD_S, abs=0.02)
    assert t_train[8] == pytest.approx(TRAIN_STEP_OVERHEAD_S, abs=0.02)
