"""LoRA on a MoE (`trainer.lora` on a Qwen3MoE or Qwen2MoE): the torch trainer puts an adapter on each expert's
gate/up/down (and a Qwen2MoE's shared expert's, a dense layer's; the routers `gate` and `shared_expert_gate` never),
and the cost models price those: memory every adapter (`traincost.lora_params`), a token's FLOPs the adapters of the
experts it runs (`active=True`). Before, a MoE's MLP adapters were priced as one dense MLP's of the config's
`intermediate` a layer (Qwen3-30B-A3B, r 16, all-linear: 32.2 M of the 843.8 M the trainer builds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from rlctl.config.algorithm import GrpoAlgorithm
from rlctl.config.runtime import TARGETS, Lora
from rlctl.hardware import CATALOG
from rlctl.models import lora
from rlctl.models.catalog import BUILTIN_MODELS
from rlctl.models.hf import QWEN3_MOE, TinyGPTConfig
from rlctl.models.hfdir import check_hf_dir
from rlctl.models.moe import MoeConfig
from rlctl.models.tinygpt import TinyGPT
from rlctl.profiler.analytical import analytical_profile
from rlctl.profiler.profile import load_profile, priced_passes, save_profile
from rlctl.profiler.traincost import flops_per_token, grad_bytes, lora_params, lora_passes
from rlctl.trainers.base import load_backend
from tests.conftest import run_cli
from tests.unit.hf_checkpoints import write_checkpoint
from tests.unit.planner.test_planner_arch_moe import EXPERTS, described
from tests.unit.planner.test_planner_context import _job, _refused

MLP = ["gate_proj", "up_proj", "down_proj"]
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
CHECKPOINTS = ["qwen3moe-dense1-hd32", "qwen3moe-step2-norm-tied", "qwen2moe-dense1", "qwen2-tied-hd32"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    for variant in CHECKPOINTS:
        write_checkpoint(variant, root / variant)
    return {v: root / v for v in CHECKPOINTS}


def trained(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("variant", CHECKPOINTS)
@pytest.mark.parametrize("targets", [MLP, ATTENTION, "all-linear", ["down_proj", "q_proj"]])
def test_the_adapters_priced_are_those_the_torch_trainer_trains(
    checkpoints: dict[str, Path], variant: str, targets: list[str] | str
) -> None:
    """The trainer the runtime loads for the job (`load_backend("torch", …, adapters=…)`): its trainable parameters
    are the priced count, a MoE's (every expert's adapters, a Qwen2MoE's shared expert's, the dense layer's) as a
    dense model's."""
    adapters = Lora(rank=4, alpha=8, target_modules=targets)
    backend = load_backend("torch", checkpoints[variant], adapters=adapters)
    arch = check_hf_dir(checkpoints[variant]).arch
    assert lora_params(arch, adapters) == trained(backend.model) > 0
    if variant.startswith("qwen2-"):  # a dense model: a token runs every adapter
        assert lora_params(arch, adapters, active=True) == lora_params(arch, adapters)


@pytest.mark.parametrize("variant", ["qwen3moe-dense1-hd32", "qwen3moe-step2-norm-tied", "qwen2moe-dense1"])
def test_a_tokens_flops_are_of_the_adapters_of_the_experts_it_runs(checkpoints: dict[str, Path], variant: str) -> None:
    """One token through the adapted model (no gradients: each sparse layer runs the token's top-k experts alone): the
    adapters it ran are `lora_params(active=True)`, fewer than all; an update's FLOPs are 4·P + 6·A of those (P the
    active parameters), its gradients every adapter's."""
    adapters = Lora(rank=4, alpha=8)  # all-linear
    model = TinyGPT.from_pretrained(checkpoints[variant])
    lora.add_adapters(model, rank=adapters.rank, alpha=adapters.alpha, targets=adapters.targets)
    ran: list[int] = []

    def count(module: torch.nn.Module, args: tuple[torch.Tensor, ...], _: torch.Tensor) -> None:
        if args[0].numel():
            ran.append(module.lora_A.numel() + module.lora_B.numel())

    for lin in lora.adapters(model).values():
        lin.register_forward_hook(count)
    with torch.no_grad():
        model(torch.tensor([[5]]))
    arch = check_hf_dir(checkpoints[variant]).arch
    active, held = lora_params(arch, adapters, active=True), lora_params(arch, adapters)
    assert sum(ran) == active < held == trained(model)
    passes = lora_passes(GrpoAlgorithm(kind="grpo"), arch=arch, lora=adapters)
    assert flops_per_token("grpo", passes, arch.active) == pytest.approx(2 * (2 * arch.active + 3 * active))
    assert grad_bytes(arch, "grpo", adapter_params=passes.adapter_params) == 4 * held


