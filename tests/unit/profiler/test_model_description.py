"""One description of a model's architecture (`rlctl.config.model.ArchFigures`): a job's `kind: arch` model and a
profile's `model` take the same figures under the same bounds, and the files written before they were one still load
as they were and are written back in the same shape."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from rlctl.config.job import load_job
from rlctl.errors import ConfigError
from rlctl.hardware import CATALOG, GpuSpec
from rlctl.models.catalog import BUILTIN_MODELS, ModelArch
from rlctl.models.hf import read_config
from rlctl.planner.inputs import profile_for
from rlctl.profiler.actmem import Activations
from rlctl.profiler.analytical import ETA_FLOPS, decode_step_s, fixed_step_s, kv_capacity_tokens
from rlctl.profiler.profile import ModelSpec, load_profile, save_profile

# as `rlctl profile` wrote one before (docs/profile-format.md's example, its grid cut to one row)
OLD_PROFILE = """\
apiVersion: rlctl/v1
kind: Profile
source: analytical
model: {name: qwen2.5-7b, layers: 28, hidden: 3584, heads: 28, kv_heads: 4, vocab: 152064, intermediate: 18944, \
params: 7.62e9, bytes_per_param: 2}
algorithm: grpo
training_passes: {reference: false, old_logprobs: false, epochs: 1, mini_batches: 1, recompute: false}
sites:
  h20:
    gpu: H20
    gpus_per_node: 8
    hbm_bytes: 96000000000.0
    cost_per_gpu_hour: 1.0
    generation:
    - tp: 1
      contexts: [1024, 2048]
      batch_sizes: [1, 2]
      ptl_s: [[0.0076, 0.0077], [0.0080, 0.0081]]
      prefill_s_per_token: 2.06e-4
      prefill_fixed_s: 0.0
      kv_capacity_tokens: 1240931
    training:
    - {tp: 1, pp: 1, gpu_s_per_token: 7.72e-4, fixed_bytes_per_gpu: 3.25e10, sharded_bytes_per_gpu: 9.14e10}
"""
FIGURES = "name: my-arch, layers: 4, hidden: 256, heads: 4, kv_heads: 2, vocab: 1000, intermediate: 512, params: 3.0e6"
INV = """\
apiVersion: rlctl/v1
kind: Inventory
sites:
  h20:
    datacenter: dc-b
    scheduler: {kind: ssh, user: rl}
    gpu: H20
    nodes: [{host: "h20-[01-04]", gpus: 8}]
"""
JOB = f"""\
apiVersion: rlctl/v1
kind: Job
name: j1
inventory: [inv.yaml]
model: {{kind: arch, {FIGURES}}}
task: {{kind: lengths}}
placement:
  trainer: {{site: h20, gpus: 8}}
  rollout: [{{site: h20, gpus: auto}}]
