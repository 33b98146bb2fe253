"""`rlctl profile --source measured` times the training step on the trainer backend asked for (`torch` or
`megatron`, default the job's): what is refused before anything runs, the backend carried from the command
line to the probe and into the training entry, and a real tiny Megatron step measured through the profiler."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import yaml

from rlctl.config import load_job
from rlctl.config.algorithm import GrpoAlgorithm, PpoAlgorithm
from rlctl.config.pipeline import Batch
from rlctl.errors import ConfigError, UsageError
from rlctl.models.hf import MISTRAL
from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig
from rlctl.profiler import build, measure_train, probe
from rlctl.profiler.profile import GenerationEntry, load_profile, save_profile
from tests.conftest import ROOT, CliResult
from tests.unit.trainers.megatron_required import require_megatron

Cli = Callable[..., CliResult]
SMALL = Batch(prompts_per_iteration=2, samples_per_prompt=4, train_micro_batch_samples=4)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)  # the dev machines are shared; the probe measures one thread anyway


def spec(algorithm: GrpoAlgorithm | PpoAlgorithm, backend: str) -> probe.ProbeSpec:
    return probe.ProbeSpec("tiny-demo", None, ("embedded",), 1000, algorithm, SMALL, backend)


def job_file(tmp_path: Path, **over: Any) -> Path:
    """jobs/demo.yaml with a small batch, its inventory made absolute, and `over` on top."""
    data = yaml.safe_load((ROOT / "jobs/demo.yaml").read_text())
    data["inventory"] = [str(ROOT / "clusters/local.yaml")]
    data["batch"] = {"prompts_per_iteration": 2, "samples_per_prompt": 4, "train_micro_batch_samples": 4}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**data, **over}))
    return path


def fake_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded engine's decode grid is not what these tests measure: one tiny entry instead."""
    entry = GenerationEntry(
        tp=1, contexts=[16], batch_sizes=[1], ptl_s=[[1e-3]], prefill_s_per_token=1e-6, kv_capacity_tokens=99
    )
    monkeypatch.setattr(probe, "embedded_engines_on", lambda net: None)
    monkeypatch.setattr(probe, "measure_generation", lambda factory, **kw: entry)


def test_the_trainer_backend_round_trips_through_the_probes_command_line() -> None:
    s = spec(GrpoAlgorithm(kind="grpo", kl_coef=0.1), "megatron")
    assert "--trainer-backend" in s.argv()
    assert probe.parse_spec([*s.argv(), "--out", "o"])[0] == s
    split = dataclasses.replace(s, split=(2, 1))  # a job's megatron split: measured over its ranks there
    assert "--split" not in s.argv() and probe.parse_spec([*split.argv(), "--out", "o"])[0] == split
    with pytest.raises(UsageError, match=r"--split 2 1: trainer backend 'torch' trains whole replicas"):
        probe.check_trainer(dataclasses.replace(split, trainer_backend="torch"))
    with pytest.raises(SystemExit):  # argparse: not a key of rlctl.trainers.base.BACKENDS
        probe.parse_spec([*spec(GrpoAlgorithm(kind="grpo"), "deepspeed").argv(), "--out", "o"])


def test_megatron_is_refused_where_it_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "megatron_available", lambda: None)
    for algorithm in (PpoAlgorithm(kind="ppo"), GrpoAlgorithm(kind="grpo")):  # megatron trains both
        for backend in ("torch", "megatron"):
            probe.check_trainer(spec(algorithm, backend))
    monkeypatch.setattr(probe, "megatron_available", lambda: "pip install 'rlctl[megatron]'")
    with pytest.raises(UsageError, match=r"megatron-core is not installed: pip install 'rlctl\[megatron\]'") as e:
        probe.check_trainer(spec(PpoAlgorithm(kind="ppo"), "megatron"))
    assert e.value.exit_code == 2 and "--trainer-backend torch" in (e.value.hint or "")
    probe.check_trainer(spec(GrpoAlgorithm(kind="grpo"), "megatron"), here=False)  # looked for there


def test_a_megatron_split_is_not_measured_on_a_gpu_site(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its ranks ran on the probe host's CPU (`measure_split`: megatron's tp/pp over NCCL is not built) and their
    seconds priced the GPU site's plan as GPU-seconds."""
    monkeypatch.setattr(probe, "megatron_available", lambda: None)
    split = dataclasses.replace(spec(GrpoAlgorithm(kind="grpo"), "megatron"), split=(1, 3))  # tiny-demo: 3 layers
    probe.check_trainer(split, here=False)  # a CPU site: measured over its ranks there
    with pytest.raises(UsageError, match=r"--split 1 3 on a GPU site: megatron's tp/pp ranks over NCCL") as e:
        probe.check_trainer(dataclasses.replace(split, device="cuda"), here=False)
    assert e.value.exit_code == 2 and "--source analytical" in (e.value.hint or "")


