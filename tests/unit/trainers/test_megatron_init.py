"""A `megatron` rank builds its GPTModels without megatron's init (one gloo rank on CPU): the weights it then loads
(the checkpoint's, the policy's for a PPO critic) are drawn by nobody, every element of every tensor is written by
the load, and what it holds is what a model built with init and loaded the same way holds, bit for bit: tensors,
megatron's tensor-parallel attributes on them, logits. A load that would leave a tensor as allocated fails."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from rlctl.errors import ConfigError
from rlctl.models import weightfiles
from rlctl.models.hfnames import expected_shapes
from rlctl.models.tensors import CheckpointTensors, DoesNotFit, ModelTensors
from rlctl.trainers.base import load_backend
from rlctl.trainers.megatron.backend import MegatronBackend
from rlctl.trainers.megatron.model import MegatronPolicy, MegatronTrunk, StagedGPT
from tests.unit.hf_checkpoints import VARIANTS, write_checkpoint
from tests.unit.tiny_models import misfits

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


def test_a_load_that_does_not_fit_the_config_is_refused_before_any_tensor_is_written(tmp_path: Path) -> None:
    """Tensors with one missing, one unexpected, one of another shape, or all three: DoesNotFit in one line naming
    them (`check_fit`) and every parameter as it was, bit for bit, versus a KeyError (missing) or the copy's
    RuntimeError (another shape) with the parameters before it written, and an unexpected tensor ignored."""
    write_checkpoint("llama-hd64-eos3", tmp_path)
    backend = load_backend("megatron", tmp_path)
    assert isinstance(backend, MegatronBackend)
    before = {k: v.clone() for k, v in backend.model.megatron_state().items()}
    whole = {k: v + 1 for k, v in CheckpointTensors(tmp_path).items()}
    for bad, said in misfits(whole, list(expected_shapes(backend.config))):
        with pytest.raises(DoesNotFit, match=f"^{re.escape(said)}$"):
            backend.load_state_dict(bad)
        assert all(torch.equal(v, before[k]) for k, v in backend.model.megatron_state().items())
    backend.load_state_dict(whole)
    assert all(torch.equal(v, whole[k]) for k, v in backend.weights().items())


def test_a_tied_load_takes_an_lm_head_that_is_the_embedding_and_refuses_another(tmp_path: Path) -> None:
    """A tied config's file may hold an lm_head.weight beside the embedding (a file transformers wrote before it left
    it out) and an older Llama's its rotary_emb.inv_freq buffers: the load reads the names the model needs
    (`hfnames.match_weights`' names: `ModelTensors(only=…)`), the model as without them. An lm_head other than the
    embedding (two tensors: transformers loads them untied) is refused in one line naming the checkpoint, versus
    ignored (the embedding taken for both)."""
    write_checkpoint("qwen2-tied-hd32", tmp_path / "start")
    want = load_backend("megatron", tmp_path / "start").weights()
    saved = weightfiles.load_state_dict(tmp_path / "start")
    embed = saved["model.embed_tokens.weight"]
    for name, lm_head in (("same", embed.clone()), ("other", embed + 1)):
        d = shutil.copytree(tmp_path / "start", tmp_path / name)
        buffers = {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(16)}
        weightfiles.save_state_dict({**saved, "lm_head.weight": lm_head, **buffers}, d)
        if name == "other":
            with pytest.raises(ConfigError, match=f"^{re.escape(str(d))}: weights do not fit this model: lm_head"):
                load_backend("megatron", d)
            continue
        got = load_backend("megatron", d).weights()
        assert list(got) == list(want) and all(torch.equal(got[k], v) for k, v in want.items())


def test_a_tensor_the_load_does_not_write_is_refused(tmp_path: Path) -> None:
    write_checkpoint("llama-hd64-eos3", tmp_path)
    policy = MegatronPolicy(load_backend("megatron", tmp_path).config, initialise=False)
    policy.gpt.decoder.register_buffer("scratch", torch.empty(3), persistent=False)  # not in its state dict
    with pytest.raises(AssertionError, match=r"decoder\.scratch"):
        policy.load_hf(CheckpointTensors(tmp_path))
