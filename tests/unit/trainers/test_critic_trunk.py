"""PPO's critic on the `torch` trainer holds no lm_head (`rlctl.trainers.critic`): whole (`critic_trunk`'s copy,
`PpoLearner`'s default) and sharded (`shard_critic` on a trunk made on the meta device, checked on both ranks of a fake
2-rank group: `tests.unit.fake_group`), tied (the embedding kept, the trunk's input) and untied; its values are the
trunk's hidden states through the value head, and nothing it runs calls an lm_head."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlctl.config.algorithm import PpoAlgorithm
from rlctl.devices import as_dtensor
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.ppo import PpoLearner, ValueModel
from rlctl.trainers import fsdp
from rlctl.trainers.native import TorchBackend
from tests.unit.trainers.test_fsdp import CFG


def policy(tied: bool) -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(dataclasses.replace(CFG, tie_word_embeddings=tied))


@pytest.mark.parametrize("tied", [True, False])
def test_a_critic_holds_the_policys_trunk_and_no_lm_head(tied: bool) -> None:
    model = policy(tied)
    want = {k: v.detach() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    for critic in (ValueModel(TorchBackend(model).critic_trunk()), PpoLearner(model, PpoAlgorithm(kind="ppo")).critic):
        sd = critic.state_dict()
        assert sorted(sd) == sorted([*(f"body.{k}" for k in want), "head.weight", "head.bias"])
        assert all(torch.equal(sd[f"body.{k}"], v) for k, v in want.items())
        held = sum(p.numel() for p in critic.parameters())
        v, h = CFG.vocab_size, CFG.hidden_size
        # tied: the policy's parameters (its one embedding) and the head's; untied: V·h fewer
        assert held == sum(p.numel() for p in model.parameters()) - (0 if tied else v * h) + h + 1
        assert critic.body.model.embed_tokens.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()

        tokens = torch.randint(0, v, (3, 7))
        with torch.no_grad():
            critic.head.weight.normal_()
            values = critic(tokens)
            assert torch.equal(values, critic.head(model.hidden(tokens)[:, :-1])[..., 0])
        with pytest.raises(AssertionError, match="holds no lm_head"):
            critic.body(tokens)  # (the logits' path: nothing of the critic's takes it)


@pytest.mark.parametrize("tied", [True, False])
def test_a_sharded_critic_holds_the_policys_shards_and_no_lm_head(fake_rank: int, tied: bool) -> None:
    whole = policy(tied)
    model = TinyGPT.on_meta(whole.config)
    fsdp.shard(model, cuda=False)
    model.materialise(torch.device("cpu"))
    fsdp.load_pretrained(model, {k: v.detach() for k, v in whole.state_dict().items()})
    backend = TorchBackend(model, sharded=True)

    critic = ValueModel(backend.critic_trunk())
    backend.shard_critic(critic)

    sd, theirs = critic.state_dict(), model.state_dict()
    names = [k for k in theirs if k != "lm_head.weight"]
    assert sorted(sd) == sorted([*(f"body.{k}" for k in names), "head.weight", "head.bias"])
    for k in names:  # this rank's rows of each, the policy's
        assert torch.equal(fsdp.local_tensor(sd[f"body.{k}"]), fsdp.local_tensor(theirs[k])), k
    assert all(as_dtensor(p) is not None for p in critic.parameters())  # every one sharded, the value head's too
    assert fsdp.local_tensor(sd["head.weight"]).count_nonzero() == 0
    rope = {k: b for k, b in model.named_buffers() if k.startswith("rope")}
    assert all(torch.equal(b, rope[k]) for k, b in critic.body.named_buffers() if k in rope)  # made on its device


@pytest.mark.parametrize("tied", [True, False])
def test_the_planner_prices_the_critic_the_trainer_holds(tied: bool) -> None:
    """`traincost.critic_params` (what the plan, `rlctl check` and checkpoint sizes price a PPO critic's weights,
    gradients and AdamW state by) is the critic's parameter count: untied, V·h fewer than the policy (versus the
    policy's count until 2026-12-07), tied the policy's, and the value head's hidden + 1."""
    from rlctl.profiler.traincost import critic_params, grad_bytes, trained_params

    model = policy(tied)
    arch = model.config.arch("tiny")
    held = sum(p.numel() for p in ValueModel(TorchBackend(model).critic_trunk()).parameters())
    assert arch.params == sum(p.numel() for p in model.parameters())
    assert critic_params(arch) == held
    assert trained_params(arch, "ppo") == arch.params + held and trained_params(arch, "grpo") == arch.params
    assert grad_bytes(arch, "ppo", adapter_params=0.0) == 4 * (arch.params + held)


@pytest.mark.parametrize("tied", [True, False])
def test_a_critic_trunk_holds_no_lm_head_tensor_made_moved_or_copied(tied: bool) -> None:
    """The trunk's lm_head holds no tensor at all (until 2026-12-07 a 0-element buffer `lm_head.weight`, kept because
    TinyGPT read its device off it): made on the meta device and given memory (`materialise`: its RoPE tables on the
    embedding's device), cast, deepcopied and pickled, its values those of the policy's trunk."""
    import copy
    import pickle

    from rlctl.trainers.critic import headless, headless_copy

    model = policy(tied)
    meta = headless(TinyGPT.on_meta(model.config))
    meta.materialise(torch.device("cpu"))
    meta.load_state_dict({k: v for k, v in model.state_dict().items() if k != "lm_head.weight"})
    tokens = torch.randint(0, CFG.vocab_size, (2, 5))
    want = model.hidden(tokens)
    for trunk in (headless_copy(model), meta):
        for made in (trunk, copy.deepcopy(trunk), pickle.loads(pickle.dumps(trunk)), copy.deepcopy(trunk).double()):
            held = [k for k, _ in [*made.named_parameters(remove_duplicate=False), *made.named_buffers()]]
            assert not [k for k in held if k.startswith("lm_head")], held
            assert not [k for k in made.state_dict() if k.startswith("lm_head")]
            assert made.rope_cos.dtype == made.model.embed_tokens.weight.dtype  # (cast with it: `.double()`)
            torch.testing.assert_close(made.hidden(tokens).float(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tied", [True, False])
def test_the_planner_prices_the_critics_flops_the_trainer_runs(tied: bool) -> None:
    """`traincost.critic_flop_params` (what the plan prices PPO's critic's forward, backward and values forward by) is
    the policy's less the lm_head's matmul, tied or not (a tied embedding's lookup is no matmul): counted by torch's
    FlopCounterMode, a critic's forward computes 2·V·h FLOPs a token fewer than the policy's, and its value head 2·h
    (on every position but the last) more; until 2026-12-07 priced as the policy's."""
    from torch.utils.flop_counter import FlopCounterMode

    from rlctl.profiler.traincost import critic_flop_params

    model = policy(tied)
    arch = model.config.arch("tiny")
    critic = ValueModel(TorchBackend(model).critic_trunk())
    b, t = 2, 9
    tokens = torch.randint(0, CFG.vocab_size, (b, t))
    counted = []
    for run in (model, critic):
        with torch.no_grad(), FlopCounterMode(display=False) as flops:
            run(tokens)
        counted.append(flops.get_total_flops())
    v, h = CFG.vocab_size, CFG.hidden_size
    assert counted[0] - counted[1] == b * t * 2 * v * h - b * (t - 1) * 2 * h
    assert critic_flop_params(arch) == arch.active - v * h + h + 1  # (+ 1: the value head's bias, an add)
