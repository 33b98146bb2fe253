"""`rlctl profile --job` of a LoRA job (`trainer.lora`): the probe times the job's LoRA step (its adapters trained on
the frozen policy), the file says so (`lora`), and `rlctl plan` takes its seconds as they are for that job, versus a
full fine-tune's step measured and scaled by the formula's ≈ 2/3 (the file did not say what was measured)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from rlctl.config import load_job
from rlctl.config.algorithm import GrpoAlgorithm, PpoAlgorithm
from rlctl.config.runtime import Lora
from rlctl.errors import UsageError
from rlctl.models import lora
from rlctl.planner.inputs import profile_for, train_cost
from rlctl.profiler import build, measure_train, probe
from rlctl.profiler.analytical import training_entry
from rlctl.profiler.profile import load_profile, save_profile
from rlctl.profiler.traincost import TrainingPasses, lora_params
from tests.unit.profiler.test_profiler_trainer_backends import fake_generation, job_file, spec

ADAPTERS = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def test_the_jobs_lora_round_trips_through_the_probes_command_line() -> None:
    for adapters in (Lora(rank=4, alpha=8, target_modules=["q_proj", "down_proj"]), Lora(rank=16, alpha=32)):
        s = dataclasses.replace(spec(GrpoAlgorithm(kind="grpo"), "torch"), lora=adapters)
        assert probe.parse_spec([*s.argv(), "--out", "o"])[0] == s
        probe.check_trainer(s)
    assert "--lora-rank" not in spec(GrpoAlgorithm(kind="grpo"), "torch").argv()
    lora_spec = dataclasses.replace(spec(GrpoAlgorithm(kind="grpo"), "megatron"), lora=Lora(rank=4, alpha=8))
    with pytest.raises(UsageError, match=r"trainer.lora trains GRPO's policy on the 'torch' backend; .* 'megatron'"):
        probe.check_trainer(lora_spec, here=False)
    with pytest.raises(UsageError, match=r"would time ppo on 'torch'"):
        probe.check_trainer(dataclasses.replace(lora_spec, trainer_backend="torch", algorithm=PpoAlgorithm(kind="ppo")))


def test_a_lora_jobs_measured_profile_is_of_its_lora_step_and_plan_does_not_scale_it_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_generation(monkeypatch)
    trained: list[Any] = []
    real = measure_train.make_learner

    def recording(policy: Any, *args: Any, **kwargs: Any) -> Any:
        trained.append(policy.model)
        return real(policy, *args, **kwargs)

    monkeypatch.setattr(measure_train, "make_learner", recording)
    job = load_job(job_file(tmp_path, trainer={"backend": "torch", "lora": ADAPTERS}))
    req = build.request_from_job(job, sites=None, engines=None)
    save_profile(build.build_profile(req, source="measured"), tmp_path / "p.yaml")
    prof = load_profile(tmp_path / "p.yaml")

    # the step timed trained the job's adapters alone, the policy frozen: the LoRA step, not a full fine-tune's
    (model,) = trained
    adapted = lora.adapters(model)
    assert sorted({n.rsplit(".", 1)[-1] for n in adapted}) == ["down_proj", "q_proj", "v_proj"]
    assert all(lora.is_adapter(n) == p.requires_grad for n, p in model.named_parameters())
    assert all(lin.lora_B.abs().sum() > 0 for lin in adapted.values())  # B starts at zeros: the steps moved it

    # the file says which LoRA its entries are of, and prices their memory with it
    assert prof.lora == job.spec.trainer.lora
    adapters = lora_params(job.spec.model.arch, job.spec.trainer.lora)
    assert adapters == sum(p.numel() for p in model.parameters() if p.requires_grad)
    (t,) = prof.sites["local"].training
    want = training_entry(job.spec.model.arch, job.inventory.sites["local"].spec, tp=1, pp=1, algorithm="grpo",
                          passes=TrainingPasses(adapter_params=adapters))  # fmt: skip
    assert (t.fixed_bytes_per_gpu, t.sharded_bytes_per_gpu) == (want.fixed_bytes_per_gpu, want.sharded_bytes_per_gpu)

    # plan: the LoRA job reads the file as it is (its seconds not scaled again, its memory the file's) ...
    assert profile_for(job, prof) == prof
    assert train_cost(job, prof, TrainingPasses())["scale_of_profile"] == pytest.approx(1.0)
    # ... and a full fine-tune of the model scales the LoRA step's seconds up, its memory the whole policy's
    full = load_job(job_file(tmp_path, trainer={"backend": "torch"}))
    p = prof.model.arch.active
    assert train_cost(full, prof, TrainingPasses())["scale_of_profile"] == pytest.approx(3 / (2 + 3 * adapters / p))
    (e,) = profile_for(full, prof).sites["local"].training
    whole = training_entry(job.spec.model.arch, job.inventory.sites["local"].spec, tp=1, pp=1, algorithm="grpo")
    assert (e.fixed_bytes_per_gpu, e.sharded_bytes_per_gpu, e.gpu_s_per_token) == (
        whole.fixed_bytes_per_gpu, whole.sharded_bytes_per_gpu, t.gpu_s_per_token,
    )  # fmt: skip


def test_a_lora_jobs_roofline_file_is_priced_as_the_jobs_own_roofline(tmp_path: Path) -> None:
    """`rlctl profile --job --source analytical` of a LoRA job: the entries of its LoRA step, which plan takes as
    the roofline it builds for the job (versus a full fine-tune's entries scaled by the FLOPs' ratio)."""
    job = load_job(job_file(tmp_path, trainer={"backend": "torch", "lora": ADAPTERS}))
    save_profile(build.build_profile(build.request_from_job(job, sites=None, engines=None), source="analytical"),
                 tmp_path / "p.yaml")  # fmt: skip
    prof = load_profile(tmp_path / "p.yaml")
    own = profile_for(job, None)
    assert prof.lora == own.lora == job.spec.trainer.lora
    assert prof.sites["local"].training == own.sites["local"].training
    assert train_cost(job, prof, TrainingPasses()) == train_cost(job, own, TrainingPasses())
    assert train_cost(job, prof, TrainingPasses())["scale_of_profile"] == pytest.approx(1.0)
