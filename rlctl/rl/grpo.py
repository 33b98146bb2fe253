"""GRPO: group-normalised advantages and the PPO-clip policy loss over token log-probs.

    rewards of the samples of one prompt ─▶ A = (r − mean_group) / (std_group + eps)   (std over the group, ddof 0;
                                                                                  `advantage_std: false`: r − mean)
    ratio  = exp(logp_θ − logp_behaviour)          behaviour logprobs come from the engine
    ℓ_t    = max(−ratio·A, −clip(ratio, 1 − ε, 1 + ε_high)·A) + β·KL_k3(θ ‖ ref)
    loss   = Σ_tokens w_t·ℓ_t / N                  (`algorithm.loss_aggregation`, `token_weights`, `loss_normaliser`)
    kl     = Σ_tokens w_t·((ratio − 1) − log ratio) / Σ_tokens w_t

                    w_t of sample i's tokens    N
    token_mean      1                           the batch's output tokens          (DAPO; the default)
    sequence_mean   1 / |o_i|                   the batch's samples with output    (GRPO's 1/G Σ_i 1/|o_i| Σ_t)
    constant        1                           samples × max_output_tokens        (Dr. GRPO)

A token's weight is its own sample's, and N is the whole batch's (every micro-batch, every data-parallel rank):
micro-batches accumulate their weighted sums with N as the common normaliser, so cutting a batch into
micro-batches or shares of ranks leaves the gradient as it is. Under token_mean long samples are not
down-weighted; under sequence_mean each sample weighs alike whatever its length; constant divides by a number no
length changes.
A Qwen MoE (Qwen3MoE or Qwen2MoE) whose config.json sets `output_router_logits` (`rlctl.models.moeloss.balanced`) adds
to the loss, as Qwen3MoeForCausalLM and Qwen2MoeForCausalLM do, router_aux_loss_coef × its load-balancing loss
(`moeloss.load_balancing_loss`), reported as `router_aux_loss`. Each forward pass (a micro-batch of one rank) computes
it over its rows' real tokens, prompt and output alike: every token the router routed, padding not, as transformers'
attention mask counts them (the experts' balance is over all the tokens they compute on, and the prompt's routing is the
policy's too). A pass weighs in as its share of N (Σ w_t / N over its tokens): one pass over the whole batch adds
transformers' own term, several add the mean of theirs weighed by their tokens' weights. Data-parallel ranks sum their
gradients, so the term is that mean over every rank's passes, each over that rank's rows (as in DDP training with
transformers, whose ranks' terms are averaged: the loss is not linear in the tokens, so it is not the one pass over the
whole batch's). Groups a learner does not run (no signal, `rlctl.rl.learner`) are in N but in no pass: they shrink the
term in proportion. The passes' shares sum to 1 under token_mean and sequence_mean (N is the sum of the weights), but
under constant to the batch's fill ratio, its trained output tokens ÷ (samples × max_output_tokens): the term, and
`router_aux_loss`, is the passes' mean × that ratio (a batch of outputs half as long as the cap adds half the term).
`kl` is the k3 estimate of KL(behaviour ‖ θ) on the behaviour's own samples, from the log-probs the
loss computes anyway: θ is the trainer's policy *before* this step's update, so it measures how far
off-policy the batch was (staleness, engine vs trainer numerics), not how far the update moved.
`GrpoLearner.step(samples)` does one optimizer step on one batch and returns its metrics.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.distributed as dist

from rlctl.config.algorithm import GrpoAlgorithm, LossAggregation, OffPolicy
from rlctl.devices import sync
from rlctl.models.moeloss import balanced, load_balancing_loss
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.gradsum import sum_gradients
from rlctl.rl.samples import (
    Sample,
    TokenBatch,
    device_of,
    fill_ref_logprobs,
    logprobs_of,
    make_batch,
    micro_batches,
)
from rlctl.rl.schedule import StepLr, finite_step, policy_optimizer, set_lr

# |log π − log μ| past this is clamped before exp (e^20 ≈ 4.9e8, finite in fp32 and bf16): a token the engine scored
# far less likely than the trainer does (a numerics mismatch, a stale sample) would otherwise give an infinite ratio,
# an infinite loss and NaN gradients, and the finite-step guard would drop the whole batch's step for it. Clamped,
# that token carries no gradient under `clip` (the clamp's), is left out under `decoupled` (weight 0, not e^20; with
# a cap, as any token past it), and is weighted by the cap under `tis`; the rest of the batch trains.
MAX_LOG_RATIO = 20.0


def group_advantages(
    rewards: Sequence[float], group_ids: Sequence[str], *, eps: float = 1e-6, scale: bool = True
) -> list[float]:
    """(r − group mean) / (group std + eps), or r − group mean without `scale` (Dr. GRPO: a group whose rewards
    barely differ is not scaled up); a group whose rewards are all equal gets 0 everywhere.

    The std has ddof 0. Equal rewards are skipped rather than normalised: their float mean can miss
    the rewards by an ulp (three rewards of 0.1 gave advantages of 1.4e-11, not 0).
    """
    if len(rewards) != len(group_ids):
        raise ValueError("one group id per reward")
    groups: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        groups[g].append(i)
    out = [0.0] * len(rewards)
    for idx in groups.values():
        if len({float(rewards[i]) for i in idx}) == 1:
            continue
        r = torch.tensor([float(rewards[i]) for i in idx], dtype=torch.float64)
        a = r - r.mean()
        if scale:
            a = a / (r.std(unbiased=False) + eps)
        for i, v in zip(idx, a.tolist(), strict=True):
            out[i] = v
    return out


def token_weights(mask: torch.Tensor, aggregation: LossAggregation) -> torch.Tensor:
    """Each grid position's weight in the loss's sum [N, T-1]: 1 on an output token (token_mean, constant), 1/|o_i| on
    sample i's (sequence_mean: a sample's weights sum to 1), 0 elsewhere. A row's weights are its sample's alone, so
    a batch summed in micro-batches weighs every token as the whole batch does."""
    m = mask.float()
    if aggregation != "sequence_mean":
        return m
    return m / m.sum(dim=1, keepdim=True).clamp(min=1.0)


class Counts(NamedTuple):
    """What a batch's loss normaliser counts (`loss_normaliser`)."""

    tokens: int  # output tokens
    sequences: int  # samples with an output token: those with a token mean (sequence_mean's)
    samples: int

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> Counts:
        lengths = [len(s.output_tokens) for s in samples]
        return cls(sum(lengths), sum(1 for n in lengths if n), len(lengths))


