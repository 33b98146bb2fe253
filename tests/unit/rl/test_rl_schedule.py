"""The policy's optimizer step as the job file sets it (`algorithm`: lr schedule, weight decay, gradient clip): the
rate at each step by hand, the streaming learner stepping at it (and resumed at a version, at that version's),
decay on matrices only, and the clip norm reaching the backend's clip."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from rlctl.config.algorithm import GrpoAlgorithm, PpoAlgorithm
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.learner import StreamingLearner
from rlctl.rl.ppo import PpoLearner
from rlctl.rl.samples import Sample
from rlctl.rl.schedule import StepLr, policy_optimizer
from tests.unit.agents.test_agents_learner_kl import on_policy as sampled
from tests.unit.agents.test_agents_learner_kl import run_iteration
from tests.unit.tiny_models import small_config

SMALL = small_config(positions=48)


def test_the_rate_at_each_step_by_hand() -> None:
    # warm-up 2 of 6 iterations: steps 0, 1 at 1/2, 2/2; then p = (k − 2) / 4 = 0, ¼, ½, ¾
    #   linear to 0.1: 0.1 + 0.9·(1 − p) = 1, 0.775, 0.55, 0.325
    #   cosine to 0.1: 0.1 + 0.9·½(1 + cos πp) = 1, 0.1 + 0.45·(1 + 0.7071068) = 0.8681981, 0.55, 0.2318019
    linear = StepLr(warmup=2, decay="linear", total=6, floor=0.1)
    assert [linear.at(k) for k in range(6)] == pytest.approx([0.5, 1.0, 1.0, 0.775, 0.55, 0.325], abs=1e-12)
    cosine = StepLr(warmup=2, decay="cosine", total=6, floor=0.1)
    assert [cosine.at(k) for k in range(6)] == pytest.approx([0.5, 1.0, 1.0, 0.8681981, 0.55, 0.2318019], abs=1e-7)
    assert [StepLr(warmup=4).at(k) for k in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert StepLr(decay="cosine", total=3).at(10) == 0.0  # past the job's end: the floor
    with pytest.raises(ValueError, match="iteration count"):
        StepLr(decay="linear", total=None)


def test_the_job_file_refuses_a_floor_that_nothing_reads_and_defaults_the_upper_clip() -> None:
    with pytest.raises(ValidationError, match="min_lr_ratio"):
        GrpoAlgorithm(kind="grpo", min_lr_ratio=0.1)
    with pytest.raises(ValidationError, match="min_lr_ratio"):
        PpoAlgorithm(kind="ppo", lr_decay="cosine", min_lr_ratio=1.5)
    assert GrpoAlgorithm(kind="grpo", clip_eps=0.2).clip_high == 0.2
    assert GrpoAlgorithm(kind="grpo", clip_eps=0.2, clip_eps_high=0.28).clip_high == 0.28


def test_the_lower_clip_stays_above_zero_and_the_upper_one_may_be_wider() -> None:
    # the ratio is clipped to [1 − clip_eps, 1 + clip_eps_high]: at clip_eps ≥ 1 the lower clip is ≤ 0 and never
    # binds (it was taken); clip_eps_high may exceed clip_eps (DAPO's clip-higher) and 1, but not be 0
    for eps in (1.0, 1.5):
        with pytest.raises(ValidationError, match="valid 0 < clip_eps < 1"):
            GrpoAlgorithm(kind="grpo", clip_eps=eps)
        with pytest.raises(ValidationError, match="valid 0 < clip_eps < 1"):
            PpoAlgorithm(kind="ppo", clip_eps=eps)
    assert GrpoAlgorithm(kind="grpo", clip_eps=0.99, clip_eps_high=2.0).clip_high == 2.0
    for bad in ({"clip_eps": 0.0}, {"clip_eps_high": 0.0}):
        with pytest.raises(ValidationError, match="greater than 0"):
            GrpoAlgorithm(kind="grpo", **bad)


def on_policy(model: TinyGPT, *, seed: int, equal_rewards: bool = False) -> list[Sample]:
    samples = sampled(model, prompts=3, group=4, seed=seed)
    for s in samples if equal_rewards else []:
        s.reward = 1.0
    return samples


def test_the_learner_steps_at_the_schedule_s_rate_and_resumes_at_its_version() -> None:
    """Four iterations without a break; then two, a restart from the weights and optimizer state, `resume_at(2)`
    and two more: the same rates and the same weights. Without `resume_at` the restart warms up again."""
    cfg = GrpoAlgorithm(kind="grpo", lr=1e-2, lr_warmup_iterations=2, lr_decay="cosine", min_lr_ratio=0.1)
    torch.manual_seed(0)
    base = TinyGPT(SMALL)
    batches = [on_policy(base, seed=s) for s in range(4)]

    def learner_from(state: dict[str, torch.Tensor]) -> StreamingLearner:
        model = TinyGPT(SMALL)
        model.load_state_dict(state)
        return StreamingLearner(model, cfg, group_size=4, micro_batch_samples=6, iterations=4)

    whole = learner_from(base.state_dict())
    rates = [run_iteration(whole, b)["lr"] for b in batches]
    want = [1e-2 * StepLr(2, "cosine", 4, 0.1).at(k) for k in range(4)]
    assert rates == pytest.approx(want, rel=1e-12) and rates == pytest.approx([5e-3, 1e-2, 1e-2, 5.5e-3])
    assert whole.opt.param_groups[0]["lr"] == pytest.approx(5.5e-3)  # what AdamW used

    first = learner_from(base.state_dict())
    for b in batches[:2]:
        run_iteration(first, b)
    resumed = learner_from(first.model.state_dict())
    resumed.opt.load_state_dict(first.opt.state_dict())
    forgot = learner_from(first.model.state_dict())
    forgot.opt.load_state_dict(first.opt.state_dict())
    resumed.resume_at(2)
    assert [run_iteration(resumed, b)["lr"] for b in batches[2:]] == pytest.approx(want[2:], rel=1e-12)
    for name, a in whole.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], a, atol=0, rtol=0, msg=name)
    assert [run_iteration(forgot, b)["lr"] for b in batches[2:]] == pytest.approx([5e-3, 1e-2])  # warmed up again


def test_weight_decay_shrinks_matrices_and_embeddings_only() -> None:
    """Equal rewards in every group: every advantage is 0, so the gradient is 0 and AdamW's step is the decay
    alone — each matrix and embedding times (1 − lr·wd), norm weights (and biases) unchanged."""
    torch.manual_seed(0)
    model = TinyGPT(SMALL)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = GrpoAlgorithm(kind="grpo", lr=1e-2, weight_decay=0.1)
    learner = StreamingLearner(model, cfg, group_size=4, micro_batch_samples=6)
    assert run_iteration(learner, on_policy(model, seed=3, equal_rewards=True))["grad_norm"] == 0.0
    decayed = kept = 0
    for name, p in model.named_parameters():
        if p.ndim >= 2:
            torch.testing.assert_close(p.detach(), before[name] * (1 - 1e-2 * 0.1), msg=name)
            decayed += 1
        else:
            torch.testing.assert_close(p.detach(), before[name], atol=0, rtol=0, msg=name)
            kept += 1
    assert decayed and kept  # both kinds were there (matrices, embeddings; norm weights)
    groups = policy_optimizer(model, 1e-3, weight_decay=0.0).param_groups
    assert len(groups) == 1 and groups[0]["weight_decay"] == 0.0  # without decay: one group, as checkpoints had


def test_the_clip_norm_of_the_job_reaches_the_backend_s_clip() -> None:
    torch.manual_seed(0)
    model = TinyGPT(SMALL)
    seen: list[float] = []

    def clip(max_norm: float) -> float:
        seen.append(max_norm)
        return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))

    cfg = GrpoAlgorithm(kind="grpo", lr=1e-2, grad_clip=0.25)
    learner = StreamingLearner(model, cfg, group_size=4, micro_batch_samples=6, clip_grad_norm_=clip)
    stats = run_iteration(learner, on_policy(model, seed=1))
    assert seen == [0.25] and stats["grad_norm"] > 0.25  # the norm before clipping is what the step reports


def test_ppo_s_critic_follows_the_policy_s_schedule_on_its_own_rate() -> None:
    torch.manual_seed(0)
    model = TinyGPT(SMALL)
    cfg = PpoAlgorithm(kind="ppo", lr=1e-2, critic_lr=1e-3, lr_warmup_iterations=4)
    learner = PpoLearner(model, cfg, micro_batch_samples=6)
    stats = learner.step(on_policy(model, seed=1))
    assert stats["lr"] == pytest.approx(2.5e-3)
    assert learner.critic_opt.param_groups[0]["lr"] == pytest.approx(2.5e-4)
    assert learner.steps == 1 and math.isfinite(stats["loss"])
