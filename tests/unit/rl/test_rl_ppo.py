import pytest
import torch
from pydantic import ValidationError

from rlctl.config.algorithm import PpoAlgorithm
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.ppo import PpoLearner, ValueModel, gae
from rlctl.rl.samples import Sample, score
from tests.unit.tiny_models import small_config

SMALL = small_config()


def test_gae_known_numbers() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.5, 0.5, 9.0]])
    mask = torch.tensor([[True, True, True, False]])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert adv.tolist() == [[0.5, 0.5, 0.5, 0.0]]  # Monte-Carlo return 1 minus V; padding ignored
    assert ret[0, :3].tolist() == [1.0, 1.0, 1.0]
    adv, _ = gae(rewards, values, mask, gamma=1.0, lam=0.0)  # one-step TD errors
    assert adv.tolist() == [[0.0, 0.0, 0.5, 0.0]]
    adv, _ = gae(rewards, torch.zeros(1, 4), mask, gamma=0.5, lam=1.0)
    assert adv[0, :3].tolist() == pytest.approx([0.25, 0.5, 1.0])
    # the job file takes both ends of λ (0 was refused, though gae computes it)
    assert [PpoAlgorithm(kind="ppo", lam=lam).lam for lam in (0, 1)] == [0, 1]
    with pytest.raises(ValidationError, match="lam"):
        PpoAlgorithm(kind="ppo", lam=-0.1)


def test_value_model_starts_at_zero_on_the_logprob_grid() -> None:
    critic = ValueModel(TinyGPT(SMALL))
    assert torch.equal(critic(torch.tensor([[1, 4, 5, 6]])), torch.zeros(1, 3))


def test_ppo_step_fits_the_critic_and_moves_the_policy() -> None:
    torch.manual_seed(0)
    model = TinyGPT(SMALL)
    learner = PpoLearner(model, PpoAlgorithm(kind="ppo", lr=1e-2, critic_lr=1e-2))

    def sample(output: list[int], reward: float) -> Sample:
        (lp,) = score(model, [Sample("p", [1, 4], output, [0.0] * len(output), reward)])
        return Sample("p", [1, 4], output, lp, reward)

    first = learner.step([sample([7, 8], 1.0), sample([9, 10], 0.0)])
    for _ in range(5):
        last = learner.step([sample([7, 8], 1.0), sample([9, 10], 0.0)])
    assert last["value_loss"] < first["value_loss"]
    good, bad = score(model, [sample([7, 8], 1.0), sample([9, 10], 0.0)])
    assert sum(good) > sum(bad)


def test_a_batch_of_empty_outputs_is_a_zero_step_not_a_skipped_one() -> None:
    # 0 / 0 made the norms NaN: the step was skipped and counted against trainer.skip_nonfinite
    torch.manual_seed(0)
    learner = PpoLearner(TinyGPT(SMALL), PpoAlgorithm(kind="ppo"))
    stats = learner.step([Sample("p", [1, 4], [], [], r) for r in (0.0, 1.0)])
    assert stats["skipped"] == 0.0 and stats["grad_norm"] == 0.0


class _RowsSeen(torch.nn.Module):
    """A reference model that records how many rows each of its forwards takes."""

    def __init__(self, model: TinyGPT) -> None:
        super().__init__()
        self.model = model
        self.rows: list[int] = []

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        self.rows.append(tokens.shape[0])
        out: torch.Tensor = self.model(tokens)
        return out


def test_the_reference_log_probs_are_scored_one_micro_batch_at_a_time() -> None:
    # the whole batch went through the reference model in one forward: [N, T, vocab] fp32 logits of every sample
    # at once (hundreds of GB at published batch sizes), where the micro-batch bounds every other forward
    torch.manual_seed(0)
    ref = _RowsSeen(TinyGPT(SMALL))
    learner = PpoLearner(TinyGPT(SMALL), PpoAlgorithm(kind="ppo", kl_coef=0.1), ref_model=ref, micro_batch_samples=2)
    samples = [Sample("p", [1, 4], [5 + k] * (k + 1), [-1.0] * (k + 1), float(k % 2)) for k in range(5)]
    learner.step(samples)
    assert ref.rows == [2, 2, 1]
    assert all(s.ref_logprobs is not None and len(s.ref_logprobs) == len(s.output_tokens) for s in samples)


def test_an_off_policy_ppo_step_reports_its_behaviour_weights() -> None:
    """`decoupled` / `tis` weigh each token by π_prox / μ: PPO's step left `is_weight_mean` and `is_capped_frac`
    out (GRPO's reported them), so a run could not see how far its samples were off-policy."""
    torch.manual_seed(0)
    model = TinyGPT(SMALL)
    learner = PpoLearner(model, PpoAlgorithm(kind="ppo", off_policy="tis", is_cap=1.5))
    (lp,) = score(model, [Sample("p", [1, 4], [7, 8], [0.0, 0.0], 1.0)])
    behaviour = [lp[0] - 1.0, lp[1]]  # the first token: π / μ = e ≈ 2.7, capped at 1.5; the second: 1
    stats = learner.step([Sample("p", [1, 4], [7, 8], behaviour, 1.0), Sample("p", [1, 4], [9, 10], [-3.0, -3.0], 0.0)])
    assert stats["is_capped_frac"] > 0 and 0 < stats["is_weight_mean"] < 1.5


def test_a_step_with_no_samples_leaves_the_weights_and_counts_the_version() -> None:
    # no samples raised (torch.cat of no advantages; reward_mean 0 / 0), versus a step with no gradient
    torch.manual_seed(0)
    model = TinyGPT(SMALL)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    learner = PpoLearner(model, PpoAlgorithm(kind="ppo"))
    stats = learner.step([])
    assert stats["samples"] == 0.0 and stats["reward_mean"] == 0.0 and stats["grad_norm"] == 0.0
    assert stats["skipped"] == 0.0 and learner.steps == 1
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