def loss_normaliser(aggregation: LossAggregation, counts: Counts, *, max_output_tokens: int | None) -> float:
    """N, what a batch's weighted token sum is divided by: its output tokens (token_mean), its samples with output
    (sequence_mean) or its samples × the task's `max_output_tokens` (constant). At least 1: a batch with nothing to
    count gives a zero gradient, not 0 / 0."""
    if aggregation == "token_mean":
        n = counts.tokens
    elif aggregation == "sequence_mean":
        n = counts.sequences
    else:
        if max_output_tokens is None:
            raise ValueError(_CONSTANT_NEEDS)
        n = counts.samples * max_output_tokens
    return float(max(n, 1))


_CONSTANT_NEEDS = "loss_aggregation 'constant' divides by samples × max_output_tokens: give the task's"

# a step's figures that are means over its tokens' weights (their count, or under sequence_mean the samples'), from
# `policy_loss`'s sums of the same names with `_sum`
WEIGHTED = ("clip", "approx_kl", "kl", "entropy", "is_weight", "is_capped")
_FIGURE = {"clip": "clip_frac", "is_weight": "is_weight_mean", "is_capped": "is_capped_frac"}


def weighted_means(sums: dict[str, float]) -> dict[str, float]:
    """The per-token figures of a batch learner's step (GRPO's, PPO's) from its sums: each over the tokens' weights
    (at least 1: a batch with no token gives 0s); is_weight_mean is π_prox / μ over the tokens trained (clip: 1)."""
    over = max(sums["weight_sum"], 1.0)
    return {_FIGURE.get(k, k): sums[f"{k}_sum"] / over for k in WEIGHTED}


def needs_max_output_tokens(aggregation: LossAggregation, max_output_tokens: int | None) -> None:
    """A learner is refused when it is built, not at its first step, without the task's `max_output_tokens` where
    loss_aggregation 'constant' divides by it."""
    if aggregation == "constant" and max_output_tokens is None:
        raise ValueError(_CONSTANT_NEEDS)


