"""`rlctl profile --source measured` wiring: which engines the probe measures (fakes for vLLM), the
training step it times, how a profile names its engines, and how `plan` picks the job's engine."""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from rlctl.buildid import code_digest
from rlctl.config import load_job
from rlctl.config.algorithm import GrpoAlgorithm, PpoAlgorithm
from rlctl.config.pipeline import Batch
from rlctl.engines.factory import vllm_available
from rlctl.errors import ConfigError, UsageError
from rlctl.launch.sitefs import LocalFiles
from rlctl.models.hf import MISTRAL, TinyGPTConfig
from rlctl.models.tinygpt import TinyGPT
from rlctl.planner.inputs import PlanOptions
from rlctl.planner.plan import make_plan
from rlctl.profiler import build, measure_train, probe
from rlctl.profiler.profile import GenerationEntry, load_profile, save_profile
from rlctl.profiler.remote import stage_checkpoint
from tests.conftest import ROOT, CliResult

Cli = Callable[..., CliResult]


def spec(*, engines: tuple[str, ...], checkpoint: str | None = "/ckpt", model: str | None = None) -> probe.ProbeSpec:
    return probe.ProbeSpec(
        model, checkpoint, engines, 1000, PpoAlgorithm(kind="ppo", kl_coef=0.05), Batch(train_micro_batch_tokens=None)
    )


def entry(ptl_s: float) -> GenerationEntry:
    return GenerationEntry(
        tp=1,
        contexts=[16],
        batch_sizes=[1, 8],
        ptl_s=[[ptl_s, 2 * ptl_s]],
        prefill_s_per_token=1e-6,
        kv_capacity_tokens=99,
    )


def test_probe_spec_round_trips_through_its_command_line() -> None:
    s = spec(engines=("embedded", "vllm"))
    back, out = probe.parse_spec([*s.argv(), "--out", "/tmp/x.json"])
    assert back == s and out == Path("/tmp/x.json")
    builtin = probe.ProbeSpec("tiny-demo", None, ("embedded",), 5, GrpoAlgorithm(kind="grpo"), Batch())
    assert probe.parse_spec([*builtin.argv(), "--out", "o"])[0] == builtin
    of_a_job = dataclasses.replace(builtin, job_context=159)  # (a remote site's probe: the job's context too)
    assert "--job-context" not in builtin.argv() and probe.parse_spec([*of_a_job.argv(), "--out", "o"])[0] == of_a_job


def test_engines_are_checked_before_anything_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match="vllm engine runs Hugging Face checkpoints"):
        probe.check_engines(spec(engines=("vllm",), checkpoint=None, model="tiny-demo"))
    with pytest.raises(UsageError, match=r"runs 'tiny-demo' or an HF checkpoint; got 'qwen2\.5-7b'"):
        probe.check_engines(spec(engines=("embedded",), checkpoint=None, model="qwen2.5-7b"))
    monkeypatch.setattr(probe, "vllm_available", lambda: "pip install 'rlctl[vllm]'")
    with pytest.raises(UsageError, match=r"pip install 'rlctl\[vllm\]'") as e:
        probe.check_engines(spec(engines=("embedded", "vllm")))
    assert e.value.exit_code == 2 and "--engine embedded" in (e.value.hint or "")
    probe.check_engines(spec(engines=("vllm",)), vllm_here=False)  # a remote site: vLLM is looked for there


