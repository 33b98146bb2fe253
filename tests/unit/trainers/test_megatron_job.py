"""`trainer.backend: megatron` in the job path: what preflight refuses and why, the trainer's refusal of
what megatron does not run here (a pp that does not divide the layers), and a whole job (real controller,
trainer and rollout agents in one process over the inproc transport) whose trainer is the Megatron backend,
training GRPO and PPO."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from rlctl.agents.appliedlog import unit_rows
from rlctl.agents.common import AgentContext
from rlctl.agents.controller import ControllerAgent
from rlctl.agents.messages import Hello, make
from rlctl.agents.rollout import RolloutAgent
from rlctl.agents.trainer import TrainerAgent, _backend
from rlctl.config.job import Job, JobFile, load_job
from rlctl.errors import ConfigError
from rlctl.launch.jobdir import JobDir
from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig
from rlctl.ops import preflight
from rlctl.ops.preflight import backends as preflight_backends
from rlctl.trainers.megatron.backend import MegatronBackend
from rlctl.trainers.megatron.model import MegatronTrunk
from rlctl.transport import InprocTransport

ROOT = Path(__file__).resolve().parents[3]


def job_dict(**over: Any) -> dict[str, Any]:
    return {
        "apiVersion": "rlctl/v1",
        "kind": "Job",
        "name": "megatron",
        "inventory": [str(ROOT / "clusters" / "local.yaml")],
        "model": {"kind": "builtin", "name": "tiny-demo"},
        "algorithm": {"kind": "grpo"},
        "task": {"kind": "digits", "median_output_tokens": 6, "max_output_tokens": 16},
        "iterations": 2,
        "batch": {"prompts_per_iteration": 3, "samples_per_prompt": 2, "train_micro_batch_samples": 2},
        "pipeline": {"mode": "async"},
        "placement": {"trainer": {"site": "local", "gpus": 1}, "rollout": [{"site": "local", "gpus": 2}]},
        "trainer": {"backend": "megatron"},
        "transport": {"kind": "inproc", "timeout_s": 10},
        "warmup": {"sft_steps": 0},
        "checkpoint": {"every_iterations": 1},
        **over,
    }


def load(tmp_path: Path, **over: Any) -> Job:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_dict(**over)))
    return load_job(path)


def refusals(job: Job) -> list[str]:
    return [p.message for p in preflight.problems(job) if p.field == "trainer.backend"]


def test_preflight_accepts_megatron_on_a_cpu_site_and_says_what_it_cannot_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert refusals(load(tmp_path)) == []
    ppo = load(tmp_path, algorithm={"kind": "ppo"}, transport={"kind": "tcp"})  # a launched job's transport
    assert preflight.problems(ppo) == []  # PPO's critic: a megatron trunk
    gpu_site = load(
        tmp_path,
        inventory=[str(ROOT / "clusters" / "h800-trainer.yaml"), str(ROOT / "clusters" / "local.yaml")],
        placement={"trainer": {"site": "h800", "gpus": 8}, "rollout": [{"site": "local", "gpus": 2}]},
    )
    assert ["site 'h800' has H800 GPUs" in m for m in refusals(gpu_site)] == [True]
    monkeypatch.setattr(preflight_backends, "megatron_available", lambda: "pip install 'rlctl[megatron]'")
    (missing,) = [p for p in preflight.problems(load(tmp_path)) if p.field == "trainer.backend"]
    assert "needs megatron-core" in missing.message and missing.hint == "pip install 'rlctl[megatron]'"


def test_preflight_accepts_megatron_tensor_and_pipeline_parallel_and_refuses_the_splits_that_do_not_run(
    tmp_path: Path,
) -> None:
    def split_problems(trainer: dict[str, Any], **over: Any) -> list[tuple[str, str]]:
        job = load(tmp_path, trainer=trainer, **over)
        found = preflight.problems(job)
        # a split the job asks for is judged once, on its own field (never also as the plan's placement)
        assert not [p for p in found if p.message.startswith("the plan splits the model")], found
        return [(p.field, p.message) for p in found if p.field.startswith("trainer.")]

    two = {"site": "local", "gpus": 2}
    tiny = {"kind": "builtin", "name": "tiny-demo"}  # 3 heads: tp 2 does not divide them
    hf = tmp_path / "hf"
    layers = 4  # pp 2 divides them, 3 does not
    c = TinyGPTConfig(vocab_size=64, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=layers)
    TinyGPT(c).save_pretrained(hf)
    placement = {"trainer": two, "rollout": [{"site": "local", "gpus": 1}]}
    model = {"kind": "hf", "path": str(hf)}
    assert split_problems({"backend": "megatron", "tensor_parallel": 2}, model=model, placement=placement) == []
    assert split_problems({"backend": "megatron", "tensor_parallel": 2}, model=tiny, placement=placement) == [
        ("trainer.tensor_parallel", "2 does not divide the model's num_attention_heads 3; use a divisor")
    ]
    assert split_problems({"backend": "torch", "tensor_parallel": 2}, model=model, placement=placement) == [
        (
            "trainer.tensor_parallel",
            "2: the 'torch' trainer has no model parallelism (each rank holds a whole replica); use 1, or "
            "trainer.backend 'megatron'",
        )
    ]
    assert split_problems({"backend": "megatron", "pipeline_parallel": 2}, model=model, placement=placement) == []
    four = {"trainer": {"site": "local", "gpus": 4}, "rollout": [{"site": "local", "gpus": 1}]}
    both = {"backend": "megatron", "tensor_parallel": 2, "pipeline_parallel": 2}
    assert split_problems(both, model=model, placement=four) == []
    three_stages = {"trainer": {"site": "local", "gpus": 3}, "rollout": [{"site": "local", "gpus": 1}]}
    assert split_problems({"backend": "megatron", "pipeline_parallel": 3}, model=model, placement=three_stages) == [
        (
            "trainer.pipeline_parallel",
            f"3 does not divide the model's num_hidden_layers {layers} (every stage holds as many); use a divisor",
        )
    ]
    assert split_problems({"backend": "torch", "pipeline_parallel": 2}, model=model, placement=placement) == [
        (
            "trainer.pipeline_parallel",
            "2: the 'torch' trainer has no model parallelism (each rank holds a whole replica); use 1, or "
            "trainer.backend 'megatron'",
        )
    ]
    three = {"trainer": {"site": "local", "gpus": 3}, "rollout": [{"site": "local", "gpus": 1}]}
    assert split_problems({"backend": "megatron", "tensor_parallel": 2}, model=model, placement=three) == [
        ("trainer.tensor_parallel", "tp 2 × pp 1 does not divide placement.trainer.gpus 3 (GPUs = tp × pp × dp)")
    ]
    # a split that only pipeline_parallel sets is named by that field
    assert split_problems({"backend": "megatron", "pipeline_parallel": 2}, model=model, placement=three) == [
        ("trainer.pipeline_parallel", "tp 1 × pp 2 does not divide placement.trainer.gpus 3 (GPUs = tp × pp × dp)")
    ]
    # PPO at tp 2 on 4 GPUs: dp 2 (the learner splits each micro-batch over the data-parallel ranks)
    ppo = {"kind": "ppo"}
    assert split_problems(both, model=model, placement=four, algorithm=ppo) == []
    job = load(
        tmp_path, trainer={"backend": "megatron", "tensor_parallel": 2}, model=model, placement=four, algorithm=ppo
    )
    assert [p for p in preflight.problems(job) if p.field == "placement.trainer.gpus"] == []


@pytest.mark.usefixtures("megatron_rank")
def test_the_trainer_refuses_what_megatron_does_not_run_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    TinyGPT().save_pretrained(tmp_path / "model")
    job = JobFile.model_validate(job_dict())
    layers = TinyGPT().config.num_hidden_layers
    monkeypatch.setenv("RLCTL_PARALLEL", f'{{"role": "trainer", "tp": 1, "pp": {layers + 1}, "dp": 1, "rank": 0}}')
    with pytest.raises(
        ConfigError, match=rf"trainer\.pipeline_parallel: pipeline parallel {layers + 1} does not divide"
    ):
        _backend(job, tmp_path / "model", where="job.json")
    monkeypatch.setenv("RLCTL_PARALLEL", '{"role": "trainer", "tp": 1, "pp": 1, "dp": 1, "rank": 0}')
    assert isinstance(_backend(job, tmp_path / "model", where="job.json"), MegatronBackend)


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("megatron_rank")
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_an_inproc_job_trains_with_the_megatron_backend(tmp_path: Path, algorithm: str) -> None:
    torch.manual_seed(0)
    job = JobFile.model_validate(job_dict(algorithm={"kind": algorithm}))
    jd = JobDir.create("megatron", explicit=tmp_path / "job")
    jd.write_job(job, source="test")
    jd.write_json(jd.plan_json, {"rollout": [{"site": "local", "units": 2}]})
    TinyGPT().save_pretrained(jd.init_model)
    transport = InprocTransport(secret=jd.secret())
    ctl = ControllerAgent(jd, job, transport, listen="inproc://controller-megatron")
    ctx = AgentContext(jd, job, transport, ctl.listener.address)
    trainer = TrainerAgent(ctx)
    assert isinstance(trainer.backend, MegatronBackend)
    agents = [trainer, RolloutAgent(ctx, replica=0), RolloutAgent(ctx, replica=1)]
    threads = [threading.Thread(target=a.run, daemon=True) for a in agents]
    for t in threads:
        t.start()
    client = transport.connect(ctl.listener.address, timeout_s=5)
    client.send(make("hello", Hello(role="client", name="test")))
    code = ctl.run()
    for t in threads:
        t.join(timeout=30)
    assert code == 0 and not any(t.is_alive() for t in threads)
    s = jd.read_json(jd.summary_json)
    assert s["state"] == "done" and s["iterations"] == 2
    assert s["ledger"]["prompts"] == s["ledger"]["trained"] == 6
    # the final checkpoint is an HF directory of the trained weights: what the backend publishes, bit for bit
    saved = TinyGPT.from_pretrained(jd.checkpoint(2) / "model").state_dict()
    published = trainer.backend.weights()
    assert all(torch.equal(saved[k], published[k]) for k in saved)
    # the learner's AdamW stepped the GPTModel's own parameters once per iteration (the untrained demo model
    # scores 0 on every sample here, so GRPO's advantages, and its updates, are 0); PPO's critic too, whose
    # trunk is a second GPTModel, and the checkpoint holds it
    opts = trainer.learner.optimizers()
    opt = opts["policy"]
    assert [int(opt.state[p]["step"]) for p in trainer.backend.model.parameters()] == [2] * len(opt.state)
    if algorithm == "ppo":
        critic = trainer.learner.modules()["critic"]
        assert isinstance(critic.body, MegatronTrunk)
        assert [int(opts["critic"].state[p]["step"]) for p in critic.parameters()] == [2] * len(opts["critic"].state)
        (shard,) = (jd.checkpoint(2) / "ranks").iterdir()
        saved_critic = torch.load(shard, weights_only=True)["module.critic"]
        assert all(torch.equal(saved_critic[k], v) for k, v in critic.state_dict().items() if v is not None)
    applied = [
        (e["agent"], e["version"]) for e in unit_rows(jd.read_lines(jd.events)) if e["event"] == "weights_applied"
    ]
    assert {u for u, v in applied if v == job.iterations} == {"rollout-0", "rollout-1"}
