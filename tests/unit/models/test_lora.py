"""LoRA on TinyGPT (rlctl.models.lora) and the torch backend with adapters: the base model while B is zero, the
gradients of A and B as autograd gives them on W + scale·B·A written out, a GRPO step that moves only the
adapters, and the merged weights where the backend publishes and saves them."""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path

import pytest
import torch
from torch.func import functional_call

from rlctl.config.algorithm import GrpoAlgorithm
from rlctl.config.pipeline import Batch
from rlctl.config.runtime import TARGETS, Lora
from rlctl.models import lora
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.learner import make_learner
from rlctl.rl.samples import Sample
from rlctl.trainers.base import load_backend
from tests.unit.tiny_models import small_config

CFG = dataclasses.replace(small_config(hidden=32, layers=2, heads=4), architecture="Qwen2ForCausalLM", vocab_size=50)


def adapted(targets: tuple[str, ...] = TARGETS, *, rank: int = 4, alpha: float = 8.0) -> tuple[TinyGPT, TinyGPT]:
    torch.manual_seed(0)
    base = TinyGPT(CFG)
    model = copy.deepcopy(base)
    lora.add_adapters(model, rank=rank, alpha=alpha, targets=targets)
    return base, model


def test_adapters_keep_the_names_freeze_the_base_and_start_as_the_base_model() -> None:
    base, model = adapted(("q_proj", "down_proj"))
    names = list(base.state_dict())
    extra = [k for k in model.state_dict() if k not in names]
    assert [k for k in model.state_dict() if k in names] == names  # same names, same order
    assert extra == [
        f"model.layers.{i}.{m}.lora_{ab}"
        for i in range(2)
        for m in ("self_attn.q_proj", "mlp.down_proj")
        for ab in "AB"
    ]
    assert {n for n, p in model.named_parameters() if p.requires_grad} == set(extra)
    lin = model.model.layers[0].self_attn.q_proj
    assert lin.lora_A.dtype == lin.lora_B.dtype == torch.float32 and lin.scale == 2.0
    assert not lin.lora_B.any() and lin.lora_A.abs().max() <= 1 / math.sqrt(32)  # kaiming_uniform(a=√5): 1/√fan_in
    tokens = torch.randint(0, 50, (2, 7))
    assert torch.equal(model(tokens), base(tokens))  # B = 0: the base model, bit for bit
    assert list(lora.merged_weights(model)) == names
    # every build draws the same A (data-parallel ranks start alike)
    assert torch.equal(
        adapted(("q_proj", "down_proj"))[1].model.layers[1].mlp.down_proj.lora_A,
        model.model.layers[1].mlp.down_proj.lora_A,
    )