@pytest.mark.parametrize(
    ("window", "contexts", "built_for"),
    [(None, [16, 64], 64 + 16), (48, [16], 16 + 16), (16, [8], 16)],
    ids=["no-window", "window-48", "window-16"],
)
def test_measure_here_measures_each_engine_and_a_training_step(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, window: int | None, contexts: list[int], built_for: int
) -> None:
    """Each engine at the contexts that fit the model's 128 positions — or its Mistral sliding_window where that
    binds (a longer sequence is one the model is not built for: `window_refusal`) — with the engine's model built
    for the longest measured (its RoPE tables), versus every position the checkpoint has, and a Mistral v0.1
    refused by `rlctl profile --source measured` in one line."""
    events: list[Any] = []
    config = TinyGPTConfig(architecture=MISTRAL, max_position_embeddings=128)
    checkpoint = str(TinyGPT(config).save_pretrained(tmp_path / "ckpt"))
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(saved | {"sliding_window": window}))
    net = SimpleNamespace(config=config)

    def fake_policy(path: str, *, compute: Any, context: int | None) -> Any:
        events.append(("policy", path == checkpoint, context))
        assert TinyGPT.from_pretrained(path, context=context).context == context  # (it is built: no refusal)
        return net

    def fake_vllm(checkpoint: str, *, contexts: list[int], **kw: Any) -> GenerationEntry:
        events.append(("vllm", checkpoint, contexts, kw["kv_capacity_tokens"]))
        return entry(2e-3)

    def fake_embedded(factory: Any, *, contexts: list[int], padded_attention: bool, **kw: Any) -> GenerationEntry:
        events.append(("embedded", contexts, padded_attention))
        return entry(1e-3).model_copy(update={"padded_attention": padded_attention})

    def fake_train(
        algorithm: Any, batch: Batch, *, backend: str, checkpoint: str | None, clock: Any, compute: Any, lora: Any
    ) -> Any:
        assert compute.device.type == "cpu" and lora is None  # a CPU site's probe: the CPU, fp32; no LoRA asked
        events.append(("train", backend, algorithm.kind, algorithm.kl_coef, checkpoint, clock is time.thread_time))
        return measure_train.TrainMeasurement(3e-5, [0.1], [1000])

    monkeypatch.setattr(probe, "vllm_available", lambda: None)
    monkeypatch.setattr(probe, "measure_vllm", fake_vllm)
    monkeypatch.setattr(probe, "measure_generation", fake_embedded)
    monkeypatch.setattr(probe, "embedded_engines_on", lambda n: events.append(("factory", n is net)))
    monkeypatch.setattr(measure_train, "load_policy", fake_policy)
    monkeypatch.setattr(measure_train, "measure_training", fake_train)
    out = probe.measure_here(spec(engines=("embedded", "vllm"), checkpoint=checkpoint))
    assert events == [
        ("policy", True, built_for),
        ("factory", True),
        ("embedded", contexts, True),  # a context + margin fits the positions (160 + 16 does not fit 128)
        ("vllm", checkpoint, contexts, 1000),
        ("train", "torch", "ppo", 0.05, checkpoint, True),
    ]
    gen = [GenerationEntry.model_validate(g) for g in out["generation"]]
    assert [(g.engine, g.padded_attention, g.ptl_s[0][0]) for g in gen] == [
        ("embedded", True, 1e-3),
        ("vllm", False, 2e-3),
    ]
    assert out["training"]["gpu_s_per_token"] == 3e-5


def test_a_longrope_models_probe_stays_within_its_pretraining_context(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A longrope Phi3 of 128 positions pretrained on 32 (original_max_position_embeddings): the probe's contexts,
    its embedded engine's model and vLLM's max_model_len are held to 32, as a job's are (`rlctl check`:
    `rope.longrope_refusal`), versus contexts [16, 64] on a model built for 80 tokens, which the embedded engine
    refuses (engines and trainer would switch to long_factor apart), and vLLM's max_model_len 128."""
    pytest.importorskip("transformers")
    from tests.unit.rope_checkpoints import LONGROPE_CONTEXT, phi3

    phi3(tmp_path / "ckpt", partial=0.75)
    checkpoint = str(tmp_path / "ckpt")
    asked: list[Any] = []

    def fake_vllm(path: str, *, contexts: list[int], context: int | None, **kw: Any) -> GenerationEntry:
        asked.append((contexts, context))
        return entry(2e-3)

    def fake_train(*args: Any, **kw: Any) -> Any:
        return measure_train.TrainMeasurement(3e-5, [0.1], [1000])

    monkeypatch.setattr(probe, "vllm_available", lambda: None)
    monkeypatch.setattr(probe, "measure_vllm", fake_vllm)
    monkeypatch.setattr(measure_train, "measure_training", fake_train)
    monkeypatch.setattr(probe, "LOCAL_BATCHES", [1, 2])  # (the embedded engine measured for real, on 2 batches)
    out = probe.measure_here(spec(engines=("embedded", "vllm"), checkpoint=checkpoint))
    (embedded, _) = [GenerationEntry.model_validate(g) for g in out["generation"]]
    assert embedded.contexts == [16] and embedded.batch_sizes == [1, 2]  # 16 + a margin of 16 fits 32; 64 does not
    assert asked == [([16], LONGROPE_CONTEXT)]  # vLLM's max_model_len: 32
    assert probe.probe_positions(TinyGPT.from_pretrained(checkpoint).config) == 32


