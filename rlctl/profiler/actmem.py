"""A trainer rank's activation memory: what a learner cut's forward keeps for its backward, priced from the model's
shape and the cut's tokens, for the planner's `rlctl.planner.costs.rank_bytes` and `rlctl check`.

Measured, not guessed: the bytes the torch trainer's forward and GRPO loss (`rlctl.rl.grpo.policy_loss`) save for
backward, each storage once (`torch.autograd.graph.saved_tensors_hooks`), TinyGPT under bf16 autocast as it trains
on a GPU (tests/unit/profiler/test_actmem.py holds this formula to them, within 2 %, on shapes it was not read from).
A token of a cut keeps, in bytes (h hidden, q = heads·head_dim, kv = kv_heads·head_dim, i intermediate, V vocab):

    each layer   26·h      the residual stream is fp32 (the embedding's output plus bf16 sums): each RMSNorm's input
                           and output (4 × 4 B), and the normed input cast to bf16 once for each of q, k, v, gate, up
                 4·q       q after RoPE and the attention's output (bf16)
                 4·kv      k after RoPE and v (bf16)
                 8·i       gate, silu(gate), up and their product (bf16)
                 4·heads   SDPA's log-sum-exp (fp32); flash attention keeps no heads × seq² scores (CPU and CUDA)
                 8         the two RMSNorms' 1/rms (fp32)
    with q/k norms (Qwen3's and Qwen3MoE's per-head RMSNorms of q and k before RoPE, `ModelArch.qk_norm`):
                 6·q, 6·kv each norm's fp32 input and its bf16 output, which the norm's fp32 weight scales
                 4·(heads + kv_heads)  their 1/rms (fp32)
                 and no RoPE tables: the normed q and k are fp32, so RoPE computes on the fp32 tables, uncast
    once         10·h      the final norm's input and output (fp32) and lm_head's bf16 input
                 4·V       the fp32 log-probabilities the log-softmax keeps
                 40        the loss's per-token figures
    a layer and sequence: 4·seq·head_dim (RoPE's tables cast to bf16)

A MoE's sparse layer (`ModelArch.token_intermediate`: a Qwen3MoE's or Qwen2MoE's, `rlctl.models.tinygpt.SparseMoE`)
prices its MLP at the width a token runs, i = top-k × the experts' width (+ a Qwen2MoE's shared expert's), not the
config's dense width, and beside it (fitted on TinyGPT's MoE layers without q/k norms, k experts a token of E):

    each layer   (10·h + 26)·k   each chosen expert's fp32 gathered input and its bf16 cast, its bf16 output that the
                                 router's weight scales, their indices
                 −2·h            the router's bf16 cast of the normed input, in place of a dense MLP's two (gate's and
                                 up's, which the 26·h holds)
                 4·E             the router's fp32 softmax
                 8·h + 2         a Qwen2MoE's shared expert beyond its 8·i: its input's bf16 casts, its output that its
                                 sigmoid gate scales, and that gate

(Until 2026-12-07 the router's and the sum's were 7·h + 12, fitted on Qwen3MoE layers with their q/k norms, then not
priced: 1,190 of the 1,656 B a token a layer they keep at h 128, q 192, kv 96, rows of 50.) Where some of a MoE's
layers are dense (`mlp_only_layers`, `decoder_sparse_step`) every layer is priced as a sparse one, of the larger width.

and autocast's bf16 copy of every matmul weight (2 B a parameter but the embedding's) from forward to backward:
with tied embeddings (`ModelArch.tied`, HF's tie_word_embeddings) lm_head's weight is the embedding's, counted once
in `params`, and its copy kept all the same (until 2026-12-07 left out: 2·V·h short, 272 MB at Qwen2.5-0.5B).
All of that is `saved_bytes`, the figure the test holds to the measured bytes. The log-softmax's backward then holds
two more fp32 [tokens, V] tensors beside the log-probabilities (their gradient and the logits'): 8·V a token, at
the start of the backward, when every layer's are held still (`transient_bytes`). A rank's peak, what the planner
and `rlctl check` price (`activation_bytes`), is the one plus the other, so the priced figure is the tested one.

With `trainer.activation_checkpointing` a layer keeps its fp32 input alone (4·h) and recomputes the rest in the
backward, one layer at a time: a rank holds the inputs, the final figures, and the larger of the log-softmax's
backward and one layer's recomputed set (with its weights' bf16 copies). Under FSDP2 (`fsdp`) the mixed-precision
policy computes on the gathered bf16 parameters (`costs.fsdp_gathered_bytes`), so no copies.

On a CPU the torch trainer computes in fp32, without autocast (`rlctl.trainers.native`; `Activations.fp32`, the
`FP32` figures), measured alike on other shapes than the test's: every tensor above is kept in fp32 and the normed
inputs are not cast, so a token keeps 24·h + 8·q + 8·kv + 16·i + 4·heads + 8 a layer (with q/k norms 8·(q + kv) +
4·(heads + kv_heads) more) and 12·h + 4·V + 40 once, no RoPE tables (the model's own fp32 buffers) and no weight
copies; a MoE's sparse layer (12·h + 28)·k + 4·E besides, and a Qwen2MoE's shared expert 4·h + 4. `rlctl check`
judges a `gpu: CPU` site's trainer rank by them against its slot's memory, and the planner prices it so.

PPO's critic (`rlctl.rl.ppo.ValueModel`, a copy of the policy's trunk and a value head, and its `value_loss`),
measured alike (test_actmem, within 1 %), keeps the policy's layers (or their inputs) and, once (`critic_saved_bytes`):

                 12·h      the final norm's input and output (fp32) and the value head's input: fp32 (the head runs
                           outside autocast), a contiguous copy of every position but a row's last
                 17        the final norm's 1/rms, the tokens, the value error and the mask

and the bf16 copies of every matmul weight but lm_head's (none checkpointed): no log-probabilities and no log-softmax
backward; checkpointed, one layer's recomputed set (`critic_activation_bytes`). The learner runs the critic's forward
on a cut after the policy's backward has freed the policy's activations (`PpoLearner.step`), so a PPO rank peaks at
the larger of the two (`Activations.rank_bytes`): the policy's, but for a vocabulary far narrower than the hidden
width (16 entries at h 256; tiny-demo's 66 at h 96 is the policy's). Its weights, gradients and AdamW state are the
second trained model's (`traincost.critic_params`, `analytical.training_entry`: the policy's trunk without its
lm_head, which the critic does not hold, `rlctl.trainers.critic`), sharded by FSDP2 as the policy's where it shards.

Per rank: a data-parallel rank trains a run of a cut's length order (`rlctl.rl.cuts.share_rows`), a share that
the micro-batch budgets bound at any dp (`rank_tokens`; until 2026-12-07 they bounded the whole cut, and a rank held
ceil(rows / dp) of its rows). The megatron trainer is priced by the same per-token figures, not measured on
it: tp divides the per-head and MLP terms (its column- and row-parallel layers; no sequence parallelism, so the
hidden-width terms stay whole) and not the logits (gathered over the tp group: every rank holds the full fp32
logits); a pipeline stage holds its layers' share (ceil(layers / pp)) for every chunk of the cut until the cut's
backward (GPipe, `rlctl.rl.cuts`), and the full logits (every stage returns them); no weight copies.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from rlctl.models.catalog import ModelArch

if TYPE_CHECKING:
    from rlctl.config.job import JobFile

LAYER_HIDDEN_BYTES = 26  # a token's bytes per hidden unit, per layer (see the module docstring for each term)
LAYER_HEAD_DIM_BYTES = 4  # per q and per kv unit (heads · head_dim, kv_heads · head_dim)
LAYER_INTERMEDIATE_BYTES = 8
LAYER_HEAD_BYTES = 4  # SDPA's fp32 log-sum-exp, per query head
LAYER_TOKEN_BYTES = 8
CHECKPOINT_HIDDEN_BYTES = 4  # with activation checkpointing, a layer's fp32 input alone
FINAL_HIDDEN_BYTES = 10
LOGPROB_BYTES = 4  # fp32 log-softmax output, per vocabulary entry
LOGITS_BACKWARD_BYTES = 8  # two fp32 [tokens, V] gradients in the log-softmax's backward
LOSS_TOKEN_BYTES = 40
# PPO's critic, once (see the module docstring): the final norm's fp32 input and output and the value head's fp32
# input, a contiguous copy; the final norm's 1/rms, the tokens (int64), the value error (fp32) and the mask (bool)
CRITIC_FINAL_HIDDEN_BYTES = 12
CRITIC_TOKEN_BYTES = 17
ROPE_POSITION_BYTES = 4  # bf16 cos and sin, per position and head dimension, per layer
WEIGHT_COPY_BYTES = 2  # autocast's bf16 copy of a matmul weight
QK_NORM_HEAD_DIM_BYTES = 6  # Qwen3's q/k RMSNorms, per q and per kv unit (see the module docstring)
QK_NORM_HEAD_BYTES = 4  # their fp32 1/rms, per query and per key head
MOE_EXPERT_HIDDEN_BYTES = 10  # a MoE's sparse layer, per chosen expert and hidden unit (see the module docstring)
MOE_EXPERT_BYTES = 26  # per chosen expert
# per hidden unit, once: the router's bf16 cast of the normed input (2·h) in place of a dense MLP's two (gate's and
# up's, which LAYER_HIDDEN_BYTES holds)
MOE_HIDDEN_BYTES = -2
MOE_ROUTER_BYTES = 4  # the router's fp32 softmax, per expert
MOE_TOKEN_BYTES = 0
MOE_SHARED_HIDDEN_BYTES = 8  # a Qwen2MoE's shared expert, per hidden unit: its input's bf16 casts, its scaled output
MOE_SHARED_TOKEN_BYTES = 2  # its gate's sigmoid (bf16)


class Widths(NamedTuple):
    """A token's bytes per unit where they depend on what the passes compute in (see the module docstring)."""

    layer_hidden: int
    head_dim: int
    qk_norm_head_dim: int
    intermediate: int
    final_hidden: int
    rope_position: int
    moe_expert_hidden: int
    moe_expert: int
    moe_hidden: int
    moe_token: int
    moe_shared_hidden: int
    moe_shared_token: int