"""


def test_a_profile_written_before_loads_and_is_written_back_with_its_model_as_it_was(tmp_path: Path) -> None:
    old = tmp_path / "old.yaml"
    old.write_text(OLD_PROFILE)
    prof = load_profile(old)
    assert prof.model.arch == BUILTIN_MODELS["qwen2.5-7b"]
    save_profile(prof, again := tmp_path / "again.yaml")
    model = yaml.safe_load(again.read_text())["model"]
    figures = ["name", "layers", "hidden", "heads", "kv_heads", "vocab", "intermediate", "params"]
    assert list(model) == [*figures, "bytes_per_param"]
    assert model == {**yaml.safe_load(OLD_PROFILE)["model"], "params": 7.62e9}  # (YAML 1.1 reads 7.62e9 as a string)
    assert load_profile(again) == prof


def test_a_profile_s_model_without_bytes_per_param_is_bf16_as_before(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(OLD_PROFILE.replace(", bytes_per_param: 2}", "}"))
    assert load_profile(path).model.arch.bytes_per_param == 2
    path.write_text(OLD_PROFILE.replace("bytes_per_param: 2", "bytes_per_param: 4"))
    assert load_profile(path).model.arch.weight_bytes == 4 * 7.62e9


def write_job(tmp_path: Path, figures: str = FIGURES) -> Path:
    (tmp_path / "inv.yaml").write_text(INV)
    (tmp_path / "job.yaml").write_text(JOB.replace(FIGURES, figures))
    return tmp_path / "job.yaml"


def test_a_job_s_arch_model_is_planned_with_a_profile_of_the_same_figures(tmp_path: Path) -> None:
    job = load_job(write_job(tmp_path))
    arch = ModelArch("my-arch", 4, 256, 4, 2, 1000, 512, 3.0e6)
    assert job.spec.model.arch == arch
    prof = profile_for(job, None)  # the analytical profile of the job's model
    assert prof.model.arch == arch
    save_profile(prof, path := tmp_path / "p.yaml")
    assert profile_for(job, load_profile(path)).model == prof.model


def test_a_job_s_arch_model_takes_the_eight_figures_only(tmp_path: Path) -> None:
    """bytes_per_param is a profile's key, not a job's (the job file's format is as it was)."""
    with pytest.raises(ConfigError, match=r"model\.bytes_per_param: unknown key"):
        load_job(write_job(tmp_path, FIGURES + ", bytes_per_param: 4"))


@pytest.mark.parametrize(("field", "bad"), [("layers", "0"), ("kv_heads", "-1"), ("params", "0.0")])
def test_a_figure_out_of_bounds_is_refused_alike_in_a_job_and_a_profile(tmp_path: Path, field: str, bad: str) -> None:
    good = {"layers": "4", "kv_heads": "2", "params": "3.0e6"}[field]
    with pytest.raises(ConfigError, match=rf"model\.{field}: .*greater than 0") as in_job:
        load_job(write_job(tmp_path, FIGURES.replace(f"{field}: {good}", f"{field}: {bad}")))
    path = tmp_path / "p.yaml"
    old = {"layers": "28", "kv_heads": "4", "params": "7.62e9"}[field]
    path.write_text(OLD_PROFILE.replace(f"{field}: {old}", f"{field}: {bad}", 1))
    with pytest.raises(ConfigError, match=rf"model\.{field}: .*greater than 0") as in_profile:
        load_profile(path)
    assert str(in_job.value).split(f"model.{field}: ")[1] == str(in_profile.value).split(f"model.{field}: ")[1]


# Qwen3-0.6B's attention: 16 query heads and 8 KV heads of 128, in a hidden of 1024 (hidden / heads would be 64)
QWEN3_LIKE = "name: qwen3-like, layers: 28, hidden: 1024, heads: 16, kv_heads: 8, vocab: 151936, intermediate: 3072, \
params: 6.0e8, head_dim: 128"


def test_a_head_wider_than_hidden_over_heads_is_kept_from_the_job_to_the_profile_and_back(tmp_path: Path) -> None:
    # head_dim was no key of a job's arch model, and a profile's model dropped the HF config's: its KV cache was
    # sized at hidden / heads = 64 a head, half the bytes a token holds
    job = load_job(write_job(tmp_path, QWEN3_LIKE))
    arch = job.spec.model.arch
    assert arch.head_dim == 128 and arch.kv_bytes_per_token == 2 * 28 * 8 * 128 * 2
    prof = profile_for(job, None)
    assert prof.model.arch == arch
    save_profile(prof, path := tmp_path / "p.yaml")
    assert yaml.safe_load(path.read_text())["model"]["head_dim"] == 128
    assert load_profile(path).model.arch == arch
    h20 = prof.sites["h20"].generation[0]
    assert h20.kv_capacity_tokens == kv_capacity_tokens(arch, CATALOG["H20"], tp=h20.tp)


def test_an_hf_config_s_explicit_head_dim_reaches_the_profile_s_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "vocab_size": 1000,
                "hidden_size": 1024,
                "intermediate_size": 3072,
                "num_hidden_layers": 4,
                "num_attention_heads": 16,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "max_position_embeddings": 4096,
                "torch_dtype": "bfloat16",
            }
        )
    )
    arch = read_config(tmp_path).arch("qwen3-like")
    assert arch.head_dim == 128
    assert ModelSpec.of(arch).arch == arch


def test_a_head_dim_of_hidden_over_heads_is_no_key_of_a_written_profile(tmp_path: Path) -> None:
    job = load_job(write_job(tmp_path, FIGURES + ", head_dim: 64"))  # 256 / 4: the default, said
    assert job.spec.model.arch == ModelArch("my-arch", 4, 256, 4, 2, 1000, 512, 3.0e6)
    save_profile(profile_for(job, None), path := tmp_path / "p.yaml")
    assert "head_dim" not in yaml.safe_load(path.read_text())["model"]


def test_a_job_s_arch_model_says_its_qk_norms_and_is_priced_as_the_qwen3_built_in(tmp_path: Path) -> None:
    """`qk_norm: true` (Qwen3's per-head RMSNorms of q and k): a dense Qwen3 described by its figures is priced as the
    built-in (a layer's activations 14 % more than without); the key is written only where true, so a job's model
    without it is written as before, and a profile does not write it (activations are priced of the job's model)."""
    figures = "name: qwen3-8b, layers: 36, hidden: 4096, heads: 32, kv_heads: 8, vocab: 151936, intermediate: 12288, "
    figures += "params: 8.19e9"
    builtin = BUILTIN_MODELS["qwen3-8b"]
    job = load_job(write_job(tmp_path, figures + ", qk_norm: true"))
    arch = job.spec.model.arch
    assert arch == builtin and arch.qk_norm
    cut = Activations(arch, rows=4, seq_tokens=4096)
    without = dataclasses.replace(cut, arch=dataclasses.replace(arch, qk_norm=False))
    assert cut.rank_bytes() == dataclasses.replace(cut, arch=builtin).rank_bytes() > without.rank_bytes()
    assert job.spec.model.model_dump()["qk_norm"] is True
    before = load_job(write_job(tmp_path, figures)).spec.model
    assert not before.arch.qk_norm and "qk_norm" not in before.model_dump()
    save_profile(profile_for(job, None), path := tmp_path / "p.yaml")
    assert "qk_norm" not in yaml.safe_load(path.read_text())["model"]