def test_contexts_fit_the_models_positions() -> None:
    assert probe.contexts_for(320) == [16, 64, 160]
    assert probe.contexts_for(40) == [16]
    assert probe.contexts_for(24) == [12]


def test_a_jobs_cpu_grid_ends_at_the_context_its_plan_reads_held_to_the_positions_and_the_cpu_bound() -> None:
    """The grid's contexts below the job's and the job's (the prompt + half the longest output: a padded decode step's
    in the plan, `curves.live_context`), versus 16, 64, 160 for every job: 160 extrapolated past for a job of longer
    sequences, measured for nothing for a job of shorter ones."""
    assert probe.job_context(31, 256) == 159  # jobs/demo.yaml: digits, max_output_tokens 256
    assert probe.job_context(8, 15) == 16
    assert probe.contexts_for(320, 159) == [16, 64, 159]
    assert probe.contexts_for(320, 28) == [16, 28] and probe.contexts_for(320, 12) == [12]
    assert probe.contexts_for(320, 500) == [16, 64, 160, 304]  # tiny-demo's 320 positions, less the decode margin
    assert probe.contexts_for(32768, 4096) == [16, 64, 160, 640]  # the CPU's bound (LOCAL_MAX_CONTEXT)
    assert probe.contexts_for(24, 500) == [8]  # 24 positions less the decode margin


