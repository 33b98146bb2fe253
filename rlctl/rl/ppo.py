"""PPO with a critic: a value model on a copy of the policy's trunk, GAE over output tokens, PPO-clip policy loss.

    token rewards  r_t = −β·(logp_behaviour − logp_ref)_t  (+ the task reward on the last token)
    GAE            δ_t = r_t + γ·V_{t+1} − V_t ;  A_t = δ_t + γλ·A_{t+1}   (V after the last token = 0)
    returns        R_t = A_t + V_t ;  advantages whitened over the batch's tokens
    losses         policy: PPO-clip on A_t (grpo.policy_loss, averaged as `algorithm.loss_aggregation` says: over the
                   batch's tokens, its samples' token means, or samples × max_output_tokens) ; critic: ½·(V_θ − R)²
                   token mean (whatever the aggregation)
    reported       kl_ref = mean over the batch's tokens (sequence_mean: of the samples' token means) of
                   (logp_behaviour − logp_ref)_t: the k1 KL that β multiplies in the rewards (a per-batch estimate:
                   it can read slightly below 0)

V_t is the critic's value of the state *before* output token t, i.e. the hidden state at the
position whose logits predict token t (the same grid as the log-probs).

The critic's trunk is the trainer backend's (`TrainerBackend.critic_trunk`: TinyGPT without its lm_head for `torch`,
`rlctl.trainers.critic`; a second megatron GPTModel of the same shard without its output layer for `megatron`): the
critic holds no vocab × hidden head, as it computes no logits. The value head is whole on every rank, but where
the torch backend shards the policy with FSDP2: there the critic, value head included, is sharded as the policy on
the same mesh (`TrainerBackend.shard_critic`), FSDP2 sums both models' gradients (once a step where the policy's are,
`DataParallel.reduce_per_step`), and a rank without a row in a cut runs one of another rank's with weight 0 (its
passes are collectives). Parallel as the streaming GRPO learner (`rlctl.rl.learner`): every rank gets the whole
batch; the ranks of one tp × pp group share a data-parallel rank and compute the same share (a run of each
micro-batch's length order, `rlctl.rl.cuts.share_rows`), GAE's inputs (reference log-probs, values) included; the
shares' advantages are gathered over the data-parallel group before they are whitened, gradients are summed over
it, and each model is clipped by the backend's norm over every shard.

    every rank: ref log-probs, values, GAE of its share ─▶ all-gather (dp) ─▶ whiten over the whole batch
                ─▶ policy + critic forward/backward on its share ─▶ all-reduce grads (dp) ─▶ clip ─▶ AdamW × 2
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from rlctl.config.algorithm import PpoAlgorithm
from rlctl.devices import sync
from rlctl.models.moeloss import balanced
from rlctl.rl.cuts import share_slice
from rlctl.rl.gradsum import sum_gradients
from rlctl.rl.grpo import (
    Counts,
    loss_normaliser,
    needs_max_output_tokens,
    policy_loss,
    token_weights,
    weighted_means,
)
from rlctl.rl.samples import (
    Sample,
    device_of,
    fill_ref_logprobs,
    make_batch,
    micro_batches,
    release_gathered,
    row_tokens,
)
from rlctl.rl.schedule import StepLr, finite_step, policy_optimizer, set_lr
from rlctl.trainers.base import DataParallel, Trunk, clip_whole, whole_replicas
from rlctl.trainers.critic import headless_copy
from rlctl.trainers.wire import all_gather_values

_SUMMED = (
    "pg_loss_sum",
    "clip_sum",
    "approx_kl_sum",
    "kl_sum",
    "kl_ref_sum",
    "tokens",
    "value_loss",
    "entropy_sum",
    "is_weight_sum",
    "is_capped_sum",
    "weight_sum",
    "router_aux_sum",
    "aux_loss_sum",
)  # what step() reports


class ValueModel(nn.Module):
    """A trunk with a scalar head (zero at the start, so every value starts at 0). The trunk is used as given:
    pass a copy of the policy's without its output layer (`TrainerBackend.critic_trunk`; common practice is to start
    from the policy): `forward` reads its `hidden` states alone, never logits."""

    def __init__(self, trunk: Trunk) -> None:
        super().__init__()
        assert isinstance(trunk, nn.Module), type(trunk)
        self.body = trunk
        self.head = nn.Linear(trunk.config.hidden_size, 1, device=device_of(trunk))
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Values [N, T-1] on the log-prob grid (position t values the state before tokens[:, t+1])."""
        # (a copy, not a view of the head's output: an in-place op on a sharded module's view output would skip
        # FSDP2's pre-backward hook, and FSDP2 warns of one)
        out: torch.Tensor = self.head(self.body.hidden(tokens)[:, :-1])[..., 0].clone()
        return out


