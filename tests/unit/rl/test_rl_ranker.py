import numpy as np
import pytest

from rlctl.rl.ranker import LengthRanker, recall_at
from rlctl.rl.tasks import DigitsTask


def test_recall_at_known_numbers() -> None:
    true = [10, 9, 8, 7, 6, 5, 4, 3, 2, 1]
    assert recall_at(true, true, 0.2) == 1.0
    assert recall_at(true[::-1], true, 0.2) == 0.0
    assert recall_at([10, 1, 9, 2, 3, 4, 5, 6, 7, 8], true, 0.2) == 0.5  # picks 0 and 2; truth is 0 and 1
    assert recall_at([1, 2, 3], [3, 2, 1], 0.05) == 0.0  # at least one item
    with pytest.raises(ValueError):
        recall_at([1, 2], [1], 0.2)


def test_ranker_learns_prompt_dependent_lengths() -> None:
    task = DigitsTask()
    rng = np.random.default_rng(0)
    train, test = task.prompts(0, 800), task.prompts(10_000, 1000)
    noisy = lambda ps: [p.target_tokens * rng.lognormal(0, 0.15) for p in ps]  # noqa: E731
    ranker = LengthRanker(66).fit(train, noisy(train))
    true = noisy(test)
    pred = ranker.predict(test)
    assert recall_at(pred, true, 0.2) >= 0.8
    assert recall_at(pred, true, 0.05) >= 0.6
    assert recall_at(rng.permutation(pred), true, 0.2) < 0.4  # a shuffled ranking is much worse


def test_online_refit_follows_recent_lengths() -> None:
    task = DigitsTask()
    ps = task.prompts(0, 300)
    ranker = LengthRanker(66, window=300).fit(ps, [p.target_tokens for p in ps])
    assert ranker.fitted
    ranker.update(ps, [2.0 * p.target_tokens for p in ps])  # the window now holds only the new lengths
    pred = ranker.predict(ps[:50])
    assert np.corrcoef(pred, [2 * p.target_tokens for p in ps[:50]])[0, 1] > 0.99
    assert np.mean(pred) == pytest.approx(np.mean([2 * p.target_tokens for p in ps[:50]]), rel=0.1)


def test_unfitted_ranker_predicts_a_constant() -> None:
    assert LengthRanker(66).predict([[1, 4], [1, 5, 6]]).tolist() == [1.0, 1.0]
