"""A `kind: arch` model described as a MoE (`ArchFigures.experts`, `experts_per_token`, `expert_intermediate`, a
shared expert's width, its dense layers: HF's num_experts, num_experts_per_tok, moe_intermediate_size,
shared_expert_intermediate_size, mlp_only_layers) is priced as the built-in or the HF checkpoint of that shape is: its
activations at the width a token runs (`rlctl.profiler.actmem`), its FLOPs by its active parameters, derived where not
given. Before, the description took `active_params` alone, and its activations were priced as a dense model's of the
config's `intermediate` width."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlctl.config import load_job
from rlctl.config.model import ArchModel
from rlctl.hardware import CATALOG
from rlctl.models.catalog import BUILTIN_MODELS, ModelArch
from rlctl.models.hf import read_config
from rlctl.models.hfdir import check_hf_dir
from rlctl.profiler.actmem import Activations, job_activations
from rlctl.profiler.analytical import analytical_profile, training_entries
from rlctl.profiler.profile import load_profile, save_profile
from tests.conftest import run_cli
from tests.unit.planner.test_planner_context import _job, _refused

# each MoE built-in's experts as its config.json says them (experts_per_token and experts: the catalog's own)
EXPERTS = {
    "qwen3-30b-a3b": {"expert_intermediate": 768, "qk_norm": True},
    "qwen3-235b-a22b": {"expert_intermediate": 1536, "qk_norm": True},
    "qwen1.5-moe-a2.7b": {"expert_intermediate": 1408, "shared_expert_intermediate": 5632},
    "qwen2-57b-a14b": {"expert_intermediate": 2560, "shared_expert_intermediate": 20480},
}


def described(m: ModelArch, **extra: Any) -> dict[str, Any]:
    """Built-in `m` as a job's `kind: arch` model writes it: its figures, its experts' shape, no active_params."""
    figures = {f: getattr(m, f) for f in ("name", "layers", "hidden", "heads", "kv_heads", "vocab", "intermediate")}
    return {
        "kind": "arch",
        **figures,
        "params": m.params,
        "head_dim": m.head_dim,
        "max_positions": m.max_positions,
        "experts": m.experts,
        "experts_per_token": m.experts_per_token,
        **extra,
    }


@pytest.mark.parametrize("name", sorted(EXPERTS))
def test_an_arch_described_moe_is_priced_as_the_built_in(name: str) -> None:
    builtin = BUILTIN_MODELS[name]
    arch = ArchModel.model_validate(described(builtin, **EXPERTS[name])).arch
    assert arch == builtin  # active_params derived: params less the experts a token does not run
    assert arch.active == builtin.active and arch.active < 0.3 * arch.params
    moe = ("token_intermediate", "experts_per_token", "experts")  # (not compared by ==)
    assert [getattr(arch, f) for f in moe] == [getattr(builtin, f) for f in moe]
    for a in (Activations(arch, rows=4, seq_tokens=4096, max_tokens=8192), Activations(arch, rows=1, seq_tokens=512)):
        b = dataclasses.replace(a, arch=builtin)
        for kw in ({}, {"fsdp": True}, {"tp": 4, "pp": 2}):
            assert a.rank_bytes(**kw) == b.rank_bytes(**kw)
        checkpointed = dataclasses.replace(a, checkpointing=True)
        assert checkpointed.rank_bytes() == dataclasses.replace(checkpointed, arch=builtin).rank_bytes()
    # FLOPs: the training entries' seconds a token (of the active parameters), the memory (of all of them)
    g = CATALOG["H800"]
    assert training_entries(arch, g, gpus_per_node=8, algorithm="grpo") == training_entries(
        builtin, g, gpus_per_node=8, algorithm="grpo"
    )


def test_a_jobs_arch_moe_prices_the_activations_of_the_built_in(tmp_path: Path) -> None:
    """Through a job file: the dense pricing the description gave before (its `intermediate` 6144 where a token runs
    8 × 768, without the routing's figures) differs from the built-in's."""
    builtin = BUILTIN_MODELS["qwen3-30b-a3b"]
    task = {"prompt_tokens": 512, "max_output_tokens": 8192}
    arch_job = load_job(_job(tmp_path, described(builtin, **EXPERTS["qwen3-30b-a3b"]), **task))
    dense = {k: v for k, v in described(builtin).items() if k not in ("experts", "experts_per_token")}
    dense_job = load_job(_job(tmp_path, {**dense, "active_params": builtin.active}, **task))
    ours = job_activations(arch_job.spec, arch_job.spec.model.arch)
    assert ours is not None and ours == job_activations(arch_job.spec, builtin)
    theirs = job_activations(dense_job.spec, dense_job.spec.model.arch)
    assert theirs is not None and ours.rank_bytes() != theirs.rank_bytes()


@pytest.mark.parametrize(("checkpoint", "shared"), [("qwen3moe-dense1-hd32", None), ("qwen2moe-dense1", 48)])
def test_an_arch_description_of_an_hf_moe_is_its_checkpoints_figures(
    tmp_path: Path, checkpoint: str, shared: int | None
) -> None:
    """Its dense layer (mlp_only_layers [1]: `dense_layers` 1) priced as hf.py does, at the larger of the two widths;
    the active count derived from the total as transformers counts it."""
    pytest.importorskip("transformers")
    from tests.unit.hf_checkpoints import write_checkpoint

    ref = write_checkpoint(checkpoint, tmp_path / "model")
    hf, c = check_hf_dir(tmp_path / "model").arch, read_config(tmp_path / "model")
    assert c.moe is not None and hf.params == sum(p.numel() for p in ref.parameters())
    model = {
        "kind": "arch",
        "name": "m",
        "layers": c.num_hidden_layers,
        "hidden": c.hidden_size,
        "heads": c.num_attention_heads,
        "kv_heads": c.num_key_value_heads,
        "vocab": c.vocab_size,
        "intermediate": c.intermediate_size,
        "params": hf.params,
        "head_dim": c.head_dim,
        "experts": c.moe.num_experts,
        "experts_per_token": c.moe.num_experts_per_tok,
        "expert_intermediate": c.moe.moe_intermediate_size,
        "dense_layers": len(c.moe.mlp_only_layers),
    }
    if shared is not None:
        model["shared_expert_intermediate"] = shared
    else:  # a Qwen3MoE's q/k norms
        model["qk_norm"] = True
    arch = ArchModel.model_validate(model).arch
    figures = ("layers", "hidden", "head_dim", "intermediate", "params", "active", "token_intermediate")
    figures += ("experts_per_token", "experts", "qk_norm")
    assert [getattr(arch, f) for f in figures] == [getattr(hf, f) for f in figures]


def test_a_moe_description_is_written_as_given_and_a_dense_one_as_before(tmp_path: Path) -> None:
    builtin = BUILTIN_MODELS["qwen1.5-moe-a2.7b"]
    moe = ArchModel.model_validate(described(builtin, **EXPERTS["qwen1.5-moe-a2.7b"]))
    dumped = moe.model_dump()
    assert {k: dumped[k] for k in ("experts", "experts_per_token", "expert_intermediate")} == {
        "experts": 60,
        "experts_per_token": 4,
        "expert_intermediate": 1408,
    }
    assert dumped["shared_expert_intermediate"] == 5632 and "dense_layers" not in dumped
    assert "active_params" not in dumped  # (derived, not written)
    assert ArchModel.model_validate(dumped) == moe
    dense = {k: v for k, v in described(builtin).items() if k not in ("experts", "experts_per_token")}
    assert set(ArchModel.model_validate(dense).model_dump()) == set(dense)  # no MoE key written
    # a profile of it keeps its active count and its experts' shape (a LoRA profile's entries are of each expert's
    # adapters: test_planner_lora_moe)
    prof = analytical_profile(moe.arch, {"h": (CATALOG["H800"], 8, 2.85)})
    save_profile(prof, tmp_path / "p.yaml")
    written = yaml.safe_load((tmp_path / "p.yaml").read_text())["model"]
    assert written["active_params"] == builtin.active
    assert {k: written[k] for k in ("experts", "experts_per_token", "expert_intermediate")} == {
        "experts": 60,
        "experts_per_token": 4,
        "expert_intermediate": 1408,
    }
    assert written["shared_expert_intermediate"] == 5632 and "dense_layers" not in written
    assert load_profile(tmp_path / "p.yaml").model.arch == builtin


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            {"expert_intermediate": None},
            "model.expert_intermediate: missing beside experts: a MoE is described by experts, experts_per_token, "
            "expert_intermediate together (HF's num_experts, num_experts_per_tok, moe_intermediate_size), a dense "
            "model by none of them",
        ),
        (
            {"experts": None, "experts_per_token": None, "expert_intermediate": None},
            "model.experts: missing beside shared_expert_intermediate: a MoE is described by experts, "
            "experts_per_token, expert_intermediate together (HF's num_experts, num_experts_per_tok, "
            "moe_intermediate_size), a dense model by none of them",
        ),
        ({"experts_per_token": 61}, "model.experts_per_token: 61 is more than experts 60"),
        (
            {"dense_layers": 24},
            "model.dense_layers: 24 is not fewer than layers 24; a model without sparse layers is dense: leave out "
            "experts, experts_per_token and expert_intermediate",
        ),
        (
            {"params": 1e10},
            "model.params: 1e+10 is not more than the 1.16266e+10 parameters of the experts a token does not run "
            "(sparse layers × (experts − experts_per_token) × 3 × hidden × expert_intermediate); give the model's "
            "total count",
        ),
        ({"experts": 0}, "model.experts: Input should be greater than 0"),
    ],
)
def test_a_moe_description_that_does_not_hold_together_is_refused_in_one_line(
    tmp_path: Path, change: dict[str, Any], said: str
) -> None:
    model = {**described(BUILTIN_MODELS["qwen1.5-moe-a2.7b"], **EXPERTS["qwen1.5-moe-a2.7b"]), **change}
    path = _job(tmp_path, {k: v for k, v in model.items() if v is not None}, max_output_tokens=1000)
    for command in ("plan", "check"):
        assert _refused(run_cli(command, str(path))) == f"rlctl: error: {path}: {said}"


@pytest.mark.parametrize("kind", ["builtin", "arch"])
def test_a_moes_context_is_refused_by_check_and_plan_in_the_same_line(tmp_path: Path, kind: str) -> None:
    """Qwen1.5-MoE-A2.7B's 8192 positions (its base config.json), a task asking 512 + 8000: `plan` refuses it in one
    line, `check` in the same line among the job's other problems (a built-in and `lengths` are for planning only)."""
    builtin = BUILTIN_MODELS["qwen1.5-moe-a2.7b"]
    model = (
        {"kind": "builtin", "name": builtin.name} if kind == "builtin" else described(builtin, **EXPERTS[builtin.name])
    )
    path = _job(tmp_path, model, prompt_tokens=512, max_output_tokens=8000)
    where = f"built-in {builtin.name!r}" if kind == "builtin" else "the job's model.max_positions"
    line = _refused(run_cli("plan", str(path)))
    assert line == (
        f"rlctl: error: {path}: task.max_output_tokens: 512 prompt + 8000 output tokens exceed model "
        f"max_position_embeddings 8192 ({where}); use prompt_tokens + max_output_tokens ≤ 8192"
    )
    checked = run_cli("check", str(path))
    assert checked.exit_code == 2 and line in checked.stderr.splitlines()
    assert run_cli("plan", str(_job(tmp_path, model, prompt_tokens=512, max_output_tokens=7680))).exit_code == 0


def test_a_zero_shared_expert_or_dense_layer_count_is_none() -> None:
    """An HF config's figures copied as they read (a Qwen3MoE's shared_expert_intermediate_size 0, mlp_only_layers [],
    0 layers) describe the model without either, written without them; versus refused ("greater than 0") by fields
    whose default is none. A dense model may give them as 0 too."""
    builtin = BUILTIN_MODELS["qwen3-30b-a3b"]
    zeros = ArchModel.model_validate(described(builtin, **EXPERTS[builtin.name], shared_expert_intermediate=0,
                                               dense_layers=0))  # fmt: skip
    assert zeros == ArchModel.model_validate(described(builtin, **EXPERTS[builtin.name])) and zeros.arch == builtin
    assert not {"shared_expert_intermediate", "dense_layers"} & set(zeros.model_dump())
    dense = {k: v for k, v in described(builtin).items() if k not in ("experts", "experts_per_token")}
    assert ArchModel.model_validate({**dense, "dense_layers": 0}).arch.experts == 0