def test_a_built_in_moes_adapters_are_the_trainers_of_a_layer_of_its_shape() -> None:
    """Qwen3-30B-A3B, r 16, all-linear: a layer of its shape (128 experts of 768, top 8) built as the trainer builds it
    holds 17,580,032 adapter parameters, 843,841,536 over 48 layers; a token runs 1,359,872 of them a layer."""
    arch = BUILTIN_MODELS["qwen3-30b-a3b"]
    moe = MoeConfig(arch.experts, arch.experts_per_token, moe_intermediate_size=arch.expert_intermediate)
    config = TinyGPTConfig(
        vocab_size=16,
        hidden_size=arch.hidden,
        intermediate_size=arch.intermediate,
        num_hidden_layers=1,
        num_attention_heads=arch.heads,
        num_key_value_heads=arch.kv_heads,
        explicit_head_dim=arch.head_dim,
        architecture=QWEN3_MOE,
        moe=moe,
    )
    with torch.device("meta"):
        layer = TinyGPT(config).model.layers[0]
    lora.add_adapters(layer, rank=16, alpha=32, targets=TARGETS)
    adapters = Lora(rank=16, alpha=32)
    assert trained(layer) == 17_580_032
    assert lora_params(arch, adapters) == 48 * trained(layer) == 843_841_536
    assert lora_params(arch, adapters, active=True) == 48 * 1_359_872


def test_a_lora_profile_of_a_moe_prices_the_adapters_the_job_does(tmp_path: Path) -> None:
    """A profile written for a LoRA job on a MoE keeps the experts' shape its entries were priced with: read back, it
    prices the job's adapters (`rlctl plan` scales its seconds by 1), versus its model without experts priced as a
    dense one (32.2 M adapters for 843.8 M)."""
    arch, adapters = BUILTIN_MODELS["qwen3-30b-a3b"], Lora(rank=16, alpha=32)
    save_profile(analytical_profile(arch, {"h": (CATALOG["H800"], 8, 2.85)}, lora=adapters), tmp_path / "p.yaml")
    prof = load_profile(tmp_path / "p.yaml")
    assert prof.model.arch == arch and prof.model.arch.expert_intermediate == 768
    have = priced_passes(prof)
    assert (have.adapter_params, have.active_adapters) == (843_841_536, 48 * 1_359_872)


def lora_job(tmp_path: Path, model: dict[str, Any], targets: list[str] | str) -> Path:
    path = _job(tmp_path, model, max_output_tokens=1000)
    job = yaml.safe_load(path.read_text())
    job["trainer"] = {"backend": "torch", "lora": {"rank": 16, "alpha": 32, "target_modules": targets}}
    path.write_text(yaml.safe_dump(job))
    return path


def test_lora_on_the_mlp_of_a_moe_described_by_active_params_alone_is_refused_by_plan_and_check(
    tmp_path: Path,
) -> None:
    """Qwen1.5-MoE-A2.7B as a `kind: arch` model by its active_params, no experts: gate/up/down are adapted in each
    expert, whose count and width it does not give: `plan` refuses it in one line naming trainer.lora.target_modules and
    what is valid for it, `check` in the same line, exit 2, versus planned on one dense MLP's adapters a layer. Its
    attention alone, or its experts described, plan."""
    builtin = BUILTIN_MODELS["qwen1.5-moe-a2.7b"]
    dense = {k: v for k, v in described(builtin).items() if k not in ("experts", "experts_per_token")}
    by_active = {**dense, "active_params": builtin.active}
    path = lora_job(tmp_path, by_active, ["q_proj", "gate_proj", "down_proj"])
    line = _refused(run_cli("plan", str(path)))
    assert line == (
        f"rlctl: error: {path}: trainer.lora.target_modules: gate_proj, down_proj of MoE 'qwen1.5-moe-a2.7b', "
        "described by active_params alone, are adapted in each of its experts, whose width it does not give; valid "
        "for it: q_proj, k_proj, v_proj, o_proj, or describe its experts (model.experts, experts_per_token, "
        "expert_intermediate)"
    )
    checked = run_cli("check", str(path))
    assert checked.exit_code == 2 and line in checked.stderr.splitlines()
    assert run_cli("plan", str(lora_job(tmp_path, by_active, ATTENTION))).exit_code == 0
    moe = described(builtin, **EXPERTS[builtin.name])
    assert run_cli("plan", str(lora_job(tmp_path, moe, "all-linear"))).exit_code == 0
    dense_model = {k: v for k, v in dense.items() if k != "active_params"}  # (a dense model: every target counted)
    assert run_cli("plan", str(lora_job(tmp_path, {**dense_model, "name": "dense"}, "all-linear"))).exit_code == 0


def test_profile_of_a_job_with_lora_on_the_mlp_of_a_moe_described_by_active_params_alone_is_refused(
    tmp_path: Path,
) -> None:
    """`rlctl profile --job` of that job says plan's line, exit 2, versus a LoRA profile written of one dense MLP's
    adapters a layer (which plan then read as the job's); its attention alone is profiled."""
    builtin = BUILTIN_MODELS["qwen1.5-moe-a2.7b"]
    dense = {k: v for k, v in described(builtin).items() if k not in ("experts", "experts_per_token")}
    by_active = {**dense, "active_params": builtin.active}
    path = lora_job(tmp_path, by_active, ["q_proj", "gate_proj", "down_proj"])
    out = tmp_path / "p.yaml"
    assert _refused(run_cli("profile", "--job", str(path), "-o", str(out))) == _refused(run_cli("plan", str(path)))
    assert not out.exists()
    attention = lora_job(tmp_path, by_active, ATTENTION)
    assert run_cli("profile", "--job", str(attention), "-o", str(out)).exit_code == 0 and out.exists()
