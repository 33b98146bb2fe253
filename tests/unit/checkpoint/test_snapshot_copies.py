"""A sharded (FSDP2) rank's checkpoint shard and optimizer digest read its AdamW state and parameters without a copy
on the device: the shard's snapshot copies each tensor once, from the live state straight to the host, and the
digest copies none to the device it is on. Versus, before: `local_state` cloned every shard where it lay (on a GPU,
8 bytes per local parameter for the moments and 4 for the fp32 policy, unpriced, at every checkpoint and resume)
and the snapshot copied the clones. One gloo rank in this process, on the CPU: a clone there is the device copy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from rlctl.checkpoint.trainer import HostPolicy, _shard_snapshot, optimizer_digest, states_digest
from rlctl.models.tinygpt import TinyGPT
from rlctl.trainers.base import DataParallel
from rlctl.trainers.fsdp import local_tensor, shard
from rlctl.trainers.native import TorchBackend
from tests.unit.tiny_models import small_config

COPIES = {"aten.clone.default", "aten._to_copy.default", "aten.copy_.default"}


class Copies(TorchDispatchMode):
    """Each copy dispatched: its op, the storage it reads and the devices it reads from and writes to."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, int, str, str]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if str(func) in COPIES:
            src = args[1] if str(func) == "aten.copy_.default" else args[0]
            self.seen.append((str(func), src.untyped_storage().data_ptr(), str(src.device), str(out.device)))
        return out


@pytest.fixture
def stepped(tmp_path: Path) -> Iterator[tuple[TinyGPT, torch.optim.AdamW]]:
    """TinyGPT sharded by FSDP2 over one gloo rank, after one AdamW step (its moments and steps exist)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = TinyGPT(small_config())
        shard(model, cuda=False)
        opt = torch.optim.AdamW(model.parameters())
        model(torch.randint(0, model.config.vocab_size, (2, 5))).float().logsumexp(-1).sum().backward()
        opt.step()
        yield model, opt
    finally:
        dist.destroy_process_group()


def live_tensors(model: TinyGPT, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor a shard holds of `model` and `opt`, as the rank holds it (a DTensor's local shard)."""
    moments = [local_tensor(v) for st in opt.state.values() for v in st.values()]
    return moments + [local_tensor(v) for v in model.state_dict().values()]


def test_a_sharded_ranks_snapshot_copies_each_tensor_once_from_its_live_state(
    stepped: tuple[TinyGPT, torch.optim.AdamW],
) -> None:
    model, opt = stepped
    live = live_tensors(model, opt)
    assert any(local_tensor(p) is not p for p in model.parameters())  # (sharded: DTensors)
    with Copies() as copies:
        body = _shard_snapshot(
            optimizers={"policy": opt}, modules={"policy": model}, data_parallel=DataParallel(sharded=True)
        )
    assert body is not None
    assert {op for op, *_ in copies.seen} == {"aten._to_copy.default"}  # no clone
    assert sorted(src for _, src, *_ in copies.seen) == sorted(t.untyped_storage().data_ptr() for t in live)
    assert all(dst == "cpu" for *_, dst in copies.seen)

    saved = [v for st in body["optimizer.policy"]["state"].values() for v in st.values()]
    saved += list(body["module.policy"].values())
    assert len(saved) == len(live) and all(torch.equal(s, t) for s, t in zip(saved, live, strict=True))
    digest = optimizer_digest({"policy": opt})
    assert states_digest({"policy": body["optimizer.policy"]}) == digest

    model(torch.randint(0, model.config.vocab_size, (2, 5))).float().logsumexp(-1).sum().backward()
    opt.step()  # the snapshot is the state when it was taken: the next step changes the rank's state alone
    assert optimizer_digest({"policy": opt}) != digest == states_digest({"policy": body["optimizer.policy"]})


def test_a_sharded_ranks_optimizer_digest_copies_nothing_on_its_device(
    stepped: tuple[TinyGPT, torch.optim.AdamW],
) -> None:
    _, opt = stepped
    with Copies() as copies:
        optimizer_digest({"policy": opt})
    assert [c for c in copies.seen if c[0] == "aten.clone.default" or c[2] == c[3]] == []


def test_a_whole_replicas_snapshot_copies_each_tensor_once_from_its_live_state() -> None:
    """Rank 0 of an unsharded torch trainer (`rlctl.agents.trainer._snapshot`: `HostPolicy` of the backend's
    `weights()`, the learner's optimizers): each parameter and AdamW tensor copied once, straight to the host, none
    cloned where it lies; the snapshot is the state when it was taken (the next step changes the live state alone)."""
    torch.manual_seed(0)
    model = TinyGPT(small_config())
    backend = TorchBackend(model)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randint(0, model.config.vocab_size, (2, 5))).float().logsumexp(-1).sum().backward()
    opt.step()
    live = [v for st in opt.state.values() for v in st.values()]
    live += [
        t for k, t in model.state_dict().items() if not (model.config.tie_word_embeddings and k == "lm_head.weight")
    ]
    with Copies() as copies:
        policy = HostPolicy(backend.weights(), model.config)
        body = _shard_snapshot(optimizers={"policy": opt}, modules={}, data_parallel=DataParallel())
    assert body is not None
    assert {op for op, *_ in copies.seen} == {"aten._to_copy.default"}  # no clone
    assert sorted(src for _, src, *_ in copies.seen) == sorted(t.untyped_storage().data_ptr() for t in live)
    saved = dict(policy.state)
    model(torch.randint(0, model.config.vocab_size, (2, 5))).float().logsumexp(-1).sum().backward()
    opt.step()
    assert all(not torch.equal(saved[k], v) for k, v in model.state_dict().items() if k in saved and v.dim() > 1)