def test_the_jobs_backend_is_measured_unless_another_is_asked_for(tmp_path: Path) -> None:
    job = load_job(job_file(tmp_path, trainer={"backend": "megatron"}))
    assert build.request_from_job(job, sites=None, engines=None).trainer_backend == "megatron"
    assert build.request_from_job(job, sites=None, engines=None, trainer_backend="torch").trainer_backend == "torch"
    opts = build.request_from_options(
        [ROOT / "clusters/local.yaml"], model="tiny-demo", algorithm="grpo", sites=None, engines=None
    )
    assert opts.trainer_backend == "torch"


def test_the_training_entry_names_the_backend_measured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    asked: list[tuple[str, str]] = []

    def fake_probe(s: probe.ProbeSpec) -> dict[str, Any]:
        asked.append((s.algorithm.kind, s.trainer_backend))
        gen = GenerationEntry(
            tp=1, contexts=[16], batch_sizes=[1], ptl_s=[[1e-3]], prefill_s_per_token=0, kv_capacity_tokens=9
        )
        return {"generation": [gen.model_dump(mode="json")], "training": {"gpu_s_per_token": 5e-5}}

    monkeypatch.setattr(build, "measure_here", fake_probe)
    monkeypatch.setattr(probe, "megatron_available", lambda: None)
    job = load_job(job_file(tmp_path, trainer={"backend": "megatron"}))
    req = build.request_from_job(job, sites=None, engines=None)
    prof = build.build_profile(req, source="measured")
    (t,) = prof.sites["local"].training
    assert (t.backend, t.tp, t.pp, t.gpu_s_per_token) == ("megatron", 1, 1, 5e-5)
    ppo = dataclasses.replace(req, algorithm=PpoAlgorithm(kind="ppo"))
    (t,) = build.build_profile(ppo, source="measured").sites["local"].training
    assert asked == [("grpo", "megatron"), ("ppo", "megatron")] and t.backend == "megatron"
    analytical = build.build_profile(req, source="analytical")
    assert {e.backend for e in analytical.sites["local"].training} == {None}  # a roofline: any backend


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_a_tiny_megatron_training_step_is_measured_by_rlctl_profile(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, algorithm: str
) -> None:
    require_megatron()
    fake_generation(monkeypatch)
    measured: list[measure_train.TrainMeasurement] = []
    real = measure_train.measure_training

    def spy(*args: Any, **kw: Any) -> measure_train.TrainMeasurement:
        measured.append(real(*args, **kw))
        return measured[-1]

    monkeypatch.setattr(measure_train, "measure_training", spy)
    job = job_file(tmp_path, trainer={"backend": "megatron"}, algorithm={"kind": algorithm, "kl_coef": 0.05})
    r = cli("profile", "--job", str(job), "--source", "measured", "-o", str(tmp_path / "p.yaml"))
    assert r.exit_code == 0, r.stderr
    assert not dist.is_initialized()  # the one-rank group formed for megatron is gone with its parallel state
    (m,) = measured
    assert (m.backend, m.tp, m.pp, len(m.step_s)) == ("megatron", 1, 1, 3)
    (t,) = load_profile(tmp_path / "p.yaml").sites["local"].training
    assert (t.backend, t.tp, t.pp) == ("megatron", 1, 1)
    assert t.gpu_s_per_token == m.gpu_s_per_token > 0


def test_torch_and_megatron_time_the_same_batch() -> None:
    require_megatron()
    algo = GrpoAlgorithm(kind="grpo", kl_coef=0.05)
    runs = {
        b: measure_train.measure_training(algo, SMALL, backend=b, steps=2, warmup_steps=1, clock=time.thread_time)
        for b in ("torch", "megatron")
    }
    assert runs["torch"].step_tokens == runs["megatron"].step_tokens  # the same synthetic iterations
    assert [m.backend for m in runs.values()] == ["torch", "megatron"]
    assert all(m.gpu_s_per_token > 0 for m in runs.values())
    print({b: f"{m.gpu_s_per_token:.3g} s/token" for b, m in runs.items()})  # `pytest -s`: the two figures


