"""The engine's sampler: exact in distribution, batch-independent, O(batch) hashing."""

import math

import pytest
import torch

from rlctl.engines.sampling import sample, uniform


def test_a_rows_token_does_not_depend_on_the_batch() -> None:
    torch.manual_seed(0)
    logits = torch.randn(16, 1000)
    seeds, steps = torch.arange(16) * 7919, torch.arange(16) % 5
    together, lp = sample(logits, seeds, steps, 0.8)
    for i in range(16):
        alone, lpi = sample(logits[i : i + 1], seeds[i : i + 1], steps[i : i + 1], 0.8)
        assert alone.item() == together[i].item() and lpi.item() == lp[i].item()


def test_draws_follow_the_softmax_at_the_temperature() -> None:
    logits = torch.tensor([2.0, 0.5, 0.0, -1.0, -4.0])
    n = 40_000
    tok, lp = sample(logits.expand(n, 5), torch.arange(n) * 104729 + 17, torch.full((n,), 3), 0.7)
    probs = torch.softmax(logits / 0.7, -1)
    freq = torch.bincount(tok, minlength=5).double() / n
    sd = (probs * (1 - probs) / n).sqrt()
    assert ((freq - probs).abs() <= 4.5 * sd + 1e-9).all(), (freq, probs)
    torch.testing.assert_close(lp, torch.log_softmax(logits / 0.7, -1)[tok])


def test_steps_and_seeds_give_independent_uniforms() -> None:
    u = uniform(torch.arange(20_000), torch.zeros(20_000, dtype=torch.long))
    v = uniform(torch.arange(20_000), torch.ones(20_000, dtype=torch.long))
    assert u.dtype == torch.float64 and u.min() > 0 and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(torch.corrcoef(torch.stack([u, v]))[0, 1].item()) < 0.03


def test_greedy_is_the_argmax_with_its_logprob() -> None:
    logits = torch.tensor([[0.1, 3.0, -2.0], [5.0, 1.0, 4.9]])
    tok, lp = sample(logits, torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long), 0.0)
    assert tok.tolist() == [1, 0]
    torch.testing.assert_close(lp, torch.log_softmax(logits, -1)[[0, 1], [1, 0]])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_logits_are_sampled_in_fp32(dtype: torch.dtype) -> None:
    logits = torch.randn(4, 151_936).to(dtype)
    tok, lp = sample(logits, torch.arange(4), torch.zeros(4, dtype=torch.long), 1.0)
    assert tok.dtype == torch.int64 and lp.dtype == torch.float32 and (tok < 151_936).all()
    ref = torch.log_softmax(logits.float(), -1).gather(1, tok[:, None])[:, 0]
    assert torch.allclose(lp, ref, atol=1e-4) and not math.isnan(lp.sum().item())
