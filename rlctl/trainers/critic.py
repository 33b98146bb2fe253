"""The `torch` trainer's PPO critic trunk: TinyGPT without its lm_head.

PPO's value model (`rlctl.rl.ppo.ValueModel`) reads the trunk's final normed hidden states (`TinyGPT.hidden`) and
applies a value head of its own: the policy's lm_head (vocab × hidden) is never used. A whole copy of the policy would
carry it all the same (until 2026-12-07 it did: at Qwen2.5-7B 152,064 × 3,584 ≈ 545 M parameters, 2.2 GB of fp32 a
replica, gathered by FSDP2 with the critic's root), so the trunk holds `NoHead` in its place: no tensor (no parameter,
no buffer), no state dict entry, no gradient or AdamW state, nothing to shard, gather or checkpoint. With tied
embeddings the lm_head's weight is the embedding's: the embedding stays (it is the trunk's input), the head alone goes.

    headless_copy(policy)   a copy of a whole policy, its lm_head never copied (`TorchBackend.critic_trunk`,
                            `PpoLearner`'s default critic)
    headless(trunk)         a trunk made on the meta device (the sharded backend's) given `NoHead` before it is
                            sharded (`rlctl.trainers.fsdp.shard_critic` then fills it from the policy's shards)

A critic checkpointed before (its `body.lm_head.weight`, and AdamW's index of it) resumes through
`rlctl.checkpoint.oldcritic`.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from rlctl.models.tinygpt import TinyGPT

HEAD = "lm_head.weight"  # the policy's output layer: what a critic's trunk holds none of


class NoHead(nn.Module):
    """A critic trunk's lm_head: no parameter, no buffer (TinyGPT reads its device and dtype off the embedding).
    Called, an AssertionError: the critic computes no logits."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        raise AssertionError("a PPO critic's trunk holds no lm_head: its value model reads `hidden`, not logits")


def headless(trunk: TinyGPT) -> TinyGPT:
    """`trunk` with `NoHead` in place of its lm_head (a tied one's embedding kept: the embedding module holds it)."""
    trunk.lm_head = NoHead()  # type: ignore[assignment]
    return trunk


def headless_copy(policy: TinyGPT) -> TinyGPT:
    """A copy of `policy` with `NoHead` in place of its lm_head, which is never copied (deepcopy's memo holds the
    stand-in for it): the copy costs the trunk's memory alone, versus the whole policy's with the head then dropped."""
    assert isinstance(policy, TinyGPT), type(policy)
    memo = {id(policy.lm_head): NoHead()}
    return copy.deepcopy(policy, memo)
