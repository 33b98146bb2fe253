"""PPO on the `megatron` backend, one gloo rank on CPU: the critic's trunk (a second GPTModel of the policy's
shard, without its output layer) gives TinyGPT's final hidden states, and two PPO steps through the trainer's
learner (`rl.learner.make_learner`: a reference model for the KL reward, GAE, policy and critic updates) move
the policy and the critic as on the `torch` backend from the same start weights. Two steps, because the value
head starts at zero: the first moves the head only, the second the trunk too."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from rlctl.config.algorithm import PpoAlgorithm
from rlctl.config.pipeline import Batch
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.learner import PpoBatchLearner, make_learner
from rlctl.rl.samples import Sample
from rlctl.trainers.base import TrainerBackend, load_backend
from rlctl.trainers.megatron import names
from rlctl.trainers.megatron.model import MegatronTrunk
from rlctl.trainers.native import TorchBackend
from tests.unit.hf_checkpoints import write_checkpoint
from tests.unit.trainers.test_megatron_backend import FP32_ATOL, rollouts, tokens

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("megatron_rank")

ALGORITHM = PpoAlgorithm(kind="ppo", lr=1e-3, critic_lr=1e-2, kl_coef=0.05)
BATCH = Batch(prompts_per_iteration=3, samples_per_prompt=4, train_micro_batch_samples=5)


@pytest.fixture(params=["llama-bias-tied", "llama-hd64-eos3"])  # tied (o_proj bias) and untied (GQA, lm_head)
def variant(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_the_critic_trunk_gives_tinygpts_hidden_states_and_is_a_copy(variant: str, tmp_path: Path) -> None:
    write_checkpoint(variant, tmp_path)
    mg = load_backend("megatron", tmp_path)
    trunk = mg.critic_trunk()
    assert isinstance(trunk, MegatronTrunk)
    assert not [k for k in trunk.megatron_state() if k.startswith("output_layer")]  # no vocabulary projection
    x = tokens(3, 40, seed=2)
    with torch.no_grad():
        got = trunk.hidden(x)
        assert got.shape == (3, 40, mg.config.hidden_size)
        torch.testing.assert_close(got, TinyGPT.from_pretrained(tmp_path).hidden(x), atol=FP32_ATOL, rtol=0)
        before = mg.weights()
        next(trunk.parameters()).add_(1.0)
        assert all(torch.equal(before[k], v) for k, v in mg.weights().items())  # the policy's own tensors


def train(learner: Any, samples: list[Sample]) -> dict[str, float]:
    for s in copy.deepcopy(samples):
        learner.add(s)
        learner.train_ready()
    stats: dict[str, float] = learner.step()
    return stats


def critic_state(backend: TrainerBackend, learner: PpoBatchLearner) -> dict[str, torch.Tensor]:
    """The critic as megatron names (the torch critic's trunk through the name table) and its head."""
    critic = learner.inner.critic
    head = {"head.weight": critic.head.weight.detach().clone(), "head.bias": critic.head.bias.detach().clone()}
    trunk = critic.body
    if isinstance(trunk, MegatronTrunk):
        return {**{k: v.clone() for k, v in trunk.megatron_state().items()}, **head}
    assert isinstance(backend, TorchBackend) and isinstance(trunk, TinyGPT)
    # (the trunk holds no lm_head: the table's output layer, the policy's here, is left out below)
    mine = names.to_megatron({**trunk.state_dict(), "lm_head.weight": backend.model.lm_head.weight}, trunk.config)
    return {**{k: v.clone() for k, v in mine.items() if not k.startswith("output_layer")}, **head}


def assert_same_update(
    got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], start: dict[str, torch.Tensor]
) -> None:
    """`got` moved from `start` as `want` did, up to fp32 rounding (as the GRPO step: test_megatron_backend)."""
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        step = (w - start[k]).norm()
        assert step > 0, k
        # k_proj.bias: 0 gradient in exact arithmetic (softmax ignores a shift shared by every key), so AdamW's
        # first step scales fp32 noise up on either backend
        tolerance = 5e-2 if "k_proj.bias" in k or k.endswith("linear_qkv.bias") else 2e-3
        assert (got[k] - w).norm() <= tolerance * step, k


@pytest.mark.timeout(300)
def test_two_ppo_steps_move_the_policy_and_the_critic_as_the_torch_backend(variant: str, tmp_path: Path) -> None:
    write_checkpoint(variant, tmp_path)
    backends = [load_backend("torch", tmp_path), load_backend("megatron", tmp_path)]
    learners = []
    for b, name in zip(backends, ("torch", "megatron"), strict=True):
        learner = make_learner(b, ALGORITHM, BATCH, ref=load_backend(name, tmp_path).model)
        assert isinstance(learner, PpoBatchLearner)
        learners.append(learner)
    torch_b, mg = backends
    policy_start = {k: v.clone() for k, v in torch_b.weights().items()}
    critic_start = critic_state(torch_b, learners[0])
    assert critic_state(mg, learners[1]).keys() == critic_start.keys()
    for seed in (0, 1):
        samples = rollouts(torch_b.model, prompts=3, group=4, seed=seed)  # the torch policy samples, off-policy
        want, got = (train(learner, samples) for learner in learners)
        for k in ("loss", "value_loss", "kl", "clip_frac"):
            assert got[k] == pytest.approx(want[k], abs=1e-5), k
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
        assert got["tokens"] == want["tokens"] > 0
    assert_same_update(mg.weights(), torch_b.weights(), policy_start)
    assert_same_update(critic_state(mg, learners[1]), critic_state(torch_b, learners[0]), critic_start)
