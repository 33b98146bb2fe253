"""Pipeline stages chained inside one forward, micro-batch chunks overlapping across them (GPipe within a cut):
every rank of a pipeline returns the full logits (a PPO critic's trunk: the full final hidden states, which
take the same path; "logits" below stands for either).

Each rank holds one stage of the GPTModel (`names.Stage`); the learner calls `model(tokens)` and
`loss.backward()` on every rank alike (the ranks of a pipeline share a data-parallel rank, so they train the
same samples in the same order), and this module turns those calls into the point-to-point traffic between
the matching ranks of adjacent stages (megatron's next/previous pipeline ranks; tp rank r talks to tp rank r).
The rows [B, T] of the call (one learner cut) are split into m = `rl.cuts.pipeline_chunks(B, pp)` chunks
(2 per stage, at most one per row); each message carries one chunk, tagged with its index, sent without
blocking while the stage goes on with the next chunk:

    forward     stage 0 ──hidden of chunk j [T,b_j,h]──▶ stage 1 ──▶ … ──▶ last stage: logits of the chunks,
                concatenated ──broadcast (pp group)──▶ all
    backward    stage 0 ◀──∂hidden of chunk j──── stage 1 ◀── … ◀── last stage: ∂logits of its own loss

    pp 2, m 4    forward            backward (the chunk made last goes back first)
    stage 0      F0 F1 F2 F3 ··     ·· B3 B2 B1 B0       each stage idles pp − 1 of the m + pp − 1 chunk-steps
    stage 1      ·· F0 F1 F2 F3     B3 B2 B1 B0 ··       of either pass

Every rank computes the same loss from the same logits; only the last stage's ∂logits is used. There the
engine runs the backward of the chunks one after another, the chunk made last first (a node made later has a
higher sequence number; measured on the stages' graphs: tests/unit/trainers/test_megatron_pp.py), and a hook
on each chunk's received input sends its gradient as soon as it is computed. The other stages ignore their
∂logits: `_FromLastStage` holds the chunks' outputs outside the graph of the logits and, in its backward,
receives the gradient of each chunk in that order and back-propagates it alone (a re-entrant backward, as
activation checkpointing does), so a stage works on chunk j while the next works on chunk j − 1. Each
parameter gets the gradient it would have in one process. The non-last stages' input enters megatron as
`set_input_tensor`. A no-grad forward (the reference model's) takes the same path without the backward parts.

Each cut drains the pipeline: a stage idles (pp − 1)/m of the cut's time, which the planner charges
(`rlctl.planner.costs.train_time_s`); at B = 1 (m = 1) this is the stage-by-stage schedule. megatron's own
schedules (1F1B, interleaved: `forward_backward_pipelining_*`), which overlap the micro-batches of a whole
mini-batch, are not used: the learner hands the model one cut at a time.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from rlctl.rl.cuts import pipeline_chunks
from rlctl.trainers.megatron import cpu
from rlctl.trainers.megatron.names import Stage


def forward(
    gpt: Any,
    stage: Stage,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    *,
    hidden: int,
    width: int,
    chunks: int | None = None,
) -> torch.Tensor:
    """This stage's part of the forward of `tokens` [B, T]; the last stage's full fp32 output [B, T, width] on
    every stage (the logits, width V; a critic's trunk: its final hidden states, width `hidden`). `chunks`
    overrides the number of pipeline chunks (the benchmark's stage-by-stage baseline: 1)."""
    from megatron.core import parallel_state as ps

    b, t = tokens.shape
    m = pipeline_chunks(b, stage.count) if chunks is None else chunks
    assert 1 <= m <= b, (m, b)
    rows = [len(r) for r in torch.arange(b).tensor_split(m)]  # the same split on every stage
    grad = torch.is_grad_enabled()
    device = next(gpt.parameters()).device  # the stage's: every buffer a message lands in (NCCL sends no host tensor)
    inputs: list[torch.Tensor] = []
    if not stage.first:  # every chunk's receive posted at once: the data lands while this stage computes
        prev = ps.get_pipeline_model_parallel_prev_rank()
        inputs = [torch.empty(t, r, hidden, dtype=torch.float32, device=device) for r in rows]  # sequence-first
        received = [_irecv(x, prev, tag=j) for j, x in enumerate(inputs)]
        to_prev = _GradSends(prev, m)
    following = None if stage.last else ps.get_pipeline_model_parallel_next_rank()
    outs: list[torch.Tensor] = []
    sends: list[tuple[Any, torch.Tensor]] = []
    for j, (tok, pos) in enumerate(zip(tokens.split(rows), positions.split(rows), strict=True)):
        if not stage.first:
            received[j].wait()
            x = inputs[j]
            if grad:
                x.requires_grad_()
                x.register_hook(to_prev.hook(j))  # ∂input of chunk j to the previous stage
            gpt.set_input_tensor(x)
        with cpu.on_cpu(tok.device):
            out = gpt(tok, pos, None)  # causal by the layers' mask type (attention.py)
        if following is not None:
            buf = out.detach().contiguous()
            sends.append((dist.isend(buf, following, tag=j), buf))
        outs.append(out)
    for work, _ in sends:
        work.wait()
    group, last = ps.get_pipeline_model_parallel_group(), ps.get_pipeline_model_parallel_last_rank()
    if stage.last:
        logits = (torch.cat(outs) if m > 1 else outs[0]).float()
        dist.broadcast(logits.detach(), last, group=group)
        return logits
    shape = (b, t, width)
    if not grad:
        logits = torch.empty(shape, dtype=torch.float32, device=device)
        dist.broadcast(logits, last, group=group)
        return logits
    anchor = torch.empty(0, device=device, requires_grad=True)  # puts the Function in the loss's graph; no gradient
    result: torch.Tensor = _FromLastStage.apply(anchor, outs, shape, last, group, following)
    return result


def _irecv(t: torch.Tensor, src: int, *, tag: int) -> dist.Work:
    work = dist.irecv(t, src, tag=tag)
    assert work is not None  # None only on a rank outside the group: this is the default one
    return work


class _GradSends:
    """The hooks that send each chunk's ∂input to the previous stage as the backward computes it (without
    blocking the backward); the sends are waited once all m are under way."""

    def __init__(self, prev: int, m: int) -> None:
        self.prev, self.m = prev, m
        self.pending: list[tuple[Any, torch.Tensor]] = []

    def hook(self, j: int) -> Any:
        def send(grad: torch.Tensor) -> None:
            buf = grad.contiguous()
            self.pending.append((dist.isend(buf, self.prev, tag=j), buf))
            if len(self.pending) == self.m:
                for work, _ in self.pending:
                    work.wait()
                self.pending.clear()

        return send


class _FromLastStage(torch.autograd.Function):
    """Forward: the logits the last stage broadcasts, standing for this stage's chunk outputs `outs`, which are
    not inputs (the engine does not back-propagate them: this does, chunk by chunk). Backward: for each chunk
    in the order the next stage sends them (the chunk made last first), its ∂output received from the next
    stage and a re-entrant backward through its graph (the given ∂logits is ignored)."""

    @staticmethod
    def forward(
        ctx: Any,
        anchor: torch.Tensor,
        outs: list[torch.Tensor],
        shape: tuple[int, ...],
        last: int,
        group: Any,
        next_rank: int,
    ) -> torch.Tensor:
        ctx.outs, ctx.next_rank = outs, next_rank
        logits = torch.empty(shape, dtype=torch.float32, device=anchor.device)  # the stage's
        dist.broadcast(logits, last, group=group)
        return logits

    @staticmethod
    def backward(ctx: Any, grad_logits: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        del grad_logits
        outs, ctx.outs = ctx.outs, None  # their graphs are freed as each chunk's backward runs
        grads = [torch.empty(o.shape, dtype=o.dtype, device=o.device) for o in outs]
        received = [_irecv(g, ctx.next_rank, tag=j) for j, g in enumerate(grads)]
        for j in reversed(range(len(outs))):
            received[j].wait()
            torch.autograd.backward(outs[j], grads[j])
        return None, None, None, None, None, None