BF16 = Widths(
    LAYER_HIDDEN_BYTES,
    LAYER_HEAD_DIM_BYTES,
    QK_NORM_HEAD_DIM_BYTES,
    LAYER_INTERMEDIATE_BYTES,
    FINAL_HIDDEN_BYTES,
    ROPE_POSITION_BYTES,
    MOE_EXPERT_HIDDEN_BYTES,
    MOE_EXPERT_BYTES,
    MOE_HIDDEN_BYTES,
    MOE_TOKEN_BYTES,
    MOE_SHARED_HIDDEN_BYTES,
    MOE_SHARED_TOKEN_BYTES,
)
# the torch trainer on a CPU (no autocast): every saved tensor fp32, no bf16 casts of the normed inputs, RoPE's tables
# the model's own buffers (see the module docstring)
FP32 = Widths(24, 8, 8, 16, 12, 0, 12, 28, 0, 0, 4, 4)


@dataclass(frozen=True)
class Activations:
    """What a trainer rank's activation memory is priced on: the model, its share of the learner's cuts
    (`rlctl.rl.cuts`: at most `rows` rows and, with `max_tokens`, that many padded tokens, a longer row alone) of
    rows up to `seq_tokens` long (the task's longest prompt + output), the trainer's backend and checkpointing, and
    whether it trains PPO's critic after the policy on each cut (`critic`)."""

    arch: ModelArch
    rows: int  # batch.train_micro_batch_samples, no more than an optimizer step's samples
    seq_tokens: int
    max_tokens: int | None = None  # batch.train_micro_batch_tokens
    checkpointing: bool = False  # trainer.activation_checkpointing (the torch trainer's)
    backend: str = "torch"
    critic: bool = False  # PPO: its value model's forward and backward follow the policy's on every cut
    fp32: bool = False  # the torch trainer on a CPU site: it computes in fp32, without autocast (`rlctl.devices`)

    @property
    def rank_tokens(self) -> int:
        """The most padded tokens a data-parallel rank trains in one cut, at any dp: its share of a cut holds at most
        `rows` rows and `max_tokens` padded tokens (a longer row alone; `rlctl.rl.cuts.cut_lengths`, the budgets
        being a rank's), over every longest row L ≤ seq_tokens (a share of L-long rows holds max_tokens // L)."""
        lengths = {self.seq_tokens}
        if self.max_tokens is not None:
            lengths |= {
                self.max_tokens // r for r in range(1, self.rows + 1) if 0 < self.max_tokens // r <= self.seq_tokens
            }
        best = 0
        for length in lengths:
            rows = self.rows if self.max_tokens is None else max(1, min(self.rows, self.max_tokens // length))
            best = max(best, rows * length)
        return best

    def rank_bytes(self, *, tp: int = 1, pp: int = 1, fsdp: bool = False) -> float:
        """A rank's peak activation memory at tp × pp, whatever its dp (`fsdp`: the torch trainer shards with FSDP2):
        the policy's (`activation_bytes`), or with PPO's `critic` the larger of it and the critic's
        (`critic_activation_bytes`): `rlctl.rl.ppo.PpoLearner.step` runs the policy's backward, freeing its
        activations, before the critic's forward, so the two are never held together."""
        torch_trainer = self.backend == "torch"

        def peak(price: Callable[..., float]) -> float:
            return price(
                self.arch,
                tokens=self.rank_tokens,
                seq_tokens=self.seq_tokens,
                checkpointing=self.checkpointing and torch_trainer,
                weight_copies=torch_trainer and not fsdp and not self.fp32,
                tp=tp,
                pp=pp,
                fp32=self.fp32 and torch_trainer,
            )

        policy = peak(activation_bytes)
        return max(policy, peak(critic_activation_bytes)) if self.critic else policy


def job_activations(spec: JobFile, arch: ModelArch, *, mini_batches: int = 1, cpu: bool = False) -> Activations | None:
    """The `Activations` of job `spec` training `arch`: its cuts (batch.train_micro_batch_samples, no more than an
    optimizer step's samples, one of `mini_batches` a pass; batch.train_micro_batch_tokens) of rows up to its
    task's longest prompt + output, its trainer's backend and checkpointing, PPO's critic, and on a CPU site (`cpu`)
    the torch trainer's fp32. None for a digits task past the alphabet, which has no longest row (`rlctl check`
    refuses it: `context_problems`)."""
    from rlctl.config.task import DigitsTask
    from rlctl.planner.context import longest_request
    from rlctl.rl.tasks import MAX_DIGITS

    task, batch = spec.task, spec.batch
    if isinstance(task, DigitsTask) and max(task.num_digits_min, task.num_digits_max) > MAX_DIGITS:
        return None
    step_samples = math.ceil(batch.samples_per_iteration / mini_batches)
    return Activations(
        arch,
        rows=max(1, min(batch.train_micro_batch_samples, step_samples)),
        seq_tokens=sum(longest_request(task)),
        max_tokens=batch.train_micro_batch_tokens,
        checkpointing=spec.trainer.activation_checkpointing,
        backend=spec.trainer.backend,
        critic=spec.algorithm.kind == "ppo",
        fp32=cpu and spec.trainer.backend == "torch",
    )


def layer_bytes_per_token(arch: ModelArch, *, tp: int = 1, fp32: bool = False) -> float:
    """What one layer keeps for its backward, a token (tp dividing the per-head and MLP terms; `fp32`: computed in
    fp32, no autocast)."""
    w = FP32 if fp32 else BF16
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    width = arch.intermediate if arch.token_intermediate is None else arch.token_intermediate
    split = w.head_dim * (q + kv) + w.intermediate * width + LAYER_HEAD_BYTES * arch.heads
    if arch.qk_norm:
        split += w.qk_norm_head_dim * (q + kv) + QK_NORM_HEAD_BYTES * (arch.heads + arch.kv_heads)
    return w.layer_hidden * arch.hidden + split / tp + LAYER_TOKEN_BYTES + _moe_bytes_per_token(arch, w)


def _moe_bytes_per_token(arch: ModelArch, w: Widths) -> float:
    """What a MoE's sparse layer keeps beyond its MLP's width, a token (not divided by tp: hidden-width figures)."""
    if arch.token_intermediate is None:
        return 0.0
    expert = w.moe_expert_hidden * arch.hidden + w.moe_expert
    routed = (
        expert * arch.experts_per_token + w.moe_hidden * arch.hidden + MOE_ROUTER_BYTES * arch.experts + w.moe_token
    )
    shared = w.moe_shared_hidden * arch.hidden + w.moe_shared_token if arch.shared_expert_intermediate else 0
    return routed + shared


def _layer_bytes(arch: ModelArch, *, tokens: int, seq_tokens: int, tp: int, fp32: bool) -> float:
    # (normed q and k are fp32, the norms' weights being fp32: RoPE computes on the fp32 tables, no bf16 cast)
    rope = 0 if arch.qk_norm else (FP32 if fp32 else BF16).rope_position * seq_tokens * arch.head_dim
    return tokens * layer_bytes_per_token(arch, tp=tp, fp32=fp32) + rope


def _final_bytes(arch: ModelArch, *, tokens: int, fp32: bool) -> float:
    hidden = (FP32 if fp32 else BF16).final_hidden * arch.hidden
    return tokens * (hidden + LOGPROB_BYTES * arch.vocab + LOSS_TOKEN_BYTES)


def _matmul_params(arch: ModelArch) -> float:
    """Every weight but the embedding's (a lookup, not cast), lm_head's among them: with tied embeddings (`params`
    counts the one weight once) lm_head's is the embedding's, and autocast casts it for lm_head."""
    return arch.params if arch.tied else max(arch.params - arch.vocab * arch.hidden, 0.0)


def _held_bytes(
    arch: ModelArch, *, tokens: int, seq_tokens: int, checkpointing: bool, tp: int, pp: int, fp32: bool
) -> float:
    """A stage's ceil(layers / pp) layers' sets (tp dividing their per-head and MLP terms), or with `checkpointing`
    their inputs alone."""
    layers = math.ceil(arch.layers / pp)
    if checkpointing:
        return layers * tokens * CHECKPOINT_HIDDEN_BYTES * arch.hidden
    return layers * _layer_bytes(arch, tokens=tokens, seq_tokens=seq_tokens, tp=tp, fp32=fp32)


def _recomputed_bytes(
    arch: ModelArch, *, tokens: int, seq_tokens: int, weight_copies: bool, tp: int, fp32: bool
) -> float:
    """One layer's set as a checkpointed backward recomputes it, with its weights' bf16 copies (`weight_copies`)."""
    layer = _layer_bytes(arch, tokens=tokens, seq_tokens=seq_tokens, tp=tp, fp32=fp32)
    layer_params = _matmul_params(arch) / arch.layers  # (lm_head's share too: an upper bound)
    return layer + (WEIGHT_COPY_BYTES * layer_params if weight_copies else 0.0)


def saved_bytes(
    arch: ModelArch,
    *,
    tokens: int,
    seq_tokens: int,
    checkpointing: bool,
    weight_copies: bool = True,
    tp: int = 1,
    pp: int = 1,
    fp32: bool = False,
) -> float:
    """The bytes a cut of `tokens` tokens in rows of `seq_tokens` keeps from its forward to its backward on one rank
    (what `saved_tensors_hooks` counts, at tp = pp = 1): its stage's ceil(layers / pp) layers' sets, tp dividing
    their per-head and MLP terms, or with `checkpointing` each layer's input; the final norm's and the
    log-probabilities (whole at any tp and pp: every rank holds the full logits); autocast's bf16 weight copies
    (`weight_copies`: those of every matmul, a tp × pp shard's, or with `checkpointing` lm_head's alone). `fp32`: the
    passes compute in fp32, without autocast (the torch trainer on a CPU; pass `weight_copies` False)."""
    held = _held_bytes(arch, tokens=tokens, seq_tokens=seq_tokens, checkpointing=checkpointing, tp=tp, pp=pp, fp32=fp32)
    copies = arch.vocab * arch.hidden if checkpointing else _matmul_params(arch) / (tp * pp)
    return held + _final_bytes(arch, tokens=tokens, fp32=fp32) + (WEIGHT_COPY_BYTES * copies if weight_copies else 0.0)


def transient_bytes(
    arch: ModelArch,
    *,
    tokens: int,
    seq_tokens: int,
    checkpointing: bool,
    weight_copies: bool,
    tp: int = 1,
    fp32: bool = False,
) -> float:
    """What the backward of a cut of `tokens` tokens holds beside the forward's saved set at its peak, at its start:
    the log-softmax's two fp32 [tokens, V] gradients; with `checkpointing`, or one layer's recomputed set (with its
    weights' bf16 copies, `weight_copies`) where that is larger."""
    logits_backward = LOGITS_BACKWARD_BYTES * tokens * arch.vocab
    if not checkpointing:
        return logits_backward
    return max(
        logits_backward,
        _recomputed_bytes(arch, tokens=tokens, seq_tokens=seq_tokens, weight_copies=weight_copies, tp=tp, fp32=fp32),
    )


def activation_bytes(
    arch: ModelArch,
    *,
    tokens: int,
    seq_tokens: int,
    checkpointing: bool,
    weight_copies: bool,
    tp: int = 1,
    pp: int = 1,
    fp32: bool = False,
) -> float:
    """A rank's peak activation memory for a cut of `tokens` tokens (its share) in rows of `seq_tokens`: what its
    forward keeps (`saved_bytes`, the figure tests/unit/profiler/test_actmem.py holds to the measured bytes) plus
    the backward's transient peak (`transient_bytes`). See the module docstring."""
    cut = {"tokens": tokens, "seq_tokens": seq_tokens, "tp": tp}
    saved = saved_bytes(arch, **cut, pp=pp, checkpointing=checkpointing, weight_copies=weight_copies, fp32=fp32)
    return saved + transient_bytes(arch, **cut, checkpointing=checkpointing, weight_copies=weight_copies, fp32=fp32)


def critic_saved_bytes(
    arch: ModelArch,
    *,
    tokens: int,
    seq_tokens: int,
    checkpointing: bool,
    weight_copies: bool = True,
    tp: int = 1,
    pp: int = 1,
    fp32: bool = False,
) -> float:
    """What PPO's critic (`rlctl.rl.ppo.ValueModel` on a copy of the policy's trunk) and its value loss keep from
    forward to backward for a cut, as `saved_bytes` the policy's: the same layers' sets or inputs, the final norm's
    and the value head's figures (no log-probabilities), and autocast's bf16 copies of every matmul weight but
    lm_head's (`weight_copies`, none with `checkpointing`: the value head computes in fp32, outside autocast)."""
    held = _held_bytes(arch, tokens=tokens, seq_tokens=seq_tokens, checkpointing=checkpointing, tp=tp, pp=pp, fp32=fp32)
    final = tokens * (CRITIC_FINAL_HIDDEN_BYTES * arch.hidden + CRITIC_TOKEN_BYTES)
    copies = 0.0 if checkpointing else max(_matmul_params(arch) - arch.vocab * arch.hidden, 0.0) / (tp * pp)
    return held + final + (WEIGHT_COPY_BYTES * copies if weight_copies else 0.0)


def critic_activation_bytes(
    arch: ModelArch,
    *,
    tokens: int,
    seq_tokens: int,
    checkpointing: bool,
    weight_copies: bool,
    tp: int = 1,
    pp: int = 1,
    fp32: bool = False,
) -> float:
    """The critic's peak for a cut: `critic_saved_bytes` and, with `checkpointing`, one layer's recomputed set (no
    V-wide log-softmax, so no other transient of the policy's)."""
    cut = {"tokens": tokens, "seq_tokens": seq_tokens, "tp": tp}
    saved = critic_saved_bytes(arch, **cut, pp=pp, checkpointing=checkpointing, weight_copies=weight_copies, fp32=fp32)
    return saved + (_recomputed_bytes(arch, **cut, weight_copies=weight_copies, fp32=fp32) if checkpointing else 0.0)
