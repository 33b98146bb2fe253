"""The policy's learning rate at each optimizer step, the optimizer it drives, and whether a step may update.

    step k (0-based; it makes version k + 1)   warm-up  k < W:  lr · (k + 1) / W
                                               then     constant: lr
                                                        linear:   lr · (m + (1 − m) · (1 − p))
                                                        cosine:   lr · (m + (1 − m) · ½ (1 + cos π p))
                                               p = (k − W) / (N − W): 0 at the first step after the warm-up,
                                               (N − W − 1) / (N − W) at the job's last (N iterations); m = min_lr_ratio

The first warm-up step already moves the weights (lr / W, where `transformers`' schedules start at 0). The rate is
a function of the step only: a learner resumed at version v takes step v at the rate a run without the break
would have (`StepLr.at`). PPO's critic follows the same factor of its own `critic_lr`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from rlctl.config.algorithm import LrDecay, PolicyUpdate

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepLr:
    """The factor on the base learning rate at each optimizer step."""

    warmup: int = 0
    decay: LrDecay = "constant"
    total: int | None = None  # the job's iterations: where a decay ends
    floor: float = 0.0  # min_lr_ratio

    def __post_init__(self) -> None:
        if self.decay != "constant" and (self.total is None or self.total < 1):
            raise ValueError(f"lr_decay {self.decay!r} needs the job's iteration count")

    @classmethod
    def of(cls, cfg: PolicyUpdate, *, iterations: int | None) -> StepLr:
        return cls(cfg.lr_warmup_iterations, cfg.lr_decay, iterations, cfg.min_lr_ratio or 0.0)

    def at(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        if self.decay == "constant":
            return 1.0
        assert self.total is not None
        p = min((step - self.warmup) / max(self.total - self.warmup, 1), 1.0)
        left = 1.0 - p if self.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * p))
        return self.floor + (1.0 - self.floor) * left


def trained_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters of `model` a step trains: every one, or a LoRA policy's adapters (the rest frozen)."""
    return [p for p in model.parameters() if p.requires_grad]


def policy_optimizer(model: torch.nn.Module, lr: float, *, weight_decay: float = 0.0) -> torch.optim.AdamW:
    """The policy's optimizer in every learner: AdamW, β₂ 0.98, over its trained parameters (`trained_parameters`). With
    weight decay, on the matrices and embeddings only (a second group, without it, holds biases and norm weights);
    without, one group."""
    params = trained_parameters(model)
    if weight_decay == 0:
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    decayed = [p for p in params if p.ndim >= 2]
    kept = [p for p in params if p.ndim < 2]
    groups = [{"params": decayed, "weight_decay": weight_decay}] + (
        [{"params": kept, "weight_decay": 0.0}] if kept else []
    )
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.98))


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def finite_step(*grad_norms: float, step: int) -> bool:
    """Whether optimizer step `step` may update the weights: every gradient norm it clipped is finite. One step from
    a NaN or infinite gradient (an overflow, a sample the loss cannot take) would leave NaN in the weights and in
    AdamW's moments for good, and every later version, sample and checkpoint would carry it; skipped, the
    iteration's samples count as trained and the version is the same weights (`trainer.skip_nonfinite` bounds how
    many in a row the job takes: `ControllerCore.trained`)."""
    if all(math.isfinite(n) for n in grad_norms):
        return True
    log.warning(
        "optimizer step %d skipped: gradient norm %s is not finite; the weights and optimizer state stay as they were",
        step,
        ", ".join(f"{n:g}" for n in grad_norms),
    )
    return False
