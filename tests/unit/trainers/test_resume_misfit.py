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
