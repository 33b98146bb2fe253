"""Workload model: long-tailed output lengths with a per-prompt effect, growth, and a noisy ranker.

Lengths are lognormal: ln L = ln(median) + u_prompt + e_sample with Var(u) + Var(e) = σ², so the
samples of one prompt share its difficulty (what a length ranker can learn). Defaults follow the
StreamRL 20K dataset as PAT measured it (median ≈ 2.75K, σ ≈ 0.885, 10.85 % > 8K, 2.18 % > 16K,
cap 20K); the 5K / 10K datasets are the same lengths scaled by ¼ and ½ (StreamRL §7).

The ranker predicts ln L plus Gaussian noise whose scale is calibrated so that the recall of the
true top-α fraction equals the requested value (StreamRL Table 4: 0.87 at top 20 %).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlctl.config.task import LengthsTask

PROMPT_SHARE = 0.6  # share of Var(ln L) explained by the prompt


@dataclass(frozen=True)
class LengthModel:
    median: float = 2750.0
    sigma: float = 0.885
    cap: int = 20000
    prompt_tokens: int = 512
    growth_per_iteration: float = 0.0

    @classmethod
    def of(cls, task: LengthsTask) -> LengthModel:
        return cls(
            task.median_output_tokens, task.sigma, task.max_output_tokens, task.prompt_tokens, task.growth_per_iteration
        )

    def scaled(self, factor: float) -> LengthModel:
        """The same distribution with every length (median and cap) multiplied by `factor`."""
        return LengthModel(
            self.median * factor,
            self.sigma,
            max(1, round(self.cap * factor)),
            self.prompt_tokens,
            self.growth_per_iteration,
        )

    def at_iteration(self, i: float) -> LengthModel:
        """The lengths of RL iteration `i` as the tasks grow them: median × (1 + growth × i), the cap kept (the
        job's max_output_tokens still ends every generation)."""
        f = 1.0 + self.growth_per_iteration * i
        return LengthModel(self.median * f, self.sigma, self.cap, self.prompt_tokens, 0.0)

    def sample(self, num_prompts: int, samples_per_prompt: int, rng: np.random.Generator) -> np.ndarray:
        """Output lengths, prompt-major (samples of prompt p at p·k … p·k + k − 1), ints in [1, cap]."""
        s_p = self.sigma * np.sqrt(PROMPT_SHARE)
        s_e = self.sigma * np.sqrt(1.0 - PROMPT_SHARE)
        u = rng.normal(0.0, s_p, num_prompts).repeat(samples_per_prompt)
        e = rng.normal(0.0, s_e, num_prompts * samples_per_prompt)
        lengths = np.exp(np.log(self.median) + u + e)
        return np.clip(np.rint(lengths), 1, self.cap).astype(np.int64)

    def quantiles(self, n: int) -> np.ndarray:
        """n deterministic lengths at the mid-quantiles of the (capped) distribution, descending."""
        from statistics import NormalDist

        z = np.array([NormalDist().inv_cdf((i + 0.5) / n) for i in range(n)])
        lengths = np.clip(np.rint(self.median * np.exp(self.sigma * z)), 1, self.cap)
        return np.sort(lengths)[::-1]


def recall_at(pred: np.ndarray, true: np.ndarray, frac: float) -> float:
    """Fraction of the true top-`frac` samples that are also in the predicted top-`frac`."""
    k = max(1, round(frac * len(true)))
    top_true = set(np.argsort(-true, kind="stable")[:k].tolist())
    top_pred = set(np.argsort(-pred, kind="stable")[:k].tolist())
    return len(top_true & top_pred) / k


def noise_for_recall(recall: float, *, sigma: float, frac: float = 0.2, n: int = 4000, seed: int = 0) -> float:
    """Std of log-space noise that gives `recall` of the top-`frac` on lognormal(σ) lengths (bisection)."""
    if recall >= 1.0:
        return 0.0
    rng = np.random.default_rng(seed)
    logs = rng.normal(0.0, sigma, n)
    z = rng.normal(0.0, 1.0, n)
    lo, hi = 0.0, 20.0 * sigma
    for _ in range(40):
        mid = (lo + hi) / 2
        if recall_at(logs + mid * z, logs, frac) > recall:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def predict_lengths(true: np.ndarray, *, noise_sigma: float, rng: np.random.Generator) -> np.ndarray:
    """A ranker's predictions: true length times lognormal noise (only the order is used)."""
    if noise_sigma == 0.0:
        return true.astype(float)
    return np.exp(np.log(np.maximum(true, 1)) + rng.normal(0.0, noise_sigma, len(true)))
