"""A LoRA policy's whole replica (the unsharded torch trainer) merges each adapted weight as it is read when it is
published or checkpointed (`lora.MergedWeights`): a wire snapshot (`wire_weights`) and a checkpoint's host copy
(`HostPolicy`) of `TorchBackend.weights()` hold one merged weight at a time beside the model; versus every adapted
weight's merged fp32 copy made at once (on a GPU, 4 B a parameter of every target, most of the model's, beside the
frozen weights, at every publish and checkpoint). The merge is recorded: at each, how many of the earlier ones
are still alive."""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import torch

from rlctl.checkpoint.trainer import HostPolicy
from rlctl.config.runtime import TARGETS
from rlctl.models import lora
from rlctl.models.tinygpt import TinyGPT
from rlctl.trainers.base import wire_weights
from rlctl.trainers.native import TorchBackend
from tests.unit.tiny_models import small_config


@pytest.fixture
def merges(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[Any]]:
    """At each merge of an adapted weight: how many earlier merged weights are alive; and those weights (weakly)."""
    alive: list[Any] = []
    seen: list[int] = []
    merged = lora.LoraLinear.merged

    def recorded(self: lora.LoraLinear, weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        seen.append(sum(r() is not None for r in alive))
        out = merged(self, weight, a, b)
        alive.append(weakref.ref(out))
        return out

    monkeypatch.setattr(lora.LoraLinear, "merged", recorded)
    return seen, alive


def test_a_lora_replica_publishes_and_checkpoints_one_merged_weight_at_a_time(
    merges: tuple[list[int], list[Any]],
) -> None:
    seen, alive = merges
    torch.manual_seed(0)
    model = TinyGPT(small_config(layers=2))
    adapted = lora.add_adapters(model, rank=4, alpha=8.0, targets=TARGETS)
    with torch.no_grad():  # B ≠ 0: the merge changes the weights
        for m in lora.adapters(model).values():
            m.lora_B.normal_()
    backend = TorchBackend(model)
    want = lora.merged_weights(model)  # (its merges held here, not counted)
    seen.clear()
    alive.clear()

    wire = wire_weights(backend.weights(), dtype=torch.bfloat16, tied=False, on_device=True)
    assert len(seen) == len(adapted) > 1 and max(seen) <= 1  # (the loop's last one, until the next is read)
    assert all(torch.equal(wire[k], v.to(torch.bfloat16)) for k, v in want.items())

    seen.clear()
    alive.clear()
    policy = HostPolicy(backend.weights(), model.config)
    assert len(seen) == len(adapted) and max(seen) <= 1  # versus 0, 1, … len - 1: every one held
    assert all(torch.equal(policy.state[k], v) for k, v in want.items() if k in policy.state)
    assert list(backend.weights()) == list(want)
