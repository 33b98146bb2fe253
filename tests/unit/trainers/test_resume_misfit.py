"""A resume (`load_trainer`) of a checkpoint whose policy is not the job's model — another model's checkpoint in the
job's directory, a config.json edited between the runs — ends in one ConfigError line naming the checkpoint's model
directory and what does not fit (`rlctl.models.tensors.check_fit`, `check_tied`), the trainer's weights as they
were, on every path a policy is resumed by: a TinyGPT, the torch backend whole and sharded (FSDP2 on one gloo rank),
megatron. Versus, before: the ValueError's traceback (TinyGPT, torch), a missing tensor refused and others copied
until a shape did not fit (sharded), a KeyError (megatron); and a tied model's embedding overwritten by the
checkpoint's lm_head (TinyGPT, torch) or the lm_head dropped (megatron)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from rlctl.checkpoint.trainer import HostPolicy, load_trainer, save_trainer
from rlctl.errors import ConfigError
from rlctl.launch.agentenv import ParallelConfig
from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig
from rlctl.trainers.base import TrainerBackend, load_backend
from rlctl.trainers.fsdp import local_tensor
from tests.unit.tiny_models import small_config

SAVED = small_config()  # untied, one layer
JOBS = {
    "another-depth": (
        dataclasses.replace(SAVED, num_hidden_layers=2),
        r"9 missing \(model\.layers\.1\.[^;]*, … 6 more\)",
    ),
    "tied": (
        dataclasses.replace(SAVED, tie_word_embeddings=True),
        r"lm_head\.weight differs from model\.embed_tokens\.weight, .*",
    ),
}


def policy(kind: str, model_dir: Path) -> TinyGPT | TrainerBackend:
    if kind == "tinygpt":
        return TinyGPT.from_pretrained(model_dir)
    return load_backend("megatron" if kind == "megatron" else "torch", model_dir, shard=kind == "torch-sharded")


def state(model: TinyGPT | TrainerBackend) -> dict[str, torch.Tensor]:
    module: Any = model if isinstance(model, TinyGPT) else model.model
    tensors = module.megatron_state() if hasattr(module, "megatron_state") else module.state_dict()
    return {k: local_tensor(v).clone() for k, v in tensors.items()}


@pytest.mark.parametrize("job", list(JOBS))
@pytest.mark.parametrize("kind", ["tinygpt", "torch", "torch-sharded", "megatron"])
def test_a_checkpoint_of_another_model_is_refused_in_one_line_and_nothing_is_copied(
    tmp_path: Path, request: pytest.FixtureRequest, kind: str, job: str
) -> None:
    if kind in ("torch-sharded", "megatron"):
        request.getfixturevalue("megatron_rank")  # a gloo group of one rank (and megatron's parallel state)
    config, said = JOBS[job]
    torch.manual_seed(0)
    TinyGPT(SAVED).save_pretrained(tmp_path / "saved")
    TinyGPT(config).save_pretrained(tmp_path / "job")
    split = ParallelConfig("trainer", fsdp=kind == "torch-sharded" or None)
    saved = policy(kind, tmp_path / "saved")
    write(tmp_path / "iter-1", saved, split, SAVED)

    resumed = policy(kind, tmp_path / "job")
    module = resumed if isinstance(resumed, TinyGPT) else resumed.model
    before = state(resumed)
    ckpt = tmp_path / "iter-1"
    with pytest.raises(ConfigError, match=f"^{re.escape(str(ckpt / 'model'))}: weights do not fit this model: {said}$"):
        load_trainer(ckpt, model=resumed, optimizers={"policy": torch.optim.AdamW(module.parameters())}, split=split,
                     data_parallel=data_parallel(resumed), version=1)  # fmt: skip
    after = state(resumed)
    assert list(after) == list(before) and all(torch.equal(after[k], v) for k, v in before.items())


def write(ckpt: Path, model: TinyGPT | TrainerBackend, split: ParallelConfig, config: TinyGPTConfig) -> None:
    """`model`'s trainer checkpoint (a sharded one's policy from its state: one rank holds it all)."""
    module: Any = model if isinstance(model, TinyGPT) else model.model
    sharded = bool(split.fsdp)
    save_trainer(
        ckpt,
        model=HostPolicy({k: local_tensor(v) for k, v in module.state_dict().items()}, config) if sharded else model,
        optimizers={"policy": torch.optim.AdamW(module.parameters())},
        modules=model.checkpoint_modules() if isinstance(model, TrainerBackend) else None,
        counters={"version": 1},
        split=split,
        data_parallel=data_parallel(model),
    )


def data_parallel(model: TinyGPT | TrainerBackend) -> Any:
    from rlctl.trainers.base import DataParallel

    return model.data_parallel() if isinstance(model, TrainerBackend) else DataParallel()


def critic_of(config: TinyGPTConfig) -> torch.nn.Module:
    from rlctl.rl.ppo import ValueModel

    critic = ValueModel(TinyGPT(config))
    torch.nn.init.normal_(critic.head.weight)  # (not the zeros every critic starts from: a copy would show)
    return critic


@pytest.mark.parametrize("kind", ["tinygpt", "torch"])
def test_a_checkpoints_critic_that_does_not_fit_is_refused_in_one_line_before_anything_is_copied(
    tmp_path: Path, kind: str
) -> None:
    """A PPO checkpoint whose critic is not the job's (the shard's module.critic of another depth): torch's
    load_state_dict copied every critic tensor that fit, after the checkpoint's policy was loaded, then raised its
    RuntimeError (a traceback); now one ConfigError line naming the shard and the module, the policy and the critic
    as they were, bit for bit. A checkpoint of a job without a critic: one line too, versus a KeyError."""
    torch.manual_seed(0)
    TinyGPT(SAVED).save_pretrained(tmp_path / "saved")
    split = ParallelConfig("trainer")
    saved = policy(kind, tmp_path / "saved")
    saved_module: Any = saved if isinstance(saved, TinyGPT) else saved.model
    ckpt = tmp_path / "iter-1"
    save_trainer(ckpt, model=saved, optimizers={"policy": torch.optim.AdamW(saved_module.parameters())},
                 modules={"critic": critic_of(SAVED)}, counters={"version": 1}, split=split,
                 data_parallel=data_parallel(saved))  # fmt: skip
    no_critic = tmp_path / "iter-2"
    save_trainer(no_critic, model=saved, optimizers={"policy": torch.optim.AdamW(saved_module.parameters())},
                 counters={"version": 2}, split=split, data_parallel=data_parallel(saved))  # fmt: skip

    torch.manual_seed(1)  # (the job's own initial weights: not the checkpoint's)
    TinyGPT(SAVED).save_pretrained(tmp_path / "job")
    resumed = policy(kind, tmp_path / "job")
    module: Any = resumed if isinstance(resumed, TinyGPT) else resumed.model
    critic = critic_of(dataclasses.replace(SAVED, num_hidden_layers=2))
    before, critic_before = state(resumed), {k: v.clone() for k, v in critic.state_dict().items()}
    shard = ckpt / "ranks" / "rank-0.pt"
    cases = [
        (ckpt, 1, f"{shard}: module.critic: weights do not fit this model: 9 missing \\(body\\.model\\.layers\\.1\\."),
        (no_critic, 2, f"{no_critic / 'ranks' / 'rank-0.pt'}: module.critic: missing: the checkpoint's job trained"),
    ]
    for at, version, said in cases:
        with pytest.raises(ConfigError, match=f"^{said}") as e:
            load_trainer(at, model=resumed, optimizers={"policy": torch.optim.AdamW(module.parameters())},
                         modules={"critic": critic}, split=split, data_parallel=data_parallel(resumed),
                         version=version)  # fmt: skip
        assert "\n" not in str(e.value)
        after = state(resumed)
        assert list(after) == list(before) and all(torch.equal(after[k], v) for k, v in before.items())
        assert all(torch.equal(critic.state_dict()[k], v) for k, v in critic_before.items())


@pytest.mark.parametrize("sharded", [False, True])
def test_load_local_refuses_a_state_that_does_not_fit_before_it_copies_a_tensor(
    request: pytest.FixtureRequest, sharded: bool
) -> None:
    """A shard's saved state (`local_state`) of another model: a KeyError or the copy's RuntimeError with the
    tensors before it copied (sharded), torch's RuntimeError after every tensor that fit was copied (unsharded);
    now DoesNotFit in one line, nothing copied."""
    from rlctl.models.tensors import DoesNotFit
    from rlctl.trainers.fsdp import load_local, local_state, shard

    if sharded:
        request.getfixturevalue("megatron_rank")  # a gloo group of one rank
    torch.manual_seed(0)
    model = TinyGPT(SAVED)
    other = TinyGPT(dataclasses.replace(SAVED, intermediate_size=SAVED.intermediate_size * 2))
    if sharded:
        shard(model, cuda=False)
        shard(other, cuda=False)
    saved = local_state(other.state_dict())
    before = state(model)
    with pytest.raises(DoesNotFit, match=r"^weights do not fit this model: 3 of another shape \(model\.layers\.0\."):
        load_local(model, saved)
    after = state(model)
    assert list(after) == list(before) and all(torch.equal(after[k], v) for k, v in before.items())
    load_local(model, local_state(TinyGPT(SAVED).state_dict()))  # one that fits: copied
    assert not all(torch.equal(state(model)[k], v) for k, v in before.items())
