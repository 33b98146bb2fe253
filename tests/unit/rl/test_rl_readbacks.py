"""What a GPU trainer reads back to the host per micro-batch: once, not once a sample (each read-back of a CUDA
tensor waits for the device). Told on the CPU by a tensor type that counts its read-backs."""

from __future__ import annotations

from typing import Any

import torch

from rlctl.config.algorithm import PpoAlgorithm
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.grpo import policy_loss
from rlctl.rl.ppo import PpoLearner, ValueModel
from rlctl.rl.samples import Sample, make_batch, score
from tests.unit.tiny_models import small_config

SMALL = small_config()
READS = (torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.item, torch.Tensor.numpy, torch.Tensor.__float__)


class OnDevice(torch.Tensor):
    """A tensor standing for one in device memory: every read-back to the host counts; what it gives is a host
    tensor (plain)."""

    reads = 0
    ops = 0  # every torch function on one: each a kernel launch on a GPU

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        cls.ops += 1
        if func in READS:
            cls.reads += 1
            with torch._C.DisableTorchFunctionSubclass():
                out = func(*args, **(kwargs or {}))
                return out.as_subclass(torch.Tensor) if isinstance(out, torch.Tensor) else out
        return super().__torch_function__(func, types, args, kwargs)


class _DevicePolicy(torch.nn.Module):
    def __init__(self, model: TinyGPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens).as_subclass(OnDevice)


class _DeviceCritic(ValueModel):
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return super().forward(tokens).as_subclass(OnDevice)


def _samples(n: int) -> list[Sample]:
    return [
        Sample(f"p{i % 2}", [1, 4], [5 + i, 6, 7 + i][: 1 + i % 3], [-1.0] * (1 + i % 3), float(i)) for i in range(n)
    ]


def test_reference_logprobs_of_a_micro_batch_are_read_back_once() -> None:
    """`score` (a KL term's reference log-probs, every micro-batch) read each sample's row back on its own."""
    torch.manual_seed(0)
    OnDevice.reads = 0
    scored = score(_DevicePolicy(TinyGPT(SMALL)), _samples(6))
    assert OnDevice.reads == 1
    assert [len(lp) for lp in scored] == [len(s.output_tokens) for s in _samples(6)]


def test_ppo_advantages_of_a_cut_are_read_back_once() -> None:
    """PPO's advantages and returns came back to the host two reads a sample."""
    torch.manual_seed(0)
    model = TinyGPT(SMALL)
    learner = PpoLearner(model, PpoAlgorithm(kind="ppo"), critic=_DeviceCritic(TinyGPT(SMALL)))
    OnDevice.reads = 0
    adv, ret = learner.advantages(_samples(6))  # one cut (micro-batches of 32 samples)
    assert OnDevice.reads == 1  # the critic's values (the advantages and returns were two: GAE ran on the device)
    assert [len(a) for a in adv] == [len(r) for r in ret] == [len(s.output_tokens) for s in _samples(6)]


def test_ppo_advantages_run_no_device_op_per_token() -> None:
    """GAE's backward scan ran on the critic's device: a few ops a token position, each a launch on a GPU."""
    torch.manual_seed(0)
    learner = PpoLearner(TinyGPT(SMALL), PpoAlgorithm(kind="ppo"), critic=_DeviceCritic(TinyGPT(SMALL)))
    ops = []
    for length in (2, 20):
        samples = [Sample(f"p{i}", [1, 4], [5] * length, [-1.0] * length, float(i)) for i in range(4)]
        OnDevice.ops = 0
        learner.advantages(samples)
        ops.append(OnDevice.ops)
    assert ops[0] == ops[1], ops  # the same ops whatever the outputs' length


def test_a_micro_batchs_loss_figures_are_read_back_once() -> None:
    """`policy_loss`'s nine figures were nine read-backs, each between the forward and the backward."""
    torch.manual_seed(0)
    samples = _samples(6)
    batch = make_batch(samples, [1.0, -1.0] * 3)
    batch.ref_logprobs = batch.old_logprobs - 0.1
    for off_policy in ("clip", "decoupled"):
        OnDevice.reads = 0
        figures = policy_loss(_DevicePolicy(TinyGPT(SMALL)), batch, 0.2, 0.1, off_policy=off_policy, is_cap=2.0)[1]
        assert OnDevice.reads == 1, off_policy
        assert figures["tokens"] == sum(len(s.output_tokens) for s in samples) and figures["kl_ref_sum"] > 0
