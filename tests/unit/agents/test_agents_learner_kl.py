"""The trainer's step reports the k3 KL of the sampling policy from the trained one, from the loss's log-probs:
0 on-policy, > 0 once the policy has moved since sampling, the hand value for chosen log-probs, and the
whole iteration's figures (not rank 0's slice) when two gloo ranks share the micro-batches."""

from __future__ import annotations

import copy
import multiprocessing as mp
import random
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlctl.config.algorithm import GrpoAlgorithm
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.grpo import GrpoLearner
from rlctl.rl.learner import StreamingLearner
from rlctl.rl.samples import Sample, score
from tests.unit.fixed_policy import behaviour, fixed
from tests.unit.gloo_pair import spawned_pair
from tests.unit.rank_end import end_rank
from tests.unit.tiny_models import small_config

SMALL = small_config(positions=48)


def on_policy(model: TinyGPT, *, prompts: int, group: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for p in range(prompts):
        prompt = [1, 3 + p, 4]
        for _ in range(group):
            output = [rng.randrange(5, 60) for _ in range(rng.choice([1, 3, 8]))]
            (lp,) = score(model, [Sample(f"p{p}", prompt, output, [0.0] * len(output), 0.0)])
            out.append(Sample(f"p{p}", prompt, output, lp, rng.random()))
    return out


def run_iteration(learner: StreamingLearner, samples: list[Sample]) -> dict[str, float]:
    for s in samples:
        learner.add(s)
        learner.train_ready()
    return learner.step()


def test_kl_is_zero_on_policy_and_positive_once_the_policy_moved() -> None:
    torch.manual_seed(0)
    model = TinyGPT(SMALL)
    samples = on_policy(model, prompts=3, group=4, seed=1)
    learner = StreamingLearner(model, GrpoAlgorithm(kind="grpo", lr=1e-2), group_size=4, micro_batch_samples=5)
    first = run_iteration(learner, samples)
    assert abs(first["kl"]) <= 1e-7  # sampled by the weights being trained
    again = run_iteration(
        learner, [Sample(s.prompt_id, s.prompt_tokens, s.output_tokens, s.logprobs, s.reward) for s in samples]
    )
    assert again["kl"] > 1e-6  # the same samples, one update later: now off-policy


def test_kl_by_hand() -> None:
    # ratios 1.5, 0.5, 1.1 | 1.5, 0.5 | 0.95 → k3 = (r − 1) − log r:
    #   2·0.0945349 + 2·0.1931472 + 0.0046898 + 0.0012933 = 0.5813473 over 6 tokens = 0.0968912
    rows = [([3, 1, 2], [1.5, 0.5, 1.1]), ([3, 1], [1.5, 0.5]), ([2], [0.95])]
    samples = [Sample("g", [1], out, behaviour(out, r), float(i)) for i, (out, r) in enumerate(rows)]
    learner = StreamingLearner(fixed(), GrpoAlgorithm(kind="grpo"), group_size=3, micro_batch_samples=2)
    stats = run_iteration(learner, samples)
    assert stats["kl"] == pytest.approx(0.0968912, abs=1e-6) and stats["tokens"] == 6


def rank_learner(state: dict[str, torch.Tensor], *, micro: int = 4) -> StreamingLearner:
    """One rank's learner of the two-rank tests, on the weights `state` every rank starts from; `micro`: the rows of
    its share of a cut (`batch.train_micro_batch_samples`, a rank's: a cut over the two ranks holds twice as many)."""
    model = TinyGPT(SMALL)
    model.load_state_dict(state)
    return StreamingLearner(model, GrpoAlgorithm(kind="grpo", lr=1e-2), group_size=4, micro_batch_samples=micro)


def _rank(rank: int, init: str, state: dict[str, torch.Tensor], samples: list[Sample], out: mp.Queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        learner = rank_learner(state)
        if rank == 1:
            learner.follow()
        else:
            stats = run_iteration(learner, samples)
            learner.stop_followers()
            out.put(stats)
    finally:
        dist.destroy_process_group()
    end_rank(out)


@pytest.mark.timeout(120)
def test_two_ranks_report_the_whole_iteration(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TinyGPT(SMALL)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    samples = on_policy(model, prompts=3, group=4, seed=2)
    for s in samples:
        s.logprobs = [x - 0.3 for x in s.logprobs]  # off-policy: ratio e^0.3, clipped, k3 = e^0.3 − 1.3
        if s.prompt_id == "p1":
            s.reward = 0.5  # a group without signal: rank 0 runs none of it, and the figures leave its tokens out
    alone = run_iteration(
        StreamingLearner(model, GrpoAlgorithm(kind="grpo", lr=1e-2), group_size=4, micro_batch_samples=4),
        [Sample(s.prompt_id, s.prompt_tokens, s.output_tokens, s.logprobs, s.reward) for s in samples],
    )
    [stats] = spawned_pair(_rank, tmp_path / "rendezvous", state, samples, results=1, timeout_s=100)
    for key in ("loss", "clip_frac", "kl", "entropy", "no_signal_frac"):
        assert stats[key] == pytest.approx(alone[key], rel=1e-5, abs=1e-7), key
    assert alone["no_signal_frac"] == 4 / 12 and alone["entropy"] > 0
    assert alone["kl"] == pytest.approx(0.0498588, abs=1e-5)  # e^0.3 − 1 − 0.3 on every token
    assert alone["clip_frac"] == 1.0


def test_the_reference_kl_and_the_loss_it_adds_are_reported_as_the_whole_batch_learner_does() -> None:
    # the streaming learner's loss left out kl_coef · KL(θ ‖ ref), and kl_ref was not reported
    torch.manual_seed(0)
    model, ref = TinyGPT(SMALL), TinyGPT(SMALL)
    samples = on_policy(model, prompts=3, group=4, seed=4)
    cfg = GrpoAlgorithm(kind="grpo", kl_coef=0.1)
    streamed = run_iteration(
        StreamingLearner(copy.deepcopy(model), cfg, group_size=4, micro_batch_samples=5, ref_model=ref),
        copy.deepcopy(samples),
    )
    whole = GrpoLearner(copy.deepcopy(model), cfg, ref_model=ref, micro_batch_samples=5).step(copy.deepcopy(samples))
    assert streamed["kl_ref"] > 1e-3  # two differently initialised models
    assert streamed["kl_ref"] == pytest.approx(whole["kl_ref"], rel=1e-5)
    assert streamed["loss"] == pytest.approx(whole["loss"], rel=1e-5, abs=1e-7)


def test_the_batch_learner_reports_the_behaviour_weights_as_the_streaming_learner_does() -> None:
    # GrpoLearner.step left is_weight_mean and is_capped_frac out: how many tokens the cap truncated went unseen
    # π / μ = 1.5, 0.5, 1.1 | 3.0, 0.5 | 0.95, truncated at 1.2: 1.2 + 0.5 + 1.1 + 1.2 + 0.5 + 0.95 = 5.45 over 6
    rows = [([3, 1, 2], [1.5, 0.5, 1.1]), ([3, 1], [3.0, 0.5]), ([2], [0.95])]
    samples = [Sample("g", [1], out, behaviour(out, r), float(i)) for i, (out, r) in enumerate(rows)]
    cfg = GrpoAlgorithm(kind="grpo", off_policy="tis", is_cap=1.2)
    streamed = run_iteration(
        StreamingLearner(fixed(), cfg, group_size=3, micro_batch_samples=2), copy.deepcopy(samples)
    )
    whole = GrpoLearner(fixed(), cfg, micro_batch_samples=2).step(copy.deepcopy(samples))
    for stats in (streamed, whole):
        assert stats["is_weight_mean"] == pytest.approx(5.45 / 6, abs=1e-6)
        assert stats["is_capped_frac"] == pytest.approx(2 / 6, abs=1e-6)