def test_a_job_s_arch_model_says_its_tied_embeddings_and_is_priced_as_the_built_in(tmp_path: Path) -> None:
    """`tied: true` (HF's tie_word_embeddings): Qwen3-4B described by its figures is priced as the built-in (lm_head's
    bf16 weight copy, 2·V·h, kept); the key is written only where true, so a job's model without it is written as
    before, and a profile does not write it (activations are priced of the job's model)."""
    figures = "name: qwen3-4b, layers: 36, hidden: 2560, heads: 32, kv_heads: 8, vocab: 151936, intermediate: 9728, "
    figures += "params: 4.02e9, head_dim: 128, qk_norm: true"
    builtin = BUILTIN_MODELS["qwen3-4b"]
    job = load_job(write_job(tmp_path, figures + ", tied: true"))
    arch = job.spec.model.arch
    assert arch == builtin and arch.tied
    cut = Activations(arch, rows=1, seq_tokens=4096)
    untied = dataclasses.replace(cut, arch=dataclasses.replace(arch, tied=False))
    assert cut.rank_bytes() == dataclasses.replace(cut, arch=builtin).rank_bytes()
    assert cut.rank_bytes() - untied.rank_bytes() == 2 * 151936 * 2560  # lm_head's bf16 copy, unsharded
    assert job.spec.model.model_dump()["tied"] is True
    before = load_job(write_job(tmp_path, figures)).spec.model
    assert not before.arch.tied and "tied" not in before.model_dump()
    save_profile(profile_for(job, None), path := tmp_path / "p.yaml")
    assert "tied" not in yaml.safe_load(path.read_text())["model"]


def test_the_roofline_s_attention_flops_are_heads_times_head_dim_wide() -> None:
    # 4·layers·hidden·C per token: 1024 wide where Qwen3-0.6B's 16 heads of 128 are 2048
    arch = ModelArch("qwen3-like", 28, 1024, 16, 8, 151936, 3072, 6.0e8, explicit_head_dim=128)
    slow = GpuSpec("slow", 1e-3, 1000.0, 1000.0, 900.0, 1.0)  # FLOPs-bound by far
    batch, context = 4, 8192
    flops = (2 * 6.0e8 + 4 * 28 * 16 * 128 * context) * batch
    t = decode_step_s(arch, slow, tp=1, batch=batch, context=context) - fixed_step_s(slow, arch)
    assert t == pytest.approx(flops / (ETA_FLOPS * slow.flops), rel=1e-9)


@pytest.mark.parametrize("name", ['""', '"  "'])
def test_an_empty_model_name_is_refused_alike_in_a_job_and_a_profile(tmp_path: Path, name: str) -> None:
    # taken: a profile of model '' matched a job of model '', and the plan spoke of "model  does not fit"
    with pytest.raises(ConfigError, match=r"model\.name: the name is empty") as in_job:
        load_job(write_job(tmp_path, FIGURES.replace("name: my-arch", f"name: {name}")))
    path = tmp_path / "p.yaml"
    path.write_text(OLD_PROFILE.replace("name: qwen2.5-7b", f"name: {name}"))
    with pytest.raises(ConfigError, match=r"model\.name: the name is empty") as in_profile:
        load_profile(path)
    for refused in (in_job, in_profile):
        assert "\n" not in str(refused.value)


def test_a_blank_hf_model_name_is_one_line_from_plan_not_a_traceback(tmp_path: Path) -> None:
    # an HF model's name is its architecture's, which the profile `plan` makes of it refuses blank: a pydantic
    # ValidationError traceback ('1 validation error for ModelSpec'), versus the job's field named in one line
    from rlctl.models.tinygpt import TinyGPT
    from tests.conftest import run_cli
    from tests.unit.hf_tokenizer import write_tokenizer
    from tests.unit.tiny_models import small_config

    TinyGPT(small_config(positions=64)).save_pretrained(tmp_path / "model")
    write_tokenizer(tmp_path / "model")
    (tmp_path / "inv.yaml").write_text(INV)
    (tmp_path / "job.yaml").write_text(JOB.replace(f"{{kind: arch, {FIGURES}}}", '{kind: hf, path: model, name: "  "}'))
    r = run_cli("plan", str(tmp_path / "job.yaml"))
    assert r.exit_code == 2 and r.stderr.startswith(f"rlctl: error: {tmp_path}/job.yaml: model.name: the name is empty")
    assert len(r.stderr.splitlines()) == 1, r.stderr
    named = JOB.replace(f"{{kind: arch, {FIGURES}}}", "{kind: hf, path: model, name: tiny}")
    # (within the checkpoint's 64 positions: a longer task is refused them, `rlctl.planner.context`)
    named = named.replace(
        "{kind: lengths}", "{kind: lengths, prompt_tokens: 16, median_output_tokens: 16, max_output_tokens: 48}"
    )
    (tmp_path / "job.yaml").write_text(named)  # a name, or none: planned as before
    assert run_cli("plan", str(tmp_path / "job.yaml")).exit_code == 0
