"""GRPO and PPO formulas against values worked out by hand from the published definitions.

GRPO (Shao et al. 2024): A_i = (r_i − mean_group) / std_group, one advantage per sample.
PPO (Schulman et al. 2017): L = −min(r·A, clip(r, 1−ε, 1+ε)·A) per token; GAE (Schulman et al. 2016):
δ_t = r_t + γV_{t+1} − V_t, A_t = δ_t + γλA_{t+1}; returns A_t + V_t.
k3 (Schulman, "Approximating KL divergence"): KL(q ‖ p) ≈ (ρ − 1) − log ρ with ρ = p/q on samples of q.

The policy is `tests.unit.fixed_policy`: fixed logits over 4 tokens with probabilities 0.1, 0.2, 0.3,
0.4, so every log-prob and ratio is a number chosen in the test; the comments carry the arithmetic.
"""

from __future__ import annotations

import math
from typing import Literal, cast

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from rlctl.config.algorithm import TIS_CAP, GrpoAlgorithm, PpoAlgorithm
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl import samples as samples_module
from rlctl.rl.grpo import group_advantages, policy_loss
from rlctl.rl.ppo import PpoLearner, ValueModel, gae
from rlctl.rl.samples import Sample, logprobs_and_entropy, make_batch, token_logprobs
from tests.unit.fixed_policy import FixedPolicy, P, behaviour, fixed
from tests.unit.tiny_models import small_config

# ---------------------------------------------------------------- GRPO advantages


def test_group_advantages_by_hand() -> None:
    # group a: [1, 2, 3, 6], mean 3, deviations [−2, −1, 0, 3], variance (4+1+0+9)/4 = 3.5 (ddof 0),
    # std √3.5 = 1.8708287 → [−1.0690450, −0.5345225, 0, 1.6035675]; ddof 1 would give std 2.1602469
    # group b: [0, 1e-6], mean 5e-7, std 5e-7 → ±5e-7 / (5e-7 + eps 1e-6) = ±1/3: eps is added to the std
    # group c: three equal rewards → 0 (no signal), exactly; group d: a lone sample → 0
    adv = group_advantages(
        [1.0, 2.0, 3.0, 6.0, 0.0, 1e-6, 0.1, 0.1, 0.1, 5.0], ["a", "a", "a", "a", "b", "b", "c", "c", "c", "d"]
    )
    assert adv[:4] == pytest.approx([-1.0690450, -0.5345225, 0.0, 1.6035675], abs=2e-6)
    assert adv[4:6] == pytest.approx([-1 / 3, 1 / 3], abs=1e-9)
    assert adv[6:] == [0.0, 0.0, 0.0, 0.0]  # 0.1 three times: the float mean misses 0.1 by an ulp


def test_group_advantages_interleaved_groups_keep_their_positions() -> None:
    # a: [0, 1] → mean 0.5, std 0.5 → ∓1/(1 + 2e-6); b: [4, 2] → mean 3, std 1 → ±1/(1 + 1e-6)
    adv = group_advantages([0.0, 4.0, 1.0, 2.0], ["a", "b", "a", "b"])
    assert adv == pytest.approx([-1.0, 1.0, 1.0, -1.0], abs=3e-6)


def test_without_the_std_the_advantage_is_the_reward_minus_the_group_mean() -> None:
    # Dr. GRPO (`advantage_std: false`): a = [1, 2, 3, 6] − 3 = [−2, −1, 0, 3]; b = [0, 1e-6] − 5e-7 = ∓5e-7 (the
    # std would have scaled these up to ∓1/3); c: equal → 0
    adv = group_advantages([1.0, 2.0, 3.0, 6.0, 0.0, 1e-6, 0.1, 0.1], list("aaaabbcc"), scale=False)
    assert adv == pytest.approx([-2.0, -1.0, 0.0, 3.0, -5e-7, 5e-7, 0.0, 0.0], abs=1e-12)


