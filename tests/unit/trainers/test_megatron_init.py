"""A `megatron` rank builds its GPTModels without megatron's init (one gloo rank on CPU): the weights it then loads
(the checkpoint's, the policy's for a PPO critic) are drawn by nobody, every element of every tensor is written by
the load, and what it holds is what a model built with init and loaded the same way holds, bit for bit: tensors,
megatron's tensor-parallel attributes on them, logits. A load that would leave a tensor as allocated fails."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlctl.models.tensors import CheckpointTensors, ModelTensors
from rlctl.trainers.base import load_backend
from rlctl.trainers.megatron.backend import MegatronBackend
from rlctl.trainers.megatron.model import MegatronPolicy, MegatronTrunk, StagedGPT
from tests.unit.hf_checkpoints import VARIANTS, write_checkpoint

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("megatron_rank")

TOKENS = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(0))


def assert_same(built: StagedGPT, want: StagedGPT) -> None:
    """Bit for bit: every tensor, megatron's attributes on each parameter, the output on TOKENS."""
    mine, theirs = built.megatron_state(), want.megatron_state()
    assert list(mine) == list(theirs)
    for k, v in theirs.items():
        assert torch.equal(mine[k], v), k
    params = dict(want.gpt.named_parameters())
    for k, p in built.gpt.named_parameters():
        assert vars(p) == vars(params[k]), k  # tensor_model_parallel, partition_dim, partition_stride, shared, …
    with torch.no_grad():
        assert torch.equal(built(TOKENS), want(TOKENS))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_rank_starts_drawing_no_weight_and_holds_what_an_initialised_build_loads(
    variant: str, tmp_path: Path
) -> None:
    write_checkpoint(variant, tmp_path)
    drawn = torch.get_rng_state()
    backend = load_backend("megatron", tmp_path)
    assert isinstance(backend, MegatronBackend)
    trunk = backend.critic_trunk()
    # megatron's init draws every weight from torch's generator: none is drawn
    assert torch.equal(torch.get_rng_state(), drawn)
    policy = MegatronPolicy(backend.config)  # built with init, loaded alike (Phi3: by the model's names)
    policy.load_hf(ModelTensors(CheckpointTensors(tmp_path), backend.config))
    assert_same(backend.model, policy)
    initialised = MegatronTrunk(backend.config)
    initialised.copy_from(policy)
    assert_same(trunk, initialised)


@pytest.mark.parametrize("variant", ["llama-bias-tied", "qwen3-bias-hd32"])
def test_a_load_writes_every_element_of_a_model_built_without_init(variant: str, tmp_path: Path) -> None:
    write_checkpoint(variant, tmp_path)
    policy = MegatronPolicy(load_backend("megatron", tmp_path).config, initialise=False)
    trunk = MegatronTrunk(policy.config, initialise=False)
    with torch.no_grad():
        for m in (policy, trunk):
            for t in m.megatron_state().values():
                t.fill_(float("nan"))  # garbage, as allocated memory may hold; NaN equals nothing
    policy.load_hf(CheckpointTensors(tmp_path))
    trunk.copy_from(policy)
    initialised = MegatronPolicy(policy.config)
    initialised.load_hf(CheckpointTensors(tmp_path))
    assert_same(policy, initialised)
    initialised_trunk = MegatronTrunk(policy.config)
    initialised_trunk.copy_from(initialised)
    assert_same(trunk, initialised_trunk)


def test_a_load_missing_a_tensor_fails_naming_it(tmp_path: Path) -> None:
    write_checkpoint("llama-hd64-eos3", tmp_path)
    backend = load_backend("megatron", tmp_path)
    tensors = dict(CheckpointTensors(tmp_path))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(KeyError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        backend.load_state_dict(tensors)


def test_a_tensor_the_load_does_not_write_is_refused(tmp_path: Path) -> None:
    write_checkpoint("llama-hd64-eos3", tmp_path)
    policy = MegatronPolicy(load_backend("megatron", tmp_path).config, initialise=False)
    policy.gpt.decoder.register_buffer("scratch", torch.empty(3), persistent=False)  # not in its state dict
    with pytest.raises(AssertionError, match=r"decoder\.scratch"):
        policy.load_hf(CheckpointTensors(tmp_path))
