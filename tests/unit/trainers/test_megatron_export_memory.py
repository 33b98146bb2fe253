"""What a megatron rank of a tp split holds while `MegatronBackend.weights` gathers the full HF tensors it publishes
(`rlctl.planner.costs.export_bytes` prices it): the last gather's tensors are let go before the next gather starts,
and each tensor's tp parts are joined and let go before the next tensor is gathered; versus the last gather's
tensors and every tensor's parts held beside the new ones (three times the model's fp32 bytes at tp 2). One tp rank
of two in this process: the all-gather is a fake that hands every part this rank's shard and records, at each call,
how many of the last gather's tensors and of the earlier calls' parts are still alive."""

from __future__ import annotations

import weakref
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from rlctl.models.hfnames import expected_shapes
from rlctl.trainers.base import wire_weights
from rlctl.trainers.megatron import backend as megatron_backend
from rlctl.trainers.megatron import names
from rlctl.trainers.megatron.backend import MegatronBackend
from rlctl.trainers.megatron.names import Stage
from tests.unit.tiny_models import small_config

TP = 2


class TpRank(nn.Module):
    """A policy as `MegatronBackend.weights` reads it at tp 2, pp 1: its HF-layout shard (`export_hf`, this rank's
    part of each tensor split over tp) and its parameters (whose versions say whether a step ran)."""

    def __init__(self) -> None:
        super().__init__()
        self.config, self.tp, self.stage = small_config(hidden=32, layers=2, heads=4), TP, Stage()
        self.step = nn.Parameter(torch.zeros(1))

    def export_hf(self) -> dict[str, torch.Tensor]:
        out = {}
        for i, (name, shape) in enumerate(expected_shapes(self.config).items()):
            part = list(shape)
            if (dim := names.shard_dim(name)) is not None:
                part[dim] //= TP
            out[name] = torch.full(part, float(i)) + self.step.detach()
        return out


@pytest.fixture
def gathers(monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[int, int]], list[Any], list[Any]]:
    """(at each all-gather: (the last gather's tensors alive, earlier parts alive)), the last gather's tensors and
    the parts handed out, as weak references."""
    seen: list[tuple[int, int]] = []
    old: list[Any] = []
    parts_out: list[Any] = []

    def all_gather(parts: list[torch.Tensor], t: torch.Tensor, group: Any = None) -> None:
        seen.append((sum(r() is not None for r in old), sum(r() is not None for r in parts_out)))
        for p in parts:
            p.copy_(t)
        parts_out.extend(weakref.ref(p) for p in parts)

    tp_group = SimpleNamespace(get_tensor_model_parallel_group=lambda: None)
    monkeypatch.setattr(megatron_backend, "import_megatron", lambda: SimpleNamespace(parallel_state=tp_group))
    monkeypatch.setattr(megatron_backend.dist, "all_gather", all_gather)
    return seen, old, parts_out


def test_a_tp_ranks_gather_lets_the_last_one_and_each_tensors_parts_go_first(
    gathers: tuple[list[tuple[int, int]], list[Any], list[Any]],
) -> None:
    seen, old, parts_out = gathers
    policy = TpRank()
    backend = MegatronBackend(policy)  # (what weights() reads of a MegatronPolicy)
    first = backend.weights()
    split = [n for n in expected_shapes(policy.config) if names.shard_dim(n) is not None]
    assert len(seen) == len(split) > 0
    shard = policy.export_hf()
    want = names.gather_hf([shard] * TP)  # (every rank's part this one's: the fake's)
    assert {k: tuple(v.shape) for k, v in first.items() if k in want} == expected_shapes(policy.config)
    assert all(torch.equal(first[k], v) for k, v in want.items())
    assert backend.weights() is not first and len(seen) == len(split)  # asked again, no step: no gather

    old.extend(weakref.ref(t) for t in first.values())
    del first
    with torch.no_grad():
        policy.step.add_(1)  # a step: the parameters changed
    seen.clear()
    parts_out.clear()
    second = backend.weights()
    assert seen == [(0, 0)] * len(split)  # versus (every last tensor alive, every earlier part alive) at each call
    assert all(torch.equal(second[k], v + 1) for k, v in want.items())


class WholeRank(nn.Module):
    """A policy as `MegatronBackend.weights` reads it at tp = pp = 1: its GPTModel's state (`megatron_state`, made
    from HF tensors by the name table) and the export of it all at once (`export_hf`, as `MegatronPolicy`'s)."""

    def __init__(self) -> None:
        super().__init__()
        self.config, self.tp, self.stage = small_config(hidden=32, layers=2, heads=4), 1, Stage()
        hf = {k: torch.randn(shape) for k, shape in expected_shapes(self.config).items()}
        self.state = names.to_megatron(hf, self.config)
        self.hf = hf

    def megatron_state(self) -> dict[str, torch.Tensor]:
        return dict(self.state)

    def export_hf(self) -> dict[str, torch.Tensor]:
        return names.to_hf(self.megatron_state(), self.config)


def test_a_whole_replicas_export_makes_q_k_v_as_each_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """At tp = pp = 1 the export's q, k and v (copies: a fused qkv's rows interleave by query group) are made as each is
    read: none made by `weights()` itself, at most one layer's alive as a wire snapshot reads them one at a time;
    versus every layer's q, k and v made at once (fp32, on the rank's device at every publish and checkpoint)."""
    policy = WholeRank()
    storages = {t.untyped_storage().data_ptr() for t in policy.state.values()}
    copies: list[Any] = []  # each exported tensor that is not a view of the GPTModel's state
    alive_at: list[int] = []
    to_hf = names.to_hf

    def recorded(*args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        alive_at.append(sum(r() is not None for r in copies))
        out = to_hf(*args, **kwargs)
        copies.extend(weakref.ref(t) for t in out.values() if t.untyped_storage().data_ptr() not in storages)
        return out

    monkeypatch.setattr(names, "to_hf", recorded)
    backend = MegatronBackend(policy)  # (what weights() reads of a MegatronPolicy)
    exported = backend.weights()
    assert sum(r() is not None for r in copies) == 0  # versus q, k and v of both layers
    wire = wire_weights(exported, dtype=torch.bfloat16, tied=False)
    assert max(alive_at) <= 3  # (q, k and v of the layer last read, until the next is)
    assert list(wire) == list(policy.hf) and all(
        torch.equal(wire[k], v.to(torch.bfloat16)) for k, v in policy.hf.items()
    )
