import multiprocessing as mp
import random
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlctl.config.algorithm import GrpoAlgorithm
from rlctl.engines.base import GenResult
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.grpo import GrpoLearner, group_advantages, policy_loss
from rlctl.rl.samples import Sample, make_batch, micro_batches, row_tokens, score, token_logprobs
from tests.unit.gloo_pair import spawned_pair
from tests.unit.rank_end import end_rank
from tests.unit.tiny_models import small_config

SMALL = small_config()


@pytest.fixture
def model() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(SMALL)


def on_policy(model: TinyGPT, prompt: list[int], output: list[int], reward: float, pid: str = "p") -> Sample:
    (lp,) = score(model, [Sample(pid, prompt, output, [0.0] * len(output), reward)])
    return Sample(pid, prompt, output, lp, reward)


def test_group_advantages_known_numbers() -> None:
    adv = group_advantages([1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.2], ["a", "a", "a", "a", "b", "b", "c"])
    assert adv[:4] == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-5)  # mean 0.5, std 0.5 (ddof 0)
    assert adv[4:] == [0.0, 0.0, 0.0]  # no spread → no signal
    adv = group_advantages([3.0, 0.0, 0.0], ["g"] * 3)
    assert adv == pytest.approx([2 / 2**0.5, -1 / 2**0.5, -1 / 2**0.5], abs=1e-5)


def test_policy_loss_on_policy_is_minus_mean_advantage(model: TinyGPT) -> None:
    samples = [on_policy(model, [1, 4, 5], [7, 8, 9], 1.0), on_policy(model, [1, 4], [7], 0.0)]
    batch = make_batch(samples, [2.0, -1.0])
    loss, m = policy_loss(model, batch, clip_eps=0.2)
    assert float(loss.detach()) == pytest.approx((3 * -2.0 + 1 * 1.0) / 4, abs=1e-5)  # ratio 1: −Σ A / #tokens
    assert m["tokens"] == 4 and m["clip_sum"] == 0 and abs(m["approx_kl_sum"]) < 1e-5


def test_clipped_tokens_have_no_gradient(model: TinyGPT) -> None:
    s = on_policy(model, [1, 4], [7, 8], 1.0)
    s.logprobs = [lp - 1.0 for lp in s.logprobs]  # ratio e ≫ 1+ε with A > 0 → clipped
    loss, m = policy_loss(model, make_batch([s], [1.0]), clip_eps=0.2)
    loss.backward()
    assert m["clip_sum"] == 2
    assert all(p.grad is None or float(p.grad.abs().max()) == 0 for p in model.parameters())


def test_kl_term_is_zero_against_itself(model: TinyGPT) -> None:
    s = on_policy(model, [1, 4], [7, 8], 1.0)
    s.ref_logprobs = list(s.logprobs)
    loss, m = policy_loss(model, make_batch([s], [0.0]), clip_eps=0.2, kl_coef=0.5)
    assert m["kl_ref_sum"] == pytest.approx(0.0, abs=1e-6) and float(loss.detach()) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="reference"):
        s.ref_logprobs = None
        policy_loss(model, make_batch([s], [0.0]), clip_eps=0.2, kl_coef=0.5)


def test_learner_step_moves_probability_to_the_better_sample(model: TinyGPT) -> None:
    good, bad = [7, 8, 9], [10, 11, 12]
    learner = GrpoLearner(model, GrpoAlgorithm(kind="grpo", lr=1e-2))
    seq_good = torch.tensor([[1, 4, *good]])
    seq_bad = torch.tensor([[1, 4, *bad]])

    def total(seq: torch.Tensor) -> float:
        with torch.no_grad():
            return float(token_logprobs(model, seq)[0, 1:].sum())

    before = total(seq_good) - total(seq_bad)
    for _ in range(3):
        m = learner.step([on_policy(model, [1, 4], good, 1.0), on_policy(model, [1, 4], bad, 0.0)])
    assert total(seq_good) - total(seq_bad) > before + 0.1
    assert m["reward_mean"] == 0.5 and m["tokens"] == 6 and learner.steps == 3


def test_learner_fills_reference_logprobs(model: TinyGPT) -> None:
    ref = TinyGPT(SMALL)
    learner = GrpoLearner(model, GrpoAlgorithm(kind="grpo", kl_coef=0.1), ref_model=ref)
    s = on_policy(model, [1, 4], [7, 8], 1.0)
    m = learner.step([s, on_policy(model, [1, 4], [9], 0.0)])
    assert s.ref_logprobs is not None and len(s.ref_logprobs) == 2 and m["kl_ref"] > 0
    with pytest.raises(ValueError, match="reference model"):
        GrpoLearner(model, GrpoAlgorithm(kind="grpo", kl_coef=0.1))


def test_sample_from_engine_result() -> None:
    res = GenResult("p3/1", [1, 4], [7, 2], [-0.5, -0.1], 5, "eos", [5])
    s = Sample.from_result(res, prompt_id="p3", reward=0.5)
    assert (s.prompt_id, s.output_tokens, s.logprobs, s.reward, s.version) == ("p3", [7, 2], [-0.5, -0.1], 0.5, 5)
    with pytest.raises(ValueError, match="logprobs"):
        Sample("p", [1], [7, 8], [0.0], 1.0)