def test_a_jobs_megatron_split_gets_its_measured_entry_and_plan_names_a_split_the_profile_lacks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A measured profile of a job that fixes a megatron split holds the measured tp 1 pp 1 entry and the
    split's, as the probe measured it over its ranks (the stages' waiting included, so plan adds no bubble to
    it); planning a job whose split the measured profile lacks is refused in one line naming the entry."""
    from rlctl.models.catalog import ModelArch
    from rlctl.planner.plan import make_plan

    asked: list[tuple[int, int] | None] = []

    def fake_probe(s: probe.ProbeSpec) -> dict[str, Any]:
        asked.append(s.split)
        gen = GenerationEntry(
            tp=1, contexts=[16], batch_sizes=[1], ptl_s=[[1e-3]], prefill_s_per_token=0, kv_capacity_tokens=9
        )
        out = {"generation": [gen.model_dump(mode="json")], "training": {"gpu_s_per_token": 5e-5}}
        if s.split is not None:
            tp, pp = s.split
            split = {"tp": tp, "pp": pp, "gpu_s_per_token": 3e-4}
            out["training_split"] = {"split": split, "single": {"tp": 1, "pp": 1, "gpu_s_per_token": 6e-5}}
        return out

    monkeypatch.setattr(build, "measure_here", fake_probe)
    monkeypatch.setattr(probe, "megatron_available", lambda: None)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})  # the split's 4 ranks fit
    # a model that tp 2 × pp 2 splits (tiny-demo's 3 heads and 3 layers do not)
    four = TinyGPT(TinyGPTConfig(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4))
    job = load_job(job_file(tmp_path, trainer={"backend": "megatron", "tensor_parallel": 2, "pipeline_parallel": 2}))
    req = build.request_from_job(job, sites=None, engines=None)
    assert req.model_split == (2, 2)
    split = dataclasses.replace(
        req, arch=ModelArch("four", 4, 96, 4, 4, 66, 256, 1e6), model_name=None,
        checkpoint=four.save_pretrained(tmp_path / "four"),
    )  # fmt: skip
    entries = {(e.tp, e.pp): e for e in build.build_profile(split, source="measured").sites["local"].training}
    assert asked == [(2, 2)]
    assert sorted(entries) == [(1, 1), (2, 2)]
    assert (entries[1, 1].gpu_s_per_token, entries[1, 1].pipeline_wait_included) == (5e-5, False)
    assert (entries[2, 2].backend, entries[2, 2].gpu_s_per_token, entries[2, 2].pipeline_wait_included) == (
        "megatron", 3e-4, True,
    )  # fmt: skip
    roofline = {(e.tp, e.pp): e for e in build.build_profile(split, source="analytical").sites["local"].training}
    assert entries[2, 2].fixed_bytes_per_gpu == roofline[2, 2].fixed_bytes_per_gpu  # memory: the roofline's
    torch_split = dataclasses.replace(split, trainer_backend="torch")  # torch has no model parallelism
    assert [(e.tp, e.pp) for e in build.build_profile(torch_split, source="measured").sites["local"].training] == [
        (1, 1)
    ]
    assert asked == [(2, 2), None]
    # a profile without the job's split (e.g. made from options, not the job): plan says so, for a split megatron
    # runs (pp 3 of tiny-demo's 3 layers; its tp 2 × pp 2 plan refuses first, as check does: 2 ∤ 3 layers)
    placement = {"trainer": {"site": "local", "gpus": 3}, "rollout": [{"site": "local", "gpus": 1}]}
    pp3 = load_job(job_file(tmp_path, trainer={"backend": "megatron", "pipeline_parallel": 3}, placement=placement))
    prof = build.build_profile(dataclasses.replace(req, model_split=None), source="measured")
    with pytest.raises(
        ConfigError, match=r"sites\.local\.training: no entry at the job's tp 1 pp 3 \(it has tp, pp: 1 1\)"
    ):
        make_plan(pp3, prof, profile_file="p.yaml")
    with pytest.raises(ConfigError, match=r"trainer\.pipeline_parallel: 2 does not divide the model's num_hidden"):
        make_plan(job, prof, profile_file="p.yaml")


def test_a_profile_with_the_old_scaled_key_loads_unless_an_entry_was_scaled(tmp_path: Path) -> None:
    """`scaled` was written by earlier versions: false on every entry means what no key means; a scaled entry
    (tp 1 pp 1 × the roofline's ratio) is refused in one line saying how to measure the split."""
    prof = build.build_profile(
        build.request_from_options([ROOT / "clusters/local.yaml"], model="tiny-demo", algorithm="grpo", sites=None,
                                   engines=None),
        source="analytical",
    )  # fmt: skip
    save_profile(prof, tmp_path / "p.yaml")
    data = yaml.safe_load((tmp_path / "p.yaml").read_text())
    for e in data["sites"]["local"]["training"]:
        e["scaled"] = False
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(data))
    assert load_profile(tmp_path / "old.yaml") == prof
    data["sites"]["local"]["training"][1]["scaled"] = True
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_profile(tmp_path / "old.yaml")
    assert str(e.value) == (
        f"{tmp_path / 'old.yaml'}: sites.local.training[1]: scaled: this entry was scaled from tp 1 pp 1 by the "
        "roofline (an older rlctl profile); measure the split: rlctl profile --job JOB --source measured"
    )