def test_gradients_of_a_and_b_are_those_of_the_merged_weight_written_out() -> None:
    base, model = adapted(("q_proj", "v_proj", "up_proj", "o_proj"))
    g = torch.Generator().manual_seed(1)
    for lin in lora.adapters(model).values():
        with torch.no_grad():
            lin.lora_B.copy_(torch.randn(lin.lora_B.shape, generator=g) * 0.1)
    tokens = torch.randint(0, 50, (3, 9), generator=g)
    target = torch.randint(0, 50, (3, 9), generator=g)

    def loss(logits: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 50), target.reshape(-1))

    loss(model(tokens)).backward()
    # the reference: the base model with each adapted weight W + scale·B·A built explicitly from leaf A, B
    leaves = {
        n: (lin.lora_A.detach().clone().requires_grad_(), lin.lora_B.detach().clone().requires_grad_(), lin.scale)
        for n, lin in lora.adapters(model).items()
    }
    params = {k: v.detach() for k, v in base.named_parameters()}
    for n, (a, b, s) in leaves.items():
        params[f"{n}.weight"] = params[f"{n}.weight"] + s * b @ a
    ref = loss(functional_call(base, params, (tokens,)))
    ref.backward()
    for n, lin in lora.adapters(model).items():
        a, b, _ = leaves[n]
        assert lin.lora_A.grad is not None and lin.lora_B.grad is not None
        torch.testing.assert_close(lin.lora_A.grad, a.grad, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(lin.lora_B.grad, b.grad, rtol=1e-5, atol=1e-7)
    assert all(p.grad is None for n, p in model.named_parameters() if not lora.is_adapter(n))
    merged = lora.merged_weights(model)
    torch.testing.assert_close(functional_call(base, merged, (tokens,)), model(tokens), rtol=1e-5, atol=1e-6)


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    return TinyGPT(dataclasses.replace(CFG, tie_word_embeddings=True)).save_pretrained(tmp_path / "model")


def samples() -> list[Sample]:
    g = torch.Generator().manual_seed(3)
    out = []
    for i in range(8):
        prompt = torch.randint(3, 50, (4,), generator=g).tolist()
        output = torch.randint(3, 50, (3 + i % 4,), generator=g).tolist()
        out.append(Sample(f"p{i // 4}", prompt, output, [-4.0] * len(output), float(i % 3), 0))
    return out


def test_a_grpo_step_moves_only_the_adapters_and_publishes_the_merged_weights(model_dir: Path) -> None:
    backend = load_backend("torch", model_dir, adapters=Lora(rank=4, alpha=8, target_modules=["q_proj", "gate_proj"]))
    learner = make_learner(
        backend, GrpoAlgorithm(kind="grpo", lr=1e-2), Batch(samples_per_prompt=4, train_micro_batch_samples=3), ref=None
    )
    opt = learner.optimizers()["policy"]
    assert {id(p) for g in opt.param_groups for p in g["params"]} == {
        id(p) for n, p in backend.model.named_parameters() if lora.is_adapter(n)
    }
    before = {k: v.clone() for k, v in backend.model.state_dict().items()}
    for s in samples():
        learner.add(s)
    learner.step()
    after = backend.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {k for k in before if k.endswith("lora_B")}  # B moved from 0 (A's gradient is 0 while B is)
    assert not any(p.grad is not None and not lora.is_adapter(n) for n, p in backend.model.named_parameters())
    # what the weight plane sends and a checkpoint holds: W + scale·B·A under the HF names, no adapters
    wire = backend.wire_weights(dtype=torch.bfloat16, tied=True)
    weights = backend.weights()
    assert "lm_head.weight" not in wire and not any(lora.is_adapter(k) for k in weights)
    for name in weights:
        owner = name.removesuffix(".weight")
        if owner.endswith(("q_proj", "gate_proj")):
            lin = backend.model.get_submodule(owner)
            want = after[name] + 2.0 * after[f"{owner}.lora_B"] @ after[f"{owner}.lora_A"]
            assert not torch.equal(want, after[name])
        else:
            want = after[name]
        torch.testing.assert_close(weights[name], want, rtol=0, atol=1e-7)
        if name != "lm_head.weight":
            assert torch.equal(wire[name], want.to(torch.bfloat16)), name
    assert lin.scale == 2.0
    # the HF directory is the merged model: a TinyGPT of it computes what the adapted policy computes
    saved = TinyGPT.from_pretrained(backend.save_pretrained(model_dir.parent / "saved"))
    tokens = torch.randint(0, 50, (2, 6))
    torch.testing.assert_close(saved(tokens), backend.model(tokens), rtol=1e-5, atol=1e-5)


def test_a_lora_backend_checks_a_checkpoints_merged_model_and_keeps_its_frozen_weights(model_dir: Path) -> None:
    """A resume's `load_state_dict` of the checkpoint's merged model: checked to fit (one line where it does not),
    nothing copied — the frozen weights are the job's model, the adapters come from the rank's shard."""
    from rlctl.models.tensors import DoesNotFit

    backend = load_backend("torch", model_dir, adapters=Lora(rank=2, alpha=2))
    before = {k: v.clone() for k, v in backend.model.state_dict().items()}
    merged = {k: v + 1 for k, v in backend.weights().items()}
    backend.load_state_dict(merged)
    assert all(torch.equal(v, before[k]) for k, v in backend.model.state_dict().items())
    with pytest.raises(DoesNotFit, match=r"^weights do not fit this model: 1 missing \(model\.norm\.weight\)$"):
        backend.load_state_dict({k: v for k, v in merged.items() if k != "model.norm.weight"})
    assert set(backend.checkpoint_modules()["lora"].state_dict()) == {
        f"adapters.{n.replace('.', '-')}" for n, _ in backend.model.named_parameters() if lora.is_adapter(n)
    }
