"""LoRA on the torch trainer over gloo (fsdp_rank.py with adapters on every projection): the FSDP2-sharded GRPO
steps equal the unsharded ones, each version published (as deltas each rank encodes from its rows of the merged
weights) is the merged model W + scale·B·A with the frozen tensors untouched, and a checkpoint resumes bit for bit,
sharded or not, its HF directory the merged model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from rlctl.models.tinygpt import TinyGPT
from rlctl.models.weightfiles import load_state_dict
from tests.unit.trainers.test_fsdp import CFG, assert_same_steps, iterations, run

LORA = "4,8"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("lora")
    torch.manual_seed(0)
    TinyGPT(dataclasses.replace(CFG, architecture="Qwen3ForCausalLM")).save_pretrained(d / "model")
    torch.save(iterations(), d / "samples.pt")
    return d / "model", d / "samples.pt"


def test_sharded_lora_steps_equal_the_unsharded_and_publish_the_merged_model(
    tmp_path: Path, inputs: tuple[Path, Path]
) -> None:
    model, samples = inputs
    whole = run(tmp_path, world=1, phase="run", job=tmp_path / "job1", model=model, samples=samples, lora=LORA)
    sharded = run(tmp_path, world=2, phase="run", job=tmp_path / "job2", model=model, samples=samples, lora=LORA)
    start = TinyGPT.from_pretrained(model).hf_weights()
    for it in range(3):
        assert list(whole["weights"][it]) == list(sharded["weights"][it]) == list(start)  # HF names, no adapters
    assert_same_steps(whole, sharded, start)
    assert sharded["published"] == whole["published"] == [True] * 3  # the deltas of the merged shards: the gather's
    assert sharded["encodings"] == [["delta", "full"]] * 3
    last = sharded["weights"][2]
    moved = {k for k in start if not torch.equal(start[k], last[k])}
    assert moved == {k for k in start if k.endswith("proj.weight")}  # frozen: embeddings, norms, biases


@pytest.mark.parametrize("world", [1, 2])
def test_a_lora_checkpoint_resumes_bit_for_bit(tmp_path: Path, inputs: tuple[Path, Path], world: int) -> None:
    model, samples = inputs
    job = tmp_path / "job"
    ran = run(tmp_path, world=world, phase="run", job=job, model=model, samples=samples, lora=LORA)
    # each rank's shard holds the adapters (its part of them) and their AdamW state, not the frozen weights
    shard = torch.load(job / "iter-2" / "ranks" / "rank-0.pt", weights_only=True)
    assert [k for k in shard if k.startswith("module.")] == ["module.lora"]
    names = list(shard["module.lora"])
    assert len(names) == 2 * 7 * CFG.num_hidden_layers and all(n.endswith(("lora_A", "lora_B")) for n in names)
    moments = shard["optimizer.policy"]["state"].values()
    assert sum(s["exp_avg"].numel() for s in moments) == sum(shard["module.lora"][n].numel() for n in names)
    resumed = run(tmp_path, world=world, phase="resume", job=job, model=model, samples=samples, lora=LORA)
    for name, w in ran["weights"][2].items():
        assert torch.equal(resumed["weights"][0][name], w), name
    assert resumed["grad_norms"][0] == ran["grad_norms"][2]
    saved = load_state_dict(job / "iter-2" / "model")  # the merged model as published at iteration 2
    assert saved.keys() == {k for k in ran["weights"][1] if k != "lm_head.weight"}
    assert all(torch.equal(saved[k], ran["weights"][1][k]) for k in saved)


def test_sharded_lora_steps_on_a_moe_equal_the_unsharded(tmp_path: Path) -> None:
    """A Qwen3MoE (top 1 of 16 experts: some chosen by one rank's tokens and not the other's) with adapters on every
    projection, its experts' too, the router frozen: every expert's adapters get a gradient on every rank, so the
    sharded steps equal the unsharded ones (versus a gloo collective mismatch: `SparseMoE` ran the chosen experts
    alone where its router wanted no gradient)."""
    from tests.unit.trainers.test_fsdp import MOE

    torch.manual_seed(0)
    TinyGPT(dataclasses.replace(CFG, architecture="Qwen3MoeForCausalLM", moe=MOE)).save_pretrained(tmp_path / "model")
    torch.save(iterations(), tmp_path / "samples.pt")
    model, samples = tmp_path / "model", tmp_path / "samples.pt"
    whole = run(tmp_path, world=1, phase="run", job=tmp_path / "job1", model=model, samples=samples, lora=LORA)
    sharded = run(tmp_path, world=2, phase="run", job=tmp_path / "job2", model=model, samples=samples, lora=LORA)
    start = TinyGPT.from_pretrained(model).hf_weights()
    assert_same_steps(whole, sharded, start)
    expert, router = "model.layers.0.mlp.experts.0.up_proj.weight", "model.layers.0.mlp.gate.weight"
    last = sharded["weights"][2]
    assert not torch.equal(start[expert], last[expert]) and torch.equal(start[router], last[router])  # (frozen)