def test_a_jobs_measured_profile_is_measured_at_the_contexts_its_plan_reads(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`rlctl profile --job` of the demo with max_output_tokens 40 (longest request 8 + 40: its plan reads the decode
    curve at 28 at most) measures the embedded engine at 16 and 28, versus 16, 64 and 160; the plan of the job reads
    the profile."""
    data = yaml.safe_load((ROOT / "jobs/demo.yaml").read_text())
    data["inventory"] = [str(ROOT / "clusters/local.yaml")]
    data["task"] = {"kind": "digits", "max_output_tokens": 40}
    (job := tmp_path / "job.yaml").write_text(yaml.safe_dump(data))

    def fake_train(*args: Any, **kw: Any) -> Any:  # (the training step is not what this measures)
        return measure_train.TrainMeasurement(3e-5, [0.1], [1000])

    monkeypatch.setattr(measure_train, "measure_training", fake_train)
    monkeypatch.setattr(probe, "LOCAL_BATCHES", [1, 2])  # (the embedded engine measured for real, on 2 batches)
    r = cli("profile", "--job", str(job), "--source", "measured", "-o", str(tmp_path / "p.yaml"))
    assert r.exit_code == 0, r.stderr
    (embedded,) = load_profile(tmp_path / "p.yaml").sites["local"].generation
    assert embedded.contexts == [16, 28] and embedded.batch_sizes == [1, 2]
    r = cli("plan", str(job), "--profile", str(tmp_path / "p.yaml"), "-o", "json")
    assert r.exit_code == 0, r.stderr


def test_measured_profile_names_its_engines_and_holds_the_measured_training(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[tuple[str, tuple[str, ...], float]] = []

    def fake_probe(s: probe.ProbeSpec) -> dict[str, Any]:
        calls.append(("here", s.engines, s.algorithm.kl_coef))
        gens = [entry(1e-3 * (i + 1)).model_copy(update={"engine": e}) for i, e in enumerate(s.engines)]
        return {"generation": [g.model_dump(mode="json") for g in gens], "training": {"gpu_s_per_token": 4e-5}}

    monkeypatch.setattr(build, "measure_here", fake_probe)
    monkeypatch.setattr(probe, "vllm_available", lambda: None)
    job = load_job(ROOT / "jobs/demo.yaml")
    algo = PpoAlgorithm(kind="ppo", kl_coef=0.02)
    job.spec = job.spec.model_copy(update={"algorithm": algo})
    req = build.request_from_job(job, sites=None, engines=["embedded", "vllm"])
    assert req.engines == ("embedded", "vllm") and req.batch == job.spec.batch and req.algorithm == algo
    with pytest.raises(UsageError, match="vllm engine runs Hugging Face checkpoints"):
        build.build_profile(req, source="measured")  # tiny-demo is built in: no checkpoint for vLLM
    assert calls == []  # refused before measuring anything
    req = dataclasses.replace(req, model_name=None, checkpoint=Path("/ckpt"))
    prof = build.build_profile(req, source="measured")
    assert calls == [("here", ("embedded", "vllm"), 0.02)]
    site = prof.sites["local"]
    assert [e.engine for e in site.generation] == ["embedded", "vllm"]
    ((tp, pp, s_per_token),) = [(t.tp, t.pp, t.gpu_s_per_token) for t in site.training]
    assert (tp, pp, s_per_token) == (1, 1, 4e-5)
    assert prof.algorithm == "ppo" and prof.training_passes.reference is True
    save_profile(prof, tmp_path / "p.yaml")
    assert load_profile(tmp_path / "p.yaml") == prof
    # the probe's figure is per padded token, and the file says so (one without `per` is an older rlctl's)
    assert yaml.safe_load((tmp_path / "p.yaml").read_text())["sites"]["local"]["training"][0]["per"] == "padded_token"


def test_plan_takes_the_curve_of_the_jobs_engine(tmp_path: Path) -> None:
    job = load_job(ROOT / "jobs/demo.yaml")
    prof = build.build_profile(build.request_from_job(job, sites=None, engines=None), source="analytical")
    site = prof.sites["local"]
    fast, slow = entry(1e-4), entry(1e-2)
    both = prof.model_copy(
        update={
            "source": "measured",
            "sites": {
                "local": site.model_copy(
                    update={
                        "generation": [
                            fast.model_copy(update={"engine": "embedded"}),
                            slow.model_copy(update={"engine": "vllm"}),
                        ]
                    }
                )
            },
        }
    )
    opts = PlanOptions(sim_iterations=1)
    t_embedded = make_plan(job, both, opts)["predicted"]["t_gen_s"]
    job.spec = job.spec.model_copy(update={"rollout": job.spec.rollout.model_copy(update={"engine": "vllm"})})
    t_vllm = make_plan(job, both, opts)["predicted"]["t_gen_s"]
    assert t_vllm > 20 * t_embedded  # PTL 100× slower
    only_embedded = both.model_copy(
        update={
            "sites": {
                "local": both.sites["local"].model_copy(update={"generation": [both.sites["local"].generation[0]]})
            }
        }
    )
    with pytest.raises(ConfigError, match="measured with engine embedded; the job rolls out with 'vllm'"):
        make_plan(job, only_embedded, opts, profile_file="p.yaml")
    site = both.sites["local"]
    megatron = both.model_copy(
        update={
            "sites": {
                "local": site.model_copy(
                    update={"training": [t.model_copy(update={"backend": "megatron"}) for t in site.training]}
                )
            }
        }
    )
    assert job.spec.trainer.backend == "torch"
    with pytest.raises(ConfigError, match="measured with trainer backend megatron; the job trains with 'torch'"):
        make_plan(job, megatron, opts, profile_file="p.yaml")


def test_measure_training_times_the_learner_per_token() -> None:
    clock = SimpleNamespace(now=0.0)
    events: list[str] = []

    class FakeLearner:
        def add(self, sample: Any) -> None:
            clock.now += 0.01
            events.append("add")

        def train_ready(self) -> None:
            events.append("ready")

        def step(self) -> None:
            clock.now += 1.0
            events.append("step")

    batch = Batch(prompts_per_iteration=2, samples_per_prompt=2)
    m = measure_train.measure_training(
        GrpoAlgorithm(kind="grpo"), batch, steps=2, warmup_steps=1, clock=lambda: clock.now,
        learner_factory=FakeLearner, vocab=50,
    )  # fmt: skip
    assert events == (["add", "ready"] * 4 + ["step"]) * 3
    assert m.step_s == pytest.approx([1.04, 1.04])
    assert m.gpu_s_per_token == pytest.approx(statistics.median([1.04 / n for n in m.step_tokens]))
    assert all(4 * (8 + 16) <= n <= 4 * (8 + 48) for n in m.step_tokens)
    # per padded token: the step's 4 rows in one cut (32 rows a rank), each padded to the longest (per real token
    # until 2026-12-08)
    batches = [measure_train.synthetic_samples(prompts=2, group_size=2, vocab=50, seed=i) for i in (1, 2)]
    assert m.step_tokens == [4 * max(len(s.prompt_tokens) + len(s.output_tokens) for s in b) for b in batches]
    assert all(
        n > sum(len(s.prompt_tokens) + len(s.output_tokens) for s in b)
        for n, b in zip(m.step_tokens, batches, strict=True)
    )


@pytest.mark.parametrize("algorithm", [GrpoAlgorithm(kind="grpo", kl_coef=0.1), PpoAlgorithm(kind="ppo")])
def test_measure_training_runs_rlctls_learners_on_the_tiny_model(algorithm: GrpoAlgorithm | PpoAlgorithm) -> None:
    batch = Batch(prompts_per_iteration=2, samples_per_prompt=4)
    m = measure_train.measure_training(algorithm, batch, steps=1, warmup_steps=0, clock=time.thread_time)
    assert m.gpu_s_per_token > 0 and len(m.step_s) == 1 and m.step_tokens[0] >= 8 * (8 + 16)


def test_stage_checkpoint_copies_every_file(tmp_path: Path) -> None:
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"\0" * 10)
    (src / "sub").mkdir()  # not part of a checkpoint's top level: not copied
    where = stage_checkpoint(LocalFiles(), src, str(tmp_path / "site"))
    assert sorted(p.name for p in Path(where).iterdir()) == ["config.json", "model.safetensors"]


@pytest.mark.skipif(vllm_available() is None, reason="vLLM is installed here: tests/vllm measure it for real")
def test_measured_vllm_profile_without_vllm_is_one_line_exit_2(cli: Cli, tmp_path: Path) -> None:
    from rlctl.models.tinygpt import TinyGPT
    from tests.unit.tiny_models import small_config

    TinyGPT(small_config(positions=64)).save_pretrained(tmp_path / "m")
    r = cli(
        "profile", "--cluster", str(ROOT / "clusters/local.yaml"), "--model", str(tmp_path / "m"),
        "--engine", "vllm", "--source", "measured", "-o", str(tmp_path / "p.yaml"),
    )  # fmt: skip
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "pip install 'rlctl[vllm]'" in r.stderr and "--engine embedded" in r.stderr
    assert not (tmp_path / "p.yaml").exists()


def test_profile_of_a_job(cli: Cli, tmp_path: Path) -> None:
    r = cli("profile", "--job", str(ROOT / "jobs/cross-dc-7b.yaml"), "-o", str(tmp_path / "p.yaml"))
    assert r.exit_code == 0, r.stderr
    prof = yaml.safe_load((tmp_path / "p.yaml").read_text())
    assert set(prof["sites"]) == {"h800", "h20"} and prof["algorithm"] == "grpo"
    r = cli("plan", str(ROOT / "jobs/cross-dc-7b.yaml"), "--profile", str(tmp_path / "p.yaml"), "-o", "json")
    assert r.exit_code == 0, r.stderr
    r = cli("profile", "--job", str(ROOT / "jobs/demo.yaml"), "--cluster", str(ROOT / "clusters/local.yaml"))
    assert r.exit_code == 2 and "drop --cluster" in r.stderr and r.stderr.count("\n") == 1
    r = cli("profile", "--model", "tiny-demo")
    assert r.exit_code == 2 and "--model needs --cluster: " in r.stderr


def test_a_remote_site_is_measured_through_its_backend_and_looks_for_vllm_there(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from rlctl.profiler import remote

    started: list[tuple[str, tuple[str, ...], Path]] = []

    def fake_site(name: str, site: Any, s: probe.ProbeSpec, *, workdir: Path) -> dict[str, Any]:
        started.append((name, s.engines, workdir))
        g = entry(5e-3).model_copy(update={"engine": "vllm"})
        return {"generation": [g.model_dump(mode="json")], "training": {"gpu_s_per_token": 1e-6}}

    monkeypatch.setattr(remote, "measure_on_site", fake_site)
    monkeypatch.setattr(probe, "vllm_available", lambda: "not here")  # the operator's host has no vLLM
    req = build.request_from_options(
        [ROOT / "clusters/h20-rollout.yaml"], model="tiny-demo", algorithm="grpo", sites=None, engines=["vllm"]
    )
    req = dataclasses.replace(req, model_name=None, checkpoint=Path("/ckpt"))
    prof = build.build_profile(req, source="measured", workdir=tmp_path)
    assert started == [("h20", ("vllm",), tmp_path)]
    assert prof.sites["h20"].generation[0].engine == "vllm"


def test_a_gpu_sites_probe_measures_on_its_gpu(tmp_path: Path) -> None:
    """A GPU site's probe runs with --device cuda (its agents' device), one GPU asked of its scheduler; a host
    that cannot use CUDA refuses in one line instead of measuring the CPU and calling it the GPU."""
    import torch

    from rlctl.devices import DeviceError

    gpu = dataclasses.replace(spec(engines=("embedded",), checkpoint=None, model="tiny-demo"), device="cuda")
    assert "--device" in gpu.argv() and probe.parse_spec([*gpu.argv(), "--out", "o"])[0] == gpu
    clusters = [ROOT / "clusters" / "h800-trainer.yaml", ROOT / "clusters" / "local.yaml"]
    req = build.request_from_options(clusters, model="tiny-demo", algorithm="grpo", sites=None, engines=None)
    assert build._probe_spec(req, req.sites["h800"]).device == "cuda"
    assert build._probe_spec(req, req.sites["local"]).device == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="declares GPUs"):
            probe.measure_here(gpu)


@pytest.mark.parametrize(("gpu", "visible"), [("CPU", ""), ("H100", "0")])
def test_a_site_probe_sees_the_gpus_its_agents_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu: str, visible: str
) -> None:
    """A `gpu: CPU` site's probe got no CUDA_VISIBLE_DEVICES: on a GPU host it saw the host's GPUs, where the
    launcher's agents of that site see none (CUDA_VISIBLE_DEVICES="")."""
    from rlctl.config.inventory import Site
    from rlctl.profiler import remote

    started: list[dict[str, str]] = []

    class Started(Exception):
        pass

    class FakeBackends:
        def __init__(self, *args: Any, **kw: Any) -> None:
            pass

        def for_site(self, name: str) -> Any:
            def start(agent: Any) -> None:
                started.append(agent.env)
                raise Started

            return SimpleNamespace(start=start)

        def close(self) -> None:
            pass

    monkeypatch.setattr(remote, "Backends", FakeBackends)
    site = Site.model_validate(
        {"datacenter": "d", "scheduler": {"kind": "local"}, "gpu": gpu, "nodes": [{"host": "localhost", "gpus": 1}]}
    )
    device = "cpu" if gpu == "CPU" else "cuda"
    probe_spec = dataclasses.replace(spec(engines=("embedded",), checkpoint=None, model="tiny-demo"), device=device)
    with pytest.raises(Started):
        remote.measure_on_site("s", site, probe_spec, workdir=tmp_path)
    assert [env.get("CUDA_VISIBLE_DEVICES") for env in started] == [visible]
    assert started[0]["RLCTL_CODE"] == code_digest()  # a probe of other rlctl code refuses to measure