def test_a_sample_with_an_empty_prompt_is_refused_in_one_line() -> None:
    # its mask span began at -1 (the grid's last position): make_batch failed on a torch shape error (its log-probs
    # did not fit the span), or, for a one-token output, masked nothing: a token counted in the batch, never trained
    with pytest.raises(ValueError, match=r"sample of p: an empty prompt; its first output token has no position"):
        Sample("p", [], [7], [-0.5], 1.0)


def test_micro_batches_cut_in_length_order_by_rows_and_padded_tokens() -> None:
    g = torch.Generator().manual_seed(3)
    lengths = [int(x) for x in torch.randint(1, 60, (50,), generator=g)] + [200]
    samples = [Sample(f"p{i}", [1, 4, 5], [7] * n, [0.0] * n, 0.0) for i, n in enumerate(lengths)]
    for size, budget in [(8, None), (32, 256), (4, 64)]:
        cuts = micro_batches(samples, size, max_tokens=budget)
        assert sorted(i for c in cuts for i in c) == list(range(len(samples)))
        flat = [row_tokens(samples[i]) for c in cuts for i in c]
        assert flat == sorted(flat)
        for c in cuts:
            padded = len(c) * max(row_tokens(samples[i]) for i in c)
            assert len(c) <= size and (budget is None or padded <= budget or len(c) == 1)
        if budget is not None:
            assert cuts[-1] == [len(samples) - 1]  # the 203-token row is over the budget: alone
    assert [len(c) for c in micro_batches(samples, 8)] == [8] * 6 + [3]  # rows only: the old cut


def _uneven(model: TinyGPT) -> list[Sample]:
    """Two groups: one of 1-token outputs, one of 9-token outputs (the ranks below hold one group each)."""
    rng = random.Random(3)
    out = []
    for pid, n in (("short", 1), ("long", 9)):
        for k in range(4):
            out.append(on_policy(model, [1, 2], [rng.randrange(5, 50) for _ in range(n)], float(k % 2), pid))
    return out


def _grads(model: TinyGPT) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _learner_rank(rank: int, init: str, state: dict[str, torch.Tensor], samples: list[Sample], out: mp.Queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        model = TinyGPT(SMALL)
        model.load_state_dict(state)
        learner = GrpoLearner(model, GrpoAlgorithm(kind="grpo", grad_clip=1e9), micro_batch_samples=2)
        learner.opt.step = lambda *a, **k: None  # type: ignore[method-assign]  # the gradient is what is compared
        learner.step(samples[rank * 4 : (rank + 1) * 4])  # each rank its own group
        if rank == 0:  # as a list: a tensor's storage is shared through a socket this process takes down on exit
            out.put(_grads(model).tolist())
        # both ranks done with the group before either takes it down
        dist.barrier()
    finally:
        dist.destroy_process_group()
    end_rank(out)  # not through finalization: a rank aborted there once, in a full -n 2 unit run (rank_end.py)


@pytest.mark.timeout(120)
def test_two_ranks_with_uneven_tokens_take_the_whole_batch_token_mean(tmp_path: Path) -> None:
    # each rank divided by its own tokens and the gradients were averaged: the 1-token group weighed 9× per token
    torch.manual_seed(0)
    model = TinyGPT(SMALL)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    samples = _uneven(model)
    alone = GrpoLearner(model, GrpoAlgorithm(kind="grpo", grad_clip=1e9), micro_batch_samples=2)
    alone.opt.step = lambda *a, **k: None  # type: ignore[method-assign]
    alone.step(samples)
    [grads] = spawned_pair(_learner_rank, tmp_path / "rendezvous", state, samples, results=1, timeout_s=100)
    two = torch.tensor(grads)
    whole = _grads(model)
    assert float((two - whole).norm() / whole.norm()) < 1e-5


def test_a_batch_of_empty_outputs_takes_a_zero_step_not_nan(model: TinyGPT) -> None:
    before = {k: v.clone() for k, v in model.state_dict().items()}
    samples = [Sample("g", [1, 4], [], [], float(k)) for k in range(4)]
    stats = GrpoLearner(model, GrpoAlgorithm(kind="grpo", weight_decay=0.0), micro_batch_samples=4).step(samples)
    assert stats["grad_norm"] == 0.0 and stats["skipped"] == 0.0 and stats["tokens"] == 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_step_with_no_samples_leaves_the_weights_and_counts_the_version(model: TinyGPT) -> None:
    # reward_mean was 0 / 0 (ZeroDivisionError), versus a step with no gradient: a rank given no share of the batch
    before = {k: v.clone() for k, v in model.state_dict().items()}
    learner = GrpoLearner(model, GrpoAlgorithm(kind="grpo"))
    stats = learner.step([])
    assert stats["samples"] == 0.0 and stats["reward_mean"] == 0.0 and stats["grad_norm"] == 0.0
    assert stats["skipped"] == 0.0 and learner.steps == 1
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