def value_loss(
    critic: nn.Module, tokens: torch.Tensor, mask: torch.Tensor, returns: torch.Tensor, *, total: int
) -> torch.Tensor:
    """The critic's loss on a cut: ½·(V_θ − R)² over its output tokens (`mask`, on the log-prob grid), summed and
    divided by the batch's `total` output tokens (the token mean over the batch, its cuts' summed)."""
    v_err = (critic(tokens).float() - returns) * mask
    return 0.5 * v_err.pow(2).sum() / total


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns [N, L] for right-padded rows whose valid tokens form one run per row."""
    m = mask.float()
    v = values * m
    adv = torch.zeros_like(v)
    last = v.new_zeros(v.shape[0])
    for t in range(v.shape[1] - 1, -1, -1):
        nxt = v[:, t + 1] if t + 1 < v.shape[1] else v.new_zeros(v.shape[0])
        delta = rewards[:, t] + gamma * nxt - v[:, t]
        last = (delta + gamma * lam * last) * m[:, t]
        adv[:, t] = last
    return adv, adv + v


class PpoLearner:
    def __init__(
        self,
        model: nn.Module,  # a trainer backend's policy: tokens → logits (rlctl.trainers)
        cfg: PpoAlgorithm,
        *,
        critic: ValueModel | None = None,  # default: on a copy of `model` (a TinyGPT) without its lm_head
        ref_model: nn.Module | None = None,
        micro_batch_samples: int = 32,
        micro_batch_tokens: int | None = None,
        pad: int = 0,
        data_parallel: DataParallel | None = None,  # default: every rank of the default group a replica
        clip_grad_norm_: Callable[[nn.Module, float], float] = clip_whole,  # (policy or critic, max norm) → norm
        iterations: int | None = None,  # the job's: where `lr_decay` ends
        max_output_tokens: int | None = None,  # the job's task's: loss_aggregation 'constant' divides by it
    ) -> None:
        if cfg.kl_coef > 0 and ref_model is None:
            raise ValueError("kl_coef > 0 needs a reference model")
        needs_max_output_tokens(cfg.loss_aggregation, max_output_tokens)
        self.model, self.cfg, self.ref_model = model, cfg, ref_model
        self.max_output_tokens = max_output_tokens
        self.critic = critic if critic is not None else ValueModel(headless_copy(model))  # type: ignore[arg-type]
        self.micro_batch_samples, self.micro_batch_tokens = micro_batch_samples, micro_batch_tokens
        self.pad = pad
        self.dp = data_parallel or whole_replicas()
        self._clip = clip_grad_norm_
        self.opt = policy_optimizer(model, cfg.lr, weight_decay=cfg.weight_decay)
        self.critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=cfg.critic_lr, weight_decay=0.0)
        self.schedule = StepLr.of(cfg, iterations=iterations)
        self.steps = 0  # optimizer steps taken: the version the weights are at

    def _cuts(self, samples: list[Sample]) -> list[tuple[list[int], float]]:
        """This data-parallel rank's rows of each micro-batch (similar lengths: little padding) and their weight (1).
        A cut without a row of this rank's is dropped, but sharded (FSDP2: every forward and backward a collective):
        there the rank runs the cut's first row with weight 0, as the streaming learner's `backward_share`."""
        cuts = micro_batches(samples, self.micro_batch_samples, max_tokens=self.micro_batch_tokens, ranks=self.dp.size)
        out = []
        for idx in cuts:
            tokens = [row_tokens(samples[i]) for i in idx]
            size, budget = self.micro_batch_samples, self.micro_batch_tokens
            if mine := idx[share_slice(tokens, size, max_tokens=budget, ranks=self.dp.size, rank=self.dp.rank)]:
                out.append((mine, 1.0))
            elif self.dp.sharded and idx:
                out.append((idx[:1], 0.0))
        return out

    @torch.no_grad()
    def advantages(self, samples: list[Sample]) -> tuple[list[list[float]], list[list[float]]]:
        """Per-token (advantages, returns) of each sample, advantages whitened over all tokens."""
        if not samples:  # (every rank has the whole batch: all return here, none waits in the gather below)
            return [], []
        adv: list[torch.Tensor] = [torch.zeros(0)] * len(samples)
        ret: list[list[float]] = [[] for _ in samples]
        cuts = self._cuts(samples)
        dev = device_of(self.critic)
        for idx, weight in cuts:
            part = [samples[i] for i in idx]
            if self.cfg.kl_coef > 0:  # one cut at a time, as the critic: the micro-batch bounds the reference's forward
                fill_ref_logprobs(self.ref_model, part, temperature=self.cfg.temperature, pad=self.pad)
            # the rewards and GAE's backward scan on the host: the scan is a few small ops a token, launches and
            # latencies on a GPU; only the critic's forward runs on its device, its values read back once a cut
            batch = make_batch(part, [0.0] * len(part), pad=self.pad)
            mask = batch.mask
            rewards = torch.zeros(mask.shape)
            if self.cfg.kl_coef > 0 and batch.ref_logprobs is not None:
                rewards -= self.cfg.kl_coef * (batch.old_logprobs - batch.ref_logprobs) * mask
            last = mask.float().cumsum(1).argmax(1)  # index of each row's last output token
            rewards[torch.arange(len(part)), last] += torch.tensor([s.reward for s in part])
            values = self.critic(batch.tokens.to(dev)).float().cpu()
            a, r = gae(rewards, values, mask, self.cfg.gamma, self.cfg.lam)
            if not weight:  # another rank's row, run for the collectives alone
                continue
            for j, i in enumerate(idx):
                adv[i] = a[j][mask[j]]
                ret[i] = r[j][mask[j]].tolist()
        release_gathered(self.critic)  # (FSDP2: its root gathered until the step's first backward, else)
        if self.dp.size > 1:  # every share's, for the whitening over the whole batch
            share = {i: (adv[i].tolist(), ret[i]) for idx, weight in cuts if weight for i in idx}
            shares = all_gather_values(share, dict[int, tuple[list[float], list[float]]], group=self.dp.group)
            for theirs in shares:
                for i, (a_i, r_i) in theirs.items():
                    adv[i], ret[i] = torch.tensor(a_i), r_i
        flat = torch.cat(adv)
        if not flat.numel():  # every output empty: nothing to whiten
            return [a.tolist() for a in adv], ret
        mean, std = flat.mean(), flat.std(unbiased=False) + 1e-6
        return [((a - mean) / std).tolist() for a in adv], ret

    def step(self, samples: list[Sample]) -> dict[str, float]:
        """One PPO step on the whole batch `samples` (every rank passes the same), this rank training its share. No
        samples: a step with no gradient (the weights stay, the version counts on), as one of empty outputs."""
        t0 = time.monotonic()
        adv, ret = self.advantages(samples)
        counts, agg = Counts.of(samples), self.cfg.loss_aggregation  # the whole batch's: every rank has it
        normaliser = loss_normaliser(agg, counts, max_output_tokens=self.max_output_tokens)
        total = max(counts.tokens, 1)  # the critic's token mean; none: every output empty, a zero gradient
        self.model.train()
        self.critic.train()
        self.opt.zero_grad(set_to_none=True)
        self.critic_opt.zero_grad(set_to_none=True)
        sums: dict[str, float] = defaultdict(float)
        cuts = self._cuts(samples)
        for number, (idx, weight) in enumerate(cuts, 1):
            part = [samples[i] for i in idx]
            batch = make_batch(part, [adv[i] for i in idx], pad=self.pad)
            loss, m = policy_loss(
                self.model,
                batch,
                self.cfg.clip_eps,
                0.0,
                temperature=self.cfg.temperature,
                normaliser=normaliser,
                aggregation=agg,
                off_policy=self.cfg.off_policy,
                is_cap=self.cfg.behaviour_cap,
                clip_eps_high=self.cfg.clip_high,
            )
            if self.dp.reduce_per_step:  # FSDP2 reduces the gradients in the step's last backward alone
                for module in (self.model, self.critic):
                    module.set_requires_gradient_sync(number == len(cuts))  # type: ignore[operator]
            (loss * weight).backward()
            target = make_batch(part, [ret[i] for i in idx], pad=self.pad).advantages.to(device_of(self.critic))
            tokens, mask = batch.tokens.to(target.device), batch.mask.to(target.device)
            v_loss = value_loss(self.critic, tokens, mask, target, total=total)
            (v_loss * weight).backward()
            sums["value_loss"] += weight * float(v_loss.detach()) * total
            for k, v in m.items():
                sums[k] += weight * v
            if self.cfg.kl_coef > 0 and batch.ref_logprobs is not None:  # the rewards' KL (`advantages`): β 0 above
                w = token_weights(batch.mask, agg)
                sums["kl_ref_sum"] += weight * float(((batch.old_logprobs - batch.ref_logprobs) * w).sum())
        if self.dp.size > 1:  # each rank summed the loss of its share: sum the gradients and figures over dp
            for module in (self.model, self.critic) if not self.dp.sharded else ():  # (sharded: FSDP2 summed them)
                sum_gradients(module.parameters(), self.dp.group)  # a share without rows: zeros, still in the sum
            box = torch.tensor([sums[k] for k in _SUMMED], dtype=torch.float64)
            dist.all_reduce(box, group=self.dp.group)
            sums = defaultdict(float, zip(_SUMMED, box.tolist(), strict=True))
        grad_norm = self._clip(self.model, self.cfg.grad_clip)
        critic_norm = self._clip(self.critic, self.cfg.grad_clip)
        factor = self.schedule.at(self.steps)
        skipped = not finite_step(grad_norm, critic_norm, step=self.steps)  # neither steps: they stay a pair
        if not skipped:
            set_lr(self.opt, self.cfg.lr * factor)
            set_lr(self.critic_opt, self.cfg.critic_lr * factor)
            self.opt.step()
            self.critic_opt.step()
        self.model.eval()
        self.critic.eval()
        self.steps += 1
        sync(device_of(self.model))  # its kernels ran: `seconds` counts them
        n = max(sums["tokens"], 1.0)
        mean = max(sums["weight_sum"], 1.0)  # the tokens' weights: their count, or under sequence_mean the samples'
        return {
            "loss": (sums["pg_loss_sum"] + sums["aux_loss_sum"]) / normaliser,  # what the policy's gradient is of
            **({"router_aux_loss": sums["router_aux_sum"] / normaliser} if balanced(self.model) is not None else {}),
            "value_loss": sums["value_loss"] / n,
            "kl_ref": sums["kl_ref_sum"] / mean,  # k1 KL(behaviour ‖ reference) the rewards penalise (kl_coef 0: 0)
            **weighted_means(sums),
            "grad_norm": grad_norm,
            "lr": self.cfg.lr * factor,
            "reward_mean": sum(s.reward for s in samples) / max(len(samples), 1),  # none: 0, as the streaming learner
            "samples": float(len(samples)),
            "tokens": sums["tokens"],
            "seconds": time.monotonic() - t0,
            "skipped": float(skipped),
        }
