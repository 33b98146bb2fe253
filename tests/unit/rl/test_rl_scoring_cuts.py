"""The learners' no-gradient scoring forwards (the KL reference's log-probs, PPO's critic values) run a micro-batch
at a time, each no larger than the training's cuts (rows and padded-token budget): one forward over the whole batch
holds fp32 logits of rows × its longest row × vocab, hundreds of GB at scale where the cuts fit. Told by models that
record the [rows, tokens] of each forward run without gradient."""

from __future__ import annotations

import random
from typing import Any

import torch

from rlctl.config.algorithm import GrpoAlgorithm, PpoAlgorithm
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.grpo import GrpoLearner
from rlctl.rl.ppo import PpoLearner, ValueModel
from rlctl.rl.samples import Sample, micro_batches, row_tokens, score
from tests.unit.tiny_models import small_config

SMALL = small_config()
ROWS, BUDGET = 4, 24  # the learner's cuts: ≤ 4 rows and ≤ 24 padded tokens (rows × the longest row)


class _ScoringGPT(TinyGPT):
    """A TinyGPT that records the shape of each forward run without gradient (a scoring pass)."""

    def __init__(self) -> None:
        super().__init__(SMALL)
        self.scored: list[tuple[int, int]] = []

    def forward(self, tokens: torch.Tensor, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            self.scored.append((tokens.shape[0], tokens.shape[1]))
        return super().forward(tokens, **kwargs)


class _ScoringCritic(ValueModel):
    def __init__(self) -> None:
        super().__init__(TinyGPT(SMALL))
        self.scored: list[tuple[int, int]] = []

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            self.scored.append((tokens.shape[0], tokens.shape[1]))
        return super().forward(tokens)


def _samples() -> list[Sample]:
    rng = random.Random(0)
    out = []
    for i in range(12):
        n = rng.randint(1, 14)
        output = [rng.randrange(3, SMALL.vocab_size) for _ in range(n)]
        out.append(Sample(f"p{i % 3}", [1, 4, 5][: 1 + i % 3], output, [-1.0] * n, float(i % 2)))
    return out


def _cut_shapes(samples: list[Sample]) -> list[tuple[int, int]]:
    cuts = micro_batches(samples, ROWS, max_tokens=BUDGET)
    assert len(cuts) > 2  # the batch is several cuts: a whole-batch forward would be told apart
    return [(len(idx), max(row_tokens(samples[i]) for i in idx)) for idx in cuts]


def _within_budget(shapes: list[tuple[int, int]]) -> bool:
    return all(rows <= ROWS and (rows * tokens <= BUDGET or rows == 1) for rows, tokens in shapes)


def test_grpo_scores_the_reference_a_cut_at_a_time() -> None:
    """`GrpoLearner.step` scored the reference in one forward over the rank's whole batch (12 rows × 16 tokens)."""
    torch.manual_seed(0)
    ref = _ScoringGPT()
    samples = _samples()
    whole = score(ref, samples)  # the log-probs of the one forward over the whole batch
    ref.scored = []
    learner = GrpoLearner(
        TinyGPT(SMALL),
        GrpoAlgorithm(kind="grpo", kl_coef=0.1),
        ref_model=ref,
        micro_batch_samples=ROWS,
        micro_batch_tokens=BUDGET,
    )
    m = learner.step(samples)
    assert _within_budget(ref.scored), ref.scored
    assert sorted(ref.scored) == sorted(_cut_shapes(samples))  # one forward a cut
    # padding a row to another length moves its log-probs by an ulp or so on the CPU (the attention's blocking)
    for s, lp in zip(samples, whole, strict=True):
        assert s.ref_logprobs is not None
        torch.testing.assert_close(torch.tensor(s.ref_logprobs), torch.tensor(lp), rtol=0, atol=1e-6)
    assert m["kl_ref"] > 0


def test_ppo_scores_the_reference_and_the_critic_a_cut_at_a_time() -> None:
    torch.manual_seed(0)
    ref, critic = _ScoringGPT(), _ScoringCritic()
    samples = _samples()
    learner = PpoLearner(
        TinyGPT(SMALL),
        PpoAlgorithm(kind="ppo", kl_coef=0.1),
        critic=critic,
        ref_model=ref,
        micro_batch_samples=ROWS,
        micro_batch_tokens=BUDGET,
    )
    learner.step(samples)
    cuts = sorted(_cut_shapes(samples))
    assert sorted(ref.scored) == cuts and sorted(critic.scored) == cuts
    assert _within_budget(ref.scored) and _within_budget(critic.scored)