# ---------------------------------------------------------------- GRPO clipped surrogate

# ε = 0.2, clip range [0.8, 1.2]; surrogate s = min(r·A, clip(r)·A), loss term −s
#   sample 1, A = +2, prompt [1]:    r = 1.5 → min(3.0, 2.4) = 2.4  clipped (A > 0, r > 1+ε)
#                                   r = 0.5 → min(1.0, 1.6) = 1.0  unclipped (A > 0, r < 1−ε)
#                                   r = 1.1 → min(2.2, 2.2) = 2.2  inside
#   sample 2, A = −1, prompt [1, 2]: r = 1.5 → min(−1.5, −1.2) = −1.5 unclipped (A < 0, r > 1+ε)
#                                   r = 0.5 → min(−0.5, −0.8) = −0.8 clipped (A < 0, r < 1−ε)
#   sample 3, A = +0.5, prompt [1]:  r = 0.95 → min(0.475, 0.475) = 0.475, then 2 padding positions
# Σ −s = −(2.4 + 1.0 + 2.2) − (−1.5 − 0.8) − 0.475 = −5.6 + 2.3 − 0.475 = −3.775 over 6 tokens
#   token mean (the default, `loss_aggregation: token_mean`): −3.775 / 6 = −0.6291667
#   sequence mean (`sequence_mean`): (−5.6/3 + 2.3/2 − 0.475/1) / 3 = −0.3972222
SAMPLES = [
    ([1], [3, 1, 2], [1.5, 0.5, 1.1], 2.0),
    ([1, 2], [3, 1], [1.5, 0.5], -1.0),
    ([1], [2], [0.95], 0.5),
]


def grpo_batch() -> tuple[list[Sample], list[float]]:
    samples = [Sample("g", p, out, behaviour(out, r), 0.0) for p, out, r, _ in SAMPLES]
    return samples, [a for *_, a in SAMPLES]


def test_policy_loss_is_the_token_mean_of_the_clipped_surrogate() -> None:
    samples, adv = grpo_batch()
    loss, m = policy_loss(fixed(), make_batch(samples, adv), clip_eps=0.2)
    assert float(loss.detach()) == pytest.approx(-0.6291667, abs=1e-6)
    assert float(loss.detach()) != pytest.approx(-0.3972222, abs=1e-3)
    assert m["tokens"] == 6 and m["pg_loss_sum"] == pytest.approx(-3.775, abs=1e-5)
    # clip_sum counts ratios outside [1−ε, 1+ε] (1.5, 0.5, 1.5, 0.5), whether or not the min picked the clip
    assert m["clip_sum"] == 4
    # a micro-batch normalises by the whole batch's token count: the same sum over 10 tokens
    loss10, _ = policy_loss(fixed(), make_batch(samples, adv), clip_eps=0.2, normaliser=10)
    assert float(loss10.detach()) == pytest.approx(-3.775 / 10, abs=1e-6)


