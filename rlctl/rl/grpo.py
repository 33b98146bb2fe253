"""GRPO: group-normalised advantages and the PPO-clip policy loss over token log-probs.

    rewards of the samples of one prompt ─▶ A = (r − mean_group) / (std_group + eps)   (std over the group, ddof 0)
    ratio  = exp(logp_θ − logp_behaviour)          behaviour logprobs come from the engine
    loss   = Σ_tokens max(−ratio·A, −clip(ratio, 1±ε)·A) + β·KL_k3(θ ‖ ref)   / #tokens in the batch
    kl     = Σ_tokens (ratio − 1) − log ratio                                   / #tokens in the batch

The token mean is over the whole batch (not per sequence), so long samples are not down-weighted;
micro-batches accumulate gradients with the batch's token count as the common normaliser.
`kl` is the k3 estimate of KL(behaviour ‖ θ) on the behaviour's own samples, from the log-probs the
loss computes anyway: θ is the trainer's policy *before* this step's update, so it measures how far
off-policy the batch was (staleness, engine vs trainer numerics), not how far the update moved.
`GrpoLearner.step(samples)` does one optimizer step on one batch and returns its metrics.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence

import torch
import torch.distributed as dist

from rlctl.config.job import GrpoAlgorithm
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.samples import (
    Sample,
    TokenBatch,
    device_of,
    fill_ref_logprobs,
    make_batch,
    micro_batches,
    token_logprobs,
)


def policy_optimizer(model: torch.nn.Module, lr: float) -> torch.optim.AdamW:
    """The policy's optimizer in every learner: AdamW, no weight decay, β₂ 0.98."""
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))


def group_advantages(rewards: Sequence[float], group_ids: Sequence[str], *, eps: float = 1e-6) -> list[float]:
    """(r − group mean) / (group std + eps); a group whose rewards are all equal gets 0 everywhere.

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
        a = (r - r.mean()) / (r.std(unbiased=False) + eps)
        for i, v in zip(idx, a.tolist(), strict=True):
            out[i] = v
    return out


def policy_loss(
    model: torch.nn.Module,
    batch: TokenBatch,
    clip_eps: float,
    kl_coef: float = 0.0,
    *,
    temperature: float = 1.0,
    num_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip loss (+ k3 KL to the reference when kl_coef > 0), summed over masked tokens / num_tokens.

    The metrics are sums over the batch's valid tokens; `kl_sum` is the k3 KL(behaviour ‖ θ) (no gradient).
    """
    batch = batch.to(device_of(model))
    mask = batch.mask.float()
    n = float(num_tokens if num_tokens is not None else max(batch.num_tokens, 1))
    logp = token_logprobs(model, batch.tokens, temperature)
    log_ratio = (logp - batch.old_logprobs) * mask
    ratio = torch.exp(log_ratio)
    adv = batch.advantages
    pg = torch.maximum(-ratio * adv, -ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    per_token = pg
    kl_sum = 0.0
    if kl_coef > 0:
        if batch.ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs reference logprobs on every sample")
        d = (batch.ref_logprobs - logp) * mask
        kl = torch.exp(d) - d - 1  # k3 estimator of KL(θ ‖ ref), ≥ 0
        per_token = per_token + kl_coef * kl
        kl_sum = float((kl * mask).sum().detach())
    loss = (per_token * mask).sum() / n
    with torch.no_grad():
        clipped = ((ratio - 1).abs() > clip_eps).float() * mask
        metrics = {
            "pg_loss_sum": float((pg * mask).sum()),
            "kl_ref_sum": kl_sum,
            "clip_sum": float(clipped.sum()),
            "approx_kl_sum": float((-log_ratio * mask).sum()),
            # k3 = (r − 1) − log r ≥ 0; expm1 keeps it exact near r = 1, where it is ~ (log r)² / 2
            "kl_sum": float(((torch.expm1(log_ratio) - log_ratio) * mask).sum()),
            "tokens": float(mask.sum()),
        }
    return loss, metrics


def allreduce_grads(model: torch.nn.Module) -> None:
    """Average gradients over the torch.distributed group, if one is initialised (trainer ranks)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    world = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= world


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
        grad_clip: float = 1.0,
        pad: int = 0,
    ) -> None:
        if cfg.kl_coef > 0 and ref_model is None:
            raise ValueError("kl_coef > 0 needs a reference model")
        self.model, self.cfg, self.ref_model = model, cfg, ref_model
        self.micro_batch_samples, self.micro_batch_tokens = micro_batch_samples, micro_batch_tokens
        self.grad_clip = grad_clip
        self.pad = pad
        self.opt = policy_optimizer(model, cfg.lr)
        self.steps = 0

    def advantages(self, samples: list[Sample]) -> list[float]:
        return group_advantages([s.reward for s in samples], [s.prompt_id for s in samples])

    def step(self, samples: list[Sample]) -> dict[str, float]:
        t0 = time.monotonic()
        if self.cfg.kl_coef > 0:
            fill_ref_logprobs(self.ref_model, samples, temperature=self.cfg.temperature, pad=self.pad)
        adv = self.advantages(samples)
        total_tokens = sum(len(s.output_tokens) for s in samples)
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        sums: dict[str, float] = defaultdict(float)
        for idx in micro_batches(samples, self.micro_batch_samples, max_tokens=self.micro_batch_tokens):
            batch = make_batch([samples[i] for i in idx], [adv[i] for i in idx], pad=self.pad)
            loss, m = policy_loss(
                self.model,
                batch,
                self.cfg.clip_eps,
                self.cfg.kl_coef,
                temperature=self.cfg.temperature,
                num_tokens=total_tokens,
            )
            loss.backward()
            for k, v in m.items():
                sums[k] += v
        allreduce_grads(self.model)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip))
        self.opt.step()
        self.model.eval()
        self.steps += 1
        n = max(sums["tokens"], 1.0)
        rewards = [s.reward for s in samples]
        return {
            "loss": sums["pg_loss_sum"] / n + self.cfg.kl_coef * sums["kl_ref_sum"] / n,
            "kl_ref": sums["kl_ref_sum"] / n,
            "clip_frac": sums["clip_sum"] / n,
            "approx_kl": sums["approx_kl_sum"] / n,
            "kl": sums["kl_sum"] / n,
            "grad_norm": grad_norm,
            "reward_mean": sum(rewards) / len(rewards),
            "samples": float(len(samples)),
            "tokens": sums["tokens"],
            "seconds": time.monotonic() - t0,
        }

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
