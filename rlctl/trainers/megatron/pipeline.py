"""Pipeline stages chained inside one forward: every rank of a pipeline returns the full logits.

Each rank holds one stage of the GPTModel (`names.Stage`); the learner calls `model(tokens)` and
`loss.backward()` on every rank alike (the ranks of a pipeline share a data-parallel rank, so they train the
same samples in the same order), and this module turns those calls into the point-to-point traffic between
the matching ranks of adjacent stages (megatron's next/previous pipeline ranks; tp rank r talks to tp rank r):

    forward     stage 0 ──hidden [T,B,h]──▶ stage 1 ──▶ … ──▶ last stage: logits ──broadcast (pp group)──▶ all
    backward    stage 0 ◀──∂hidden──────── stage 1 ◀── … ◀── last stage: ∂logits of its own loss

Every rank computes the same loss from the same logits; only the last stage's ∂logits is used (the others
ignore theirs and take the gradient of their output from the next stage instead), so each parameter gets the
gradient it would have in one process. The non-last stages' input enters megatron as `set_input_tensor`.

This is a stage-by-stage schedule: one micro-batch passes through the stages in turn, and a stage waits while
the others compute. It splits the model's parameters, gradients and optimizer state over the stages (what pp
is for when a model does not fit), not its time: megatron's own schedules (1F1B, interleaved:
`forward_backward_pipelining_*`), which overlap micro-batches, are not used.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from rlctl.trainers.megatron import cpu
from rlctl.trainers.megatron.names import Stage


def forward(gpt: Any, stage: Stage, tokens: torch.Tensor, positions: torch.Tensor, *, hidden: int) -> torch.Tensor:
    """This stage's part of the forward of `tokens` [B, T]; the full fp32 logits [B, T, V] on every stage."""
    from megatron.core import parallel_state as ps

    b, t = tokens.shape
    if not stage.first:
        prev = ps.get_pipeline_model_parallel_prev_rank()
        x = torch.empty(t, b, hidden, dtype=torch.float32)  # megatron's hidden states are sequence-first
        dist.recv(x, prev)
        if torch.is_grad_enabled():
            x.requires_grad_()
            x.register_hook(lambda grad: dist.send(grad.contiguous(), prev))  # ∂input to the previous stage
        gpt.set_input_tensor(x)
    with cpu.on_cpu():
        out: torch.Tensor = gpt(tokens, positions, None)  # causal by the layers' mask type (attention.py)
    group, last = ps.get_pipeline_model_parallel_group(), ps.get_pipeline_model_parallel_last_rank()
    if stage.last:
        logits = out.float()
        dist.broadcast(logits.detach(), last, group=group)
        return logits
    following = ps.get_pipeline_model_parallel_next_rank()
    dist.send(out.detach().contiguous(), following)
    return _FromLastStage.apply(out, (b, t, gpt.vocab_size), last, group, following)


class _FromLastStage(torch.autograd.Function):
    """Forward: the logits the last stage broadcasts, standing for a stage output `out` it does not depend on
    here. Backward: the gradient of `out`, received from the next stage (the given ∂logits is ignored)."""

    @staticmethod
    def forward(
        ctx: Any, out: torch.Tensor, shape: tuple[int, ...], last: int, group: Any, next_rank: int
    ) -> torch.Tensor:
        ctx.out_shape, ctx.next_rank = out.shape, next_rank
        logits = torch.empty(shape, dtype=torch.float32)
        dist.broadcast(logits, last, group=group)
        return logits

    @staticmethod
    def backward(ctx: Any, grad_logits: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        del grad_logits
        grad = torch.empty(ctx.out_shape, dtype=torch.float32)
        dist.recv(grad, ctx.next_rank)
        return grad, None, None, None, None