def test_policy_loss_over_samples_or_a_constant_by_hand() -> None:
    # the SAMPLES above, their sums −5.6 (3 tokens), 2.3 (2), −0.475 (1):
    #   sequence_mean: (−5.6/3 + 2.3/2 − 0.475/1) / 3 = −0.3972222; clipped tokens (2/3 + 2/2 + 0/1) / 3 = 0.5555556
    #   constant at max_output_tokens 4: −3.775 / (3 samples × 4) = −0.3145833 (the whole batch's N, given)
    # dL/dlogit[y] = −(r·A · w / N)(1 − p_y), w = 1/|o_i| under sequence_mean (N = 3 samples):
    #   sample 1 (w 1/3): t1 −(1.0/9)(0.8) = −0.0888889, t2 −(2.2/9)(0.7) = −0.1711111
    #   sample 2 (w 1/2): t1 +(1.5/6)(0.6) = +0.15;  sample 3 (w 1): t0 −(0.475/3)(0.7) = −0.1108333
    samples, adv = grpo_batch()
    policy = fixed((3, 4))
    loss, m = policy_loss(policy, make_batch(samples, adv), clip_eps=0.2, aggregation="sequence_mean")
    assert float(loss.detach()) == pytest.approx(-0.3972222, abs=1e-6)
    assert m["weight_sum"] == pytest.approx(3.0) and m["tokens"] == 6
    assert m["clip_sum"] / m["weight_sum"] == pytest.approx(0.5555556, abs=1e-6)
    loss.backward()
    grad = cast(FixedPolicy, policy).logits.grad
    assert grad is not None
    got = [float(grad[0, 1, 1]), float(grad[0, 2, 2]), float(grad[1, 1, 3]), float(grad[2, 0, 2])]
    assert got == pytest.approx([-0.0888889, -0.1711111, 0.15, -0.1108333], abs=1e-6)
    constant, m = policy_loss(fixed(), make_batch(samples, adv), clip_eps=0.2, aggregation="constant", normaliser=12)
    assert float(constant.detach()) == pytest.approx(-0.3145833, abs=1e-6)
    assert m["weight_sum"] == m["tokens"] == 6 and m["pg_loss_sum"] == pytest.approx(-3.775, abs=1e-5)


def test_clipped_tokens_carry_no_gradient_and_the_others_carry_minus_r_a() -> None:
    # dL/dlogit[y] = −(r·A / 6)·(1 − p_y) for an unclipped token y, 0 for a clipped one
    #   sample 1: t0 clipped → 0; t1 token 1 (p 0.2), r·A = 1.0 → −(1.0/6)(0.8) = −0.1333333
    #             t2 token 2 (p 0.3), r·A = 2.2 → −(2.2/6)(0.7) = −0.2566667
    #   sample 2: t0 is the prompt → 0; t1 token 3 (p 0.4), r·A = −1.5 → +(1.5/6)(0.6) = +0.15; t2 clipped → 0
    #   sample 3: t0 token 2 (p 0.3), r·A = 0.475 → −(0.475/6)(0.7) = −0.0554167; t1, t2 padding → 0
    samples, adv = grpo_batch()
    policy = fixed((3, 4))  # rows × grid positions (rows of 4 tokens → 3 log-prob positions)
    loss, _ = policy_loss(policy, make_batch(samples, adv), clip_eps=0.2)
    loss.backward()
    logits = cast(FixedPolicy, policy).logits
    assert logits.grad is not None
    grad = logits.grad[:, :3]
    target = [[3, 1, 2], [2, 3, 1], [2, 0, 0]]  # the token each position predicts (prompt/pad included)
    got = [[float(grad[i, t, target[i][t]]) for t in range(3)] for i in range(3)]
    want = [[0.0, -0.1333333, -0.2566667], [0.0, 0.15, 0.0], [-0.0554167, 0.0, 0.0]]
    for row, exp in zip(got, want, strict=True):
        assert row == pytest.approx(exp, abs=1e-6)
    assert float(grad[0, 0].abs().max()) == 0 and float(grad[1, 2].abs().max()) == 0  # clipped: all logits
    assert float(grad[1, 0].abs().max()) == 0 and float(grad[2, 1:].abs().max()) == 0  # prompt and padding


# Clip-higher (DAPO, `clip_eps_high`): ε_low 0.2, ε_high 0.6, clip range [0.8, 1.6]; the SAMPLES above:
#   sample 1, A = +2: r = 1.5 → min(3.0, 3.0) = 3.0 now inside; r = 0.5 → 1.0; r = 1.1 → 2.2
#   sample 2, A = −1: r = 1.5 → −1.5; r = 0.5 → min(−0.5, −0.8) = −0.8 still clipped (the low side)
#   sample 3: 0.475.  Σ −s = −6.2 + 2.3 − 0.475 = −4.375; / 6 = −0.7291667; outside the range: 0.5, 0.5 → 2
#   sample 1's first token (3, p 0.4) now carries −(1.5·2/6)(0.6) = −0.3 (0 under the symmetric clip)