@pytest.mark.parametrize("backend", ["torch", "megatron"])
def test_a_training_step_of_a_model_whose_window_binds_is_measured_within_it(tmp_path: Path, backend: str) -> None:
    """A Mistral v0.1-shaped checkpoint (its sliding_window below its positions) is trained by the probe on
    sequences within the window (`SampleLengths().context`): its trainer is built for them, versus for every
    position — which `window_refusal` refuses, so `rlctl profile --source measured` ended in that line."""
    if backend == "megatron":
        require_megatron()
    config = TinyGPTConfig(architecture=MISTRAL, max_position_embeddings=4 * measure_train.SampleLengths().context)
    TinyGPT(config).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(saved | {"sliding_window": measure_train.SampleLengths().context}))
    m = measure_train.measure_training(
        GrpoAlgorithm(kind="grpo", kl_coef=0.05), SMALL, backend=backend, checkpoint=tmp_path, steps=1, warmup_steps=0
    )
    assert m.backend == backend and m.gpu_s_per_token > 0


def short_model(directory: Path, kind: str) -> Path:
    """A checkpoint of 32 positions (Llama's shape), or a longrope Phi3 of 128 positions pretrained on 32."""
    if kind == "longrope":
        pytest.importorskip("transformers")
        from tests.unit.rope_checkpoints import phi3

        phi3(directory)
        return directory
    return TinyGPT(TinyGPTConfig(max_position_embeddings=32)).save_pretrained(directory)


@pytest.mark.parametrize(
    "kind,backend", [("positions", "torch"), ("positions", "megatron"), ("longrope", "torch")]
)  # fmt: skip
def test_a_training_step_of_a_model_of_few_positions_is_measured_on_sequences_it_holds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: str, backend: str
) -> None:
    """A model that holds 32 tokens (max_position_embeddings 32, or a longrope model's pretraining context 32, which
    `rlctl check` holds a job's sequences to) is trained by the probe on samples of at most 32 tokens, its trainer
    built for 32, versus 56-token samples (`SampleLengths()`): `sequence of 54 tokens > max_position_embeddings 32`
    ended the measurement, and the longrope model was timed past its pretraining context (its long_factor pass)."""
    if backend == "megatron":
        require_megatron()
    checkpoint = short_model(tmp_path / "model", kind)
    longest: list[int] = []
    real = measure_train.synthetic_samples

    def samples(**kw: Any) -> Any:
        out = real(**kw)
        longest.append(max(len(s.prompt_tokens) + len(s.output_tokens) for s in out))
        return out

    monkeypatch.setattr(measure_train, "synthetic_samples", samples)
    m = measure_train.measure_training(
        GrpoAlgorithm(kind="grpo", kl_coef=0.05), SMALL, backend=backend, checkpoint=checkpoint, steps=2, warmup_steps=0
    )
    assert m.gpu_s_per_token > 0 and len(longest) == 2 and max(longest) <= 32, longest
    lengths = measure_train.SampleLengths.of(TinyGPT.from_pretrained(checkpoint).config, model="m")
    assert (lengths.prompt_tokens, lengths.output_tokens, lengths.context) == (8, (16, 24), 32)


def test_a_model_that_holds_no_prompt_and_output_is_refused_by_the_training_probe_in_one_line(tmp_path: Path) -> None:
    checkpoint = TinyGPT(TinyGPTConfig(max_position_embeddings=8)).save_pretrained(tmp_path / "m")
    with pytest.raises(UsageError) as e:
        measure_train.measure_training(GrpoAlgorithm(kind="grpo"), SMALL, checkpoint=checkpoint, steps=1)
    assert str(e.value) == (
        f"model {checkpoint}: holds sequences of 8 tokens (max_position_embeddings, a binding sliding_window or "
        "longrope's pretraining context: the least); the training probe needs 9 (a prompt of 8 tokens and an output "
        "token)"
    )


@pytest.mark.timeout(120)
def test_a_megatron_split_of_a_model_of_few_positions_is_measured_on_sequences_it_holds(tmp_path: Path) -> None:
    """The split's ranks (measure_split.run_rank) hold their samples to the model's 32 positions as the one-rank
    probe does, versus each rank ending in `sequence of … tokens > max_position_embeddings 32`."""
    require_megatron()
    from rlctl.profiler import measure_split

    checkpoint = short_model(tmp_path / "model", "positions")
    m = measure_split.measure_split(
        GrpoAlgorithm(kind="grpo"), SMALL, tp=1, pp=1, checkpoint=checkpoint, steps=1, warmup_steps=0
    )
    assert m.gpu_s_per_token > 0 and m.step_tokens[0] <= 8 * 32