def policy_loss(
    model: torch.nn.Module,
    batch: TokenBatch,
    clip_eps: float,
    kl_coef: float = 0.0,
    *,
    temperature: float = 1.0,
    normaliser: float | None = None,
    aggregation: LossAggregation = "token_mean",
    off_policy: OffPolicy = "clip",
    is_cap: float | None = None,
    clip_eps_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip loss (+ k3 KL to the reference when kl_coef > 0): each output token's term weighed by
    `token_weights(aggregation)`, summed, / `normaliser` (the whole batch's `loss_normaliser`: this batch may be a
    micro-batch or a rank's share; None: this batch's own, its tokens or, under sequence_mean, its samples with
    output; `constant` needs it given). The ratio is clipped to [1 − clip_eps, 1 + clip_eps_high] (default
    clip_eps_high = clip_eps; DAPO raises it so that unlikely tokens with a positive advantage can grow).

    `off_policy` says how samples generated by older weights (the behaviour policy μ, whose per-token logprobs
    the engine reported) are corrected; π_prox is the policy before this iteration's step (the trainer takes one
    optimizer step per iteration, so it is the model being trained, detached):

        clip       ratio π_θ / μ, clipped to 1 ± clip_eps (PPO with μ as the old policy)
        decoupled  AReaL's decoupled PPO: w · PPO-clip of π_θ / π_prox, w = π_prox / μ; with `is_cap` (> 1,
                   AReaL's behav_imp_weight_cap) a token whose π_prox / μ exceeds it is left out, w = 0
        tis        truncated importance sampling: w = min(π_prox / μ, is_cap) · the PPO-clip of π_θ / π_prox

    The two part only past the cap: `decoupled` drops such a token, `tis` keeps it weighed by the cap. Either way
    it stays in the token count the loss divides by (AReaL's normaliser too), and the KL-to-reference term is not
    weighted. With one step per iteration π_θ = π_prox in value, so the ratio to π_prox is 1 and its clip never
    binds: `decoupled` and `tis` weight each token's policy gradient by w.

    Every log-ratio (to μ, to π_prox, to the reference) is clamped to ±MAX_LOG_RATIO before its exp, so one token
    scored far apart by engine and trainer cannot make the loss infinite; uncapped `decoupled` leaves such a token
    out (weight 0, counted in `is_capped_sum`) rather than weigh it e^MAX_LOG_RATIO.

    The metrics are sums over the batch's valid tokens, each token's term weighed as in the loss (`weight_sum`, the
    weights' sum, is what a mean of them divides by; `tokens` counts the tokens unweighed); `kl_sum` is the k3
    KL(behaviour ‖ θ) (no gradient); `is_weight_sum` the behaviour weights' sum and `is_capped_sum` the tokens the
    cap truncated (`tis`) or left out (`decoupled`); `entropy_sum` the policy's next-token entropy at the sampling
    temperature (a policy collapsing onto few answers shows it first); `router_aux_sum` a Qwen MoE's load-balancing
    loss × this batch's weights' sum (its share of the term, as the loss adds it), `aux_loss_sum` it × the coefficient
    (both 0 without one).
    """
    batch = batch.to(device_of(model))
    mask = batch.mask.float()
    w = token_weights(batch.mask, aggregation)
    if normaliser is None:
        assert aggregation != "constant", "loss_aggregation 'constant' divides by the whole batch's normaliser: pass it"
        own = int(batch.mask.any(dim=1).sum()) if aggregation == "sequence_mean" else batch.num_tokens
        normaliser = float(max(own, 1))
    moe = balanced(model)
    logits, routed = model(batch.tokens, router_logits=True) if moe is not None else (model(batch.tokens), ())
    logp, entropy = logprobs_of(logits, batch.tokens, temperature)
    assert entropy is not None
    behaviour = batch.old_logprobs
    weight: torch.Tensor | None = None
    capped: torch.Tensor | None = None
    if off_policy == "clip":
        base = behaviour
    else:
        base = logp.detach()  # π_prox
        log_w = (base - behaviour) * mask
        raw = torch.exp(log_w.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
        if is_cap is None:  # no cap to bound it: a token π_prox and μ score too far apart to weigh is left out
            weight = raw.masked_fill(log_w.abs() > MAX_LOG_RATIO, 0.0)
        elif off_policy == "tis":  # truncated: a token past the cap is weighed by the cap
            weight = raw.clamp(max=is_cap)
        else:  # decoupled, AReaL's behav_imp_weight_cap: a token past the cap is left out, still in the token count
            weight = raw.masked_fill(raw > is_cap, 0.0)
        capped = ((raw > weight) * w).sum()
    log_ratio = ((logp - base) * mask).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    adv = batch.advantages
    high = clip_eps if clip_eps_high is None else clip_eps_high
    pg = torch.maximum(-ratio * adv, -ratio.clamp(1 - clip_eps, 1 + high) * adv)
    if weight is not None:
        pg = weight * pg
    per_token = pg
    kl_ref: torch.Tensor | None = None
    if kl_coef > 0:
        if batch.ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs reference logprobs on every sample")
        d = ((batch.ref_logprobs - logp) * mask).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        kl = torch.exp(d) - d - 1  # k3 estimator of KL(θ ‖ ref), ≥ 0
        per_token = per_token + kl_coef * kl
        kl_ref = (kl * w).sum().detach()
    loss = (per_token * w).sum() / normaliser
    aux = mask.new_zeros(())
    if moe is not None:  # this batch's part of the load-balancing term: its share of the normaliser (module doc)
        real = torch.ones_like(batch.tokens, dtype=torch.bool) if batch.real is None else batch.real
        aux = load_balancing_loss(routed, real, num_experts=moe.num_experts, top_k=moe.num_experts_per_tok)
        loss = loss + moe.router_aux_loss_coef * aux * (w.sum() / normaliser)
    with torch.no_grad():
        to_behaviour = log_ratio if weight is None else ((logp - behaviour) * mask).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        clipped = ((ratio < 1 - clip_eps) | (ratio > 1 + high)).float() * w
        zero = mask.new_zeros(())
        sums = {
            "pg_loss_sum": (pg * w).sum(),
            "kl_ref_sum": zero if kl_ref is None else kl_ref,
            "clip_sum": clipped.sum(),
            "approx_kl_sum": (-to_behaviour * w).sum(),
            # k3 = (r − 1) − log r ≥ 0; expm1 keeps it exact near r = 1, where it is ~ (log r)² / 2
            "kl_sum": ((torch.expm1(to_behaviour) - to_behaviour) * w).sum(),
            "tokens": mask.sum(),
            "weight_sum": w.sum(),
            "is_weight_sum": (weight * w).sum() if weight is not None else w.sum(),
            "is_capped_sum": zero if capped is None else capped,
            "entropy_sum": (entropy * w).sum(),
            "router_aux_sum": aux.detach() * w.sum(),
            "aux_loss_sum": aux.detach() * w.sum() * (0.0 if moe is None else moe.router_aux_loss_coef),
        }
        # one read-back of them all: on a GPU the host waits for the pass once, not once a figure
        metrics = dict(zip(sums, torch.stack([v.float() for v in sums.values()]).tolist(), strict=True))
    return loss, metrics


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def batch_counts(samples: Sequence[Sample]) -> Counts:
    """The whole batch's `Counts`: this rank's samples', summed over the torch.distributed group if one is
    initialised (each rank passes its own samples), so that every rank divides its loss by the same normaliser."""
    counts = Counts.of(samples)
    if not _distributed():
        return counts
    box = torch.tensor(counts, dtype=torch.int64)
    dist.all_reduce(box)
    return Counts(*(int(v) for v in box.tolist()))


def allreduce_grads(model: torch.nn.Module) -> None:
    """Sum gradients over the torch.distributed group, if one is initialised: each rank's loss is its samples'
    share of the whole batch's (`batch_counts`' normaliser), so the sum is the whole batch's gradient."""
    if not _distributed():
        return
    sum_gradients(model.parameters())  # a rank whose samples reach no row of a parameter: zeros, still in the sum


class GrpoLearner:
    """One GRPO optimizer step per call; the trainer agent owns batching, versions and publishing."""

    def __init__(
        self,
        model: TinyGPT,
        cfg: GrpoAlgorithm,
        *,
        ref_model: TinyGPT | None = None,
        micro_batch_samples: int = 32,
        micro_batch_tokens: int | None = None,
        pad: int = 0,
        iterations: int | None = None,  # the job's: where lr_decay ends
        max_output_tokens: int | None = None,  # the job's task's: loss_aggregation 'constant' divides by it
    ) -> None:
        if cfg.kl_coef > 0 and ref_model is None:
            raise ValueError("kl_coef > 0 needs a reference model")
        self.model, self.cfg, self.ref_model = model, cfg, ref_model
        needs_max_output_tokens(cfg.loss_aggregation, max_output_tokens)
        self.max_output_tokens = max_output_tokens
        self.micro_batch_samples, self.micro_batch_tokens = micro_batch_samples, micro_batch_tokens
        self.pad = pad
        self.opt = policy_optimizer(model, cfg.lr, weight_decay=cfg.weight_decay)
        self.schedule = StepLr.of(cfg, iterations=iterations)
        self.steps = 0

    def _cuts(self, samples: list[Sample]) -> list[list[int]]:
        """The micro-batches `step` runs the reference's forward and the policy's forward/backward in."""
        return micro_batches(samples, self.micro_batch_samples, max_tokens=self.micro_batch_tokens)

    def advantages(self, samples: list[Sample]) -> list[float]:
        return group_advantages(
            [s.reward for s in samples], [s.prompt_id for s in samples], scale=self.cfg.advantage_std
        )

    def step(self, samples: list[Sample]) -> dict[str, float]:
        """One GRPO step on `samples` (this rank's). None (a rank given no share of the batch): a step with no
        gradient of its own, still in the sums over the ranks, as one of empty outputs."""
        t0 = time.monotonic()
        adv = self.advantages(samples)
        agg, most = self.cfg.loss_aggregation, self.max_output_tokens
        normaliser = loss_normaliser(agg, batch_counts(samples), max_output_tokens=most)  # the whole batch's
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        sums: dict[str, float] = defaultdict(float)
        for idx in self._cuts(samples):
            part = [samples[i] for i in idx]
            if self.cfg.kl_coef > 0:  # a cut at a time, as the training forward: one over the whole batch held fp32
                # logits of rows × its longest row × vocab (hundreds of GB at scale) where the cuts fit
                fill_ref_logprobs(self.ref_model, part, temperature=self.cfg.temperature, pad=self.pad)
            batch = make_batch(part, [adv[i] for i in idx], pad=self.pad)
            loss, m = policy_loss(
                self.model,
                batch,
                self.cfg.clip_eps,
                self.cfg.kl_coef,
                temperature=self.cfg.temperature,
                off_policy=self.cfg.off_policy,
                is_cap=self.cfg.behaviour_cap,
                clip_eps_high=self.cfg.clip_high,
                normaliser=normaliser,
                aggregation=agg,
            )
            loss.backward()
            for k, v in m.items():
                sums[k] += v
        allreduce_grads(self.model)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip))
        lr = self.cfg.lr * self.schedule.at(self.steps)
        skipped = not finite_step(grad_norm, step=self.steps)
        if not skipped:
            set_lr(self.opt, lr)
            self.opt.step()
        self.model.eval()
        self.steps += 1
        # this rank's figures: its samples' loss over their own normaliser, means over their weights (tokens or samples)
        n = loss_normaliser(agg, Counts.of(samples), max_output_tokens=most)
        rewards = [s.reward for s in samples]
        sync(device_of(self.model))  # its kernels ran: `seconds` counts them
        return {
            "loss": (sums["pg_loss_sum"] + self.cfg.kl_coef * sums["kl_ref_sum"] + sums["aux_loss_sum"]) / n,
            "kl_ref": sums["kl_ref_sum"] / n,
            **({"router_aux_loss": sums["router_aux_sum"] / n} if balanced(self.model) is not None else {}),
            **weighted_means(sums),
            "grad_norm": grad_norm,
            "lr": lr,
            "reward_mean": sum(rewards) / max(len(rewards), 1),  # none: 0, as the streaming learner's
            "samples": float(len(samples)),
            "tokens": sums["tokens"],
            "seconds": time.monotonic() - t0,
            "skipped": float(skipped),
        }