def test_clip_higher_lets_a_likelier_token_with_a_positive_advantage_grow_further() -> None:
    samples, adv = grpo_batch()
    policy = fixed((3, 4))
    loss, m = policy_loss(policy, make_batch(samples, adv), clip_eps=0.2, clip_eps_high=0.6)
    assert float(loss.detach()) == pytest.approx(-0.7291667, abs=1e-6)
    assert m["clip_sum"] == 2
    loss.backward()
    grad = cast(FixedPolicy, policy).logits.grad
    assert grad is not None
    assert float(grad[0, 0, 3]) == pytest.approx(-0.3, abs=1e-6)
    assert float(grad[1, 2].abs().max()) == 0  # sample 2's r = 0.5 with A < 0: clipped below, as before


# The policy's entropy: P = [0.1, 0.2, 0.3, 0.4] at every position, H = −Σ p ln p = 0.2302585 + 0.3218876 +
# 0.3611919 + 0.3665163 = 1.2798543 nats, over the 6 output tokens (prompt and padding positions left out):
# 7.6791253. At temperature 2 the logits halve, p ∝ √P = [0.1627005, 0.2300932, 0.2818055, 0.3254009]:
# H = 1.3557521, × 6 = 8.1345124.


@pytest.mark.parametrize(("temperature", "summed"), [(1.0, 7.6791253), (2.0, 8.1345124)])
@pytest.mark.parametrize("chunk", [1 << 24, 5], ids=["whole", "a-position-at-a-time"])
def test_the_entropy_of_the_policy_at_the_sampling_temperature_over_output_tokens(
    temperature: float, summed: float, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(samples_module, "ENTROPY_CHUNK", chunk)  # 5 elements: one position (4 tokens) a piece
    samples, adv = grpo_batch()
    _, m = policy_loss(fixed(), make_batch(samples, adv), clip_eps=0.2, temperature=temperature)
    assert m["entropy_sum"] == pytest.approx(summed, abs=1e-5)


def test_a_token_the_policy_rules_out_adds_nothing_to_the_entropy() -> None:
    # logits log P with token 0 at −inf: p = [0, 0.2, 0.3, 0.4] / 0.9; H = −Σ p ln p over the three others
    logits = torch.log(torch.tensor(P)).clone()
    logits[0] = -math.inf
    q = [x / 0.9 for x in P[1:]]
    want = -sum(x * math.log(x) for x in q)
    _, h = logprobs_and_entropy(FixedPolicy(logits), torch.zeros(1, 3, dtype=torch.long))
    assert h is not None and h[0].tolist() == pytest.approx([want, want], abs=1e-6)


# Off-policy corrections (rlctl.rl.grpo.policy_loss, `off_policy`). One optimizer step per iteration: π_prox
# = π_θ in value, so the ratio to π_prox is 1 and only the behaviour weight w = π_prox / μ (the ratios r of
# SAMPLES) scales each token: pg = −w·A.
#   decoupled (AReaL), no cap: −(1.5 + 0.5 + 1.1)·2 + (1.5 + 0.5)·1 − 0.95·0.5 = −6.2 + 2.0 − 0.475 = −4.675;
#     / 6 tokens = −0.7791667 (the clip's −0.6291667 differs: it zeroes the clipped tokens instead)
#   tis, cap 1.2: w = 1.2, 0.5, 1.1 | 1.2, 0.5 | 0.95: −5.6 + 1.7 − 0.475 = −4.375; / 6 = −0.7291667; 2 capped
#   decoupled, cap 1.2 (AReaL's behav_imp_weight_cap: a token past it is left out, still counted in the 6):
#     w = 0, 0.5, 1.1 | 0, 0.5 | 0.95: −3.2 + 0.5 − 0.475 = −3.175; / 6 = −0.5291667; 2 left out
#   the weights' sum: 6.05 uncapped, 5.45 truncated, 3.05 with the two left out
#   gradient at an output token y: −(w·A / 6)·(1 − p_y); sample 1's first token (3, p 0.4), decoupled:
#     −(1.5·2/6)(0.6) = −0.3; tis: −(1.2·2/6)(0.6) = −0.24; capped decoupled: w = 0, none


@pytest.mark.parametrize(
    ("off_policy", "cap", "value", "capped", "weight_sum", "first_grad"),
    [
        ("decoupled", None, -0.7791667, 0, 6.05, -0.3),
        ("tis", 1.2, -0.7291667, 2, 5.45, -0.24),
        ("decoupled", 1.2, -0.5291667, 2, 3.05, 0.0),
    ],
)
def test_off_policy_corrections_weight_each_token_by_pi_prox_over_mu(
    off_policy: Literal["decoupled", "tis"],
    cap: float | None,
    value: float,
    capped: int,
    weight_sum: float,
    first_grad: float,
) -> None:
    samples, adv = grpo_batch()
    policy = fixed((3, 4))
    loss, m = policy_loss(policy, make_batch(samples, adv), clip_eps=0.2, off_policy=off_policy, is_cap=cap)
    assert float(loss.detach()) == pytest.approx(value, abs=1e-6)
    assert m["is_capped_sum"] == capped and m["clip_sum"] == 0  # the ratio to π_prox is 1: never clipped
    assert m["is_weight_sum"] == pytest.approx(weight_sum, abs=1e-6)
    assert m["kl_sum"] == pytest.approx(0.5813473, abs=1e-6)  # still measured against the behaviour policy
    loss.backward()
    grad = cast(FixedPolicy, policy).logits.grad
    assert grad is not None and float(grad[0, 0, 3]) == pytest.approx(first_grad, abs=1e-6)
    # the reference: Σ −stopgrad(w)·A·(π_θ / stopgrad(π_θ)) over valid tokens / n (value −w·A, gradient
    # −w·A·∇log π_θ), through autograd
    ref_policy = fixed((3, 4))
    batch = make_batch(samples, adv)
    logp = token_logprobs(ref_policy, batch.tokens, 1.0)
    w = torch.exp(logp.detach() - batch.old_logprobs)
    if cap is not None:  # tis truncates a weight past the cap; decoupled leaves its token out
        w = w.clamp(max=cap) if off_policy == "tis" else torch.where(w > cap, torch.zeros_like(w), w)
    one = torch.exp(logp - logp.detach())
    ref = (-(w * batch.advantages * one) * batch.mask.float()).sum() / batch.num_tokens
    assert float(ref.detach()) == pytest.approx(value, abs=1e-6)
    ref.backward()
    ref_grad = cast(FixedPolicy, ref_policy).logits.grad
    assert ref_grad is not None and torch.allclose(grad, ref_grad, atol=1e-7)


def test_on_policy_every_correction_is_the_same_loss() -> None:
    on = [Sample("g", p, out, behaviour(out, [1.0] * len(out)), 0.0) for p, out, _, _ in SAMPLES]
    _, adv = grpo_batch()
    losses = [
        float(policy_loss(fixed(), make_batch(on, adv), clip_eps=0.2, off_policy=k)[0].detach())
        for k in ("clip", "decoupled", "tis")
    ]
    assert losses == pytest.approx([losses[0]] * 3, abs=1e-6)


def test_the_job_file_chooses_the_correction_and_refuses_a_cap_without_a_weight() -> None:
    assert GrpoAlgorithm(kind="grpo").behaviour_cap is None
    assert GrpoAlgorithm(kind="grpo", off_policy="tis").behaviour_cap == TIS_CAP
    assert GrpoAlgorithm(kind="grpo", off_policy="tis", is_cap=3.0).behaviour_cap == 3.0
    assert GrpoAlgorithm(kind="grpo", off_policy="decoupled").behaviour_cap is None
    with pytest.raises(ValidationError, match="is_cap caps the behaviour weight"):
        GrpoAlgorithm(kind="grpo", is_cap=2.0)
    # decoupled leaves out a token past the cap: at a cap ≤ 1 every token π_prox favours over μ (AReaL: > 1)
    assert GrpoAlgorithm(kind="grpo", off_policy="decoupled", is_cap=1.5).behaviour_cap == 1.5
    for cap in (1.0, 0.5):
        with pytest.raises(ValidationError, match="must be > 1"):
            GrpoAlgorithm(kind="grpo", off_policy="decoupled", is_cap=cap)


def test_padding_and_prompt_positions_are_masked_out() -> None:
    samples, adv = grpo_batch()
    batch = make_batch(samples, adv)
    loss, m = policy_loss(fixed(), batch, clip_eps=0.2)
    off = ~batch.mask  # prompt and padding positions: garbage there must change nothing
    batch.old_logprobs[off] = -7.0
    batch.advantages[off] = 11.0
    loss2, m2 = policy_loss(fixed(), batch, clip_eps=0.2)
    assert float(loss2.detach()) == float(loss.detach()) and m2 == m
    loss3, m3 = policy_loss(fixed(), make_batch(samples, adv, pad=3), clip_eps=0.2)
    assert float(loss3.detach()) == float(loss.detach()) and m3 == m


def test_k3_kl_of_the_behaviour_policy_from_the_trained_one() -> None:
    # k3 = (r − 1) − log r:  r 1.5 → 0.5 − 0.4054651 = 0.0945349 (×2);  r 0.5 → −0.5 + 0.6931472 = 0.1931472 (×2)
    #   r 1.1 → 0.1 − 0.0953102 = 0.0046898;  r 0.95 → −0.05 + 0.0512933 = 0.0012933;  Σ = 0.5813473
    # the k1 estimate Σ −log r = 0.5313473 differs by Σ (r − 1) = 0.05
    samples, adv = grpo_batch()
    _, m = policy_loss(fixed(), make_batch(samples, adv), clip_eps=0.2)
    assert m["kl_sum"] == pytest.approx(0.5813473, abs=1e-6)
    assert m["approx_kl_sum"] == pytest.approx(0.5313473, abs=1e-6)
    on = [Sample("g", p, out, behaviour(out, [1.0] * len(out)), 0.0) for p, out, _, _ in SAMPLES]
    _, m = policy_loss(fixed(), make_batch(on, adv), clip_eps=0.2)
    assert abs(m["kl_sum"]) <= 1e-7  # r = 1 up to float32 rounding of the log-probs


def test_k3_kl_to_the_reference_in_the_loss() -> None:
    # on-policy (r = 1), A = 0: only the β·KL term.  θ: tokens 3, 2 at 0.4, 0.3;  ref: 0.8, 0.15
    # d = log ref − log θ = ln 2, ln 0.5;  k3 = e^d − d − 1 = 2 − 0.6931472 − 1 = 0.3068528 and
    # 0.5 + 0.6931472 − 1 = 0.1931472; Σ = 0.5;  loss = β·0.5 / 2 tokens = 0.1·0.25 = 0.025
    s = Sample("g", [1], [3, 2], behaviour([3, 2], [1.0, 1.0]), 0.0, ref_logprobs=[math.log(0.8), math.log(0.15)])
    loss, m = policy_loss(fixed(), make_batch([s], [0.0]), clip_eps=0.2, kl_coef=0.1)
    assert m["kl_ref_sum"] == pytest.approx(0.5, abs=1e-6)
    assert float(loss.detach()) == pytest.approx(0.025, abs=1e-7)


# ---------------------------------------------------------------- PPO: GAE, returns, losses


def test_gae_unrolled_by_hand() -> None:
    # γ = 0.9, λ = 0.8, γλ = 0.72; V after a row's last output token is 0
    # row 0: outputs at t = 0..2, rewards [0.1, 0, 1.0], V [0.5, 0.2, −0.1], padding V 9 at t = 3
    #   δ2 = 1.0 + 0.9·0 − (−0.1) = 1.1;  δ1 = 0 + 0.9·(−0.1) − 0.2 = −0.29;  δ0 = 0.1 + 0.9·0.2 − 0.5 = −0.22
    #   A2 = 1.1;  A1 = −0.29 + 0.72·1.1 = 0.502;  A0 = −0.22 + 0.72·0.502 = 0.14144
    #   R = A + V = [0.64144, 0.702, 1.0]
    # row 1: prompt position t = 0 (V 7), outputs at t = 1, 2 with rewards [0, 1.0], V [0.25, 0.5], pad V 3
    #   δ2 = 1.0 − 0.5 = 0.5;  δ1 = 0 + 0.9·0.5 − 0.25 = 0.2;  A2 = 0.5;  A1 = 0.2 + 0.72·0.5 = 0.56
    #   R = [0.81, 1.0]
    rewards = torch.tensor([[0.1, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.2, -0.1, 9.0], [7.0, 0.25, 0.5, 3.0]])
    mask = torch.tensor([[True, True, True, False], [False, True, True, False]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    assert adv[0].tolist() == pytest.approx([0.14144, 0.502, 1.1, 0.0], abs=1e-6)
    assert adv[1].tolist() == pytest.approx([0.0, 0.56, 0.5, 0.0], abs=1e-6)
    assert ret[0, :3].tolist() == pytest.approx([0.64144, 0.702, 1.0], abs=1e-6)
    assert ret[1, 1:3].tolist() == pytest.approx([0.81, 1.0], abs=1e-6)


# PPO batch: γ 0.9, λ 0.8, β (kl_coef) 0.1, ε 0.2, critic V = 0.5 everywhere
#   sample A, outputs [3, 1], ratios [1.5, 0.5], behaviour − ref = [0.5, −1.0], task reward 1
#     token rewards −β·(behaviour − ref) (+ reward on the last): [−0.05, 0.1 + 1.0 = 1.1]
#     δ1 = 1.1 − 0.5 = 0.6;  δ0 = −0.05 + 0.9·0.5 − 0.5 = −0.1;  A = [−0.1 + 0.72·0.6 = 0.332, 0.6];  R = [0.832, 1.1]
#   sample B, output [3], ratio 1.5, behaviour − ref = 0, task reward 0
#     δ0 = 0 − 0.5 = −0.5;  A = [−0.5];  R = [0.0]
#   whitening over the 3 tokens: mean 0.432/3 = 0.144, deviations [0.188, 0.456, −0.644],
#     variance (0.035344 + 0.207936 + 0.414736)/3 = 0.2193387, std 0.4683361
#     → [0.4014203, 0.9736577, −1.3750780]
#   policy loss: min(1.5·0.4014203, 1.2·0.4014203) = 0.4817044;  min(0.5·0.9736577, 0.8·0.9736577) = 0.4868289
#     min(1.5·(−1.3750780), 1.2·(−1.3750780)) = −2.0626170;  loss = −(Σ)/3 = 1.0940837/3 = 0.3646946
#   value loss ½·mean (V − R)²: errors [−0.332, −0.6, 0.5] → ½·(0.110224 + 0.36 + 0.25)/3 = 0.1200373
#   k3 KL: (0.0945349·2 + 0.1931472)/3 = 0.1274057
#   reference KL the rewards penalise (k1, behaviour − ref per token): (0.5 − 1.0 + 0)/3 = −0.1666667


def ppo_setup() -> tuple[PpoLearner, list[Sample]]:
    critic = ValueModel(TinyGPT(small_config()))
    nn.init.constant_(critic.head.bias, 0.5)
    cfg = PpoAlgorithm(kind="ppo", gamma=0.9, lam=0.8, kl_coef=0.1, clip_eps=0.2)
    learner = PpoLearner(fixed(), cfg, critic=critic, ref_model=TinyGPT(small_config()))
    old_a = behaviour([3, 1], [1.5, 0.5])
    old_b = behaviour([3], [1.5])
    a = Sample("p", [1], [3, 1], old_a, 1.0, ref_logprobs=[old_a[0] - 0.5, old_a[1] + 1.0])
    b = Sample("q", [1], [3], old_b, 0.0, ref_logprobs=list(old_b))
    return learner, [a, b]


def test_ppo_advantages_and_returns_by_hand() -> None:
    learner, samples = ppo_setup()
    adv, ret = learner.advantages(samples)
    assert adv[0] == pytest.approx([0.4014203, 0.9736577], abs=2e-6)
    assert adv[1] == pytest.approx([-1.3750780], abs=2e-6)
    assert ret[0] == pytest.approx([0.832, 1.1], abs=1e-6) and ret[1] == pytest.approx([0.0], abs=1e-6)


def test_ppo_step_losses_and_kl_by_hand() -> None:
    learner, samples = ppo_setup()
    m = learner.step(samples)
    assert m["loss"] == pytest.approx(0.3646946, abs=2e-6)
    assert m["value_loss"] == pytest.approx(0.1200373, abs=1e-6)  # unclipped ½(V − R)², token mean
    assert m["kl"] == pytest.approx(0.1274057, abs=1e-6)
    assert m["kl_ref"] == pytest.approx(-0.1666667, abs=1e-6)  # PPO did not report the KL its rewards penalise
    assert m["tokens"] == 3 and m["clip_frac"] == 1.0  # all three ratios are outside [0.8, 1.2]


@pytest.mark.parametrize("off_policy", ["clip", "decoupled", "tis"])
def test_a_token_the_engine_scored_far_less_likely_leaves_the_loss_finite(
    off_policy: Literal["clip", "decoupled", "tis"],
) -> None:
    """Behaviour log-prob −200 for a token the policy gives 0.4: π/μ = e^199 overflows fp32. Unclamped, the loss was
    inf with a negative advantage (NaN gradients: the finite-step guard dropped the whole step); clamped at
    ±MAX_LOG_RATIO it is finite, the rest of the batch keeps its gradient, and so does the reference's KL term."""
    far = [Sample("g", [1], [3, 1], [-200.0, math.log(P[1])], 0.0, ref_logprobs=[0.0, 0.0])]
    policy = fixed((1, 3))
    batch = make_batch(far, [-1.0])
    cap = 2.0 if off_policy == "tis" else None
    loss, m = policy_loss(policy, batch, clip_eps=0.2, kl_coef=0.1, off_policy=off_policy, is_cap=cap)
    assert math.isfinite(float(loss.detach())) and all(math.isfinite(v) for v in m.values()), m
    loss.backward()
    grad = cast(FixedPolicy, policy).logits.grad
    assert grad is not None and bool(torch.isfinite(grad).all())
    assert float(grad[0, 1].abs().max()) > 0  # the second token (ratio 1) still trains
    # the far token: no gradient under clip (the clamp's) nor uncapped decoupled (left out, not weighted e^20:
    # after clip_grad_norm_ it would steer the whole step); under tis the cap weighs it as any capped token
    policy = fixed((1, 3))
    loss, m = policy_loss(policy, batch, clip_eps=0.2, off_policy=off_policy, is_cap=cap)  # no KL term's gradient
    loss.backward()
    grad = cast(FixedPolicy, policy).logits.grad
    assert grad is not None
    far_grad = float(grad[0, 0].abs().max())
    assert (far_grad > 0) == (off_policy == "tis"), far_grad
    assert m["is_capped_sum"] == (0 if off_policy == "clip" else 1)
