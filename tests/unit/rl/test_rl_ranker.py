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


def test_features_do_not_grow_with_the_vocabulary() -> None:
    rng = np.random.default_rng(0)
    marker = 150_001  # a token id far beyond any demo vocabulary: how often it occurs sets the length
    prompts = []
    for i in range(400):
        p = rng.integers(0, 151_936, size=int(rng.integers(5, 40))).tolist()
        p[: i % 4] = [marker] * (i % 4)
        prompts.append(p)
    lengths = [10.0 + 40.0 * p.count(marker) + rng.normal(0, 2) for p in prompts]
    ranker = LengthRanker()  # 1024 buckets
    x = ranker.features(prompts)
    assert x.shape == (400, 1026)
    assert (x[:, -2] == [len(p) for p in prompts]).all() and (x[:, -1] == 1).all()
    assert np.abs(x[:, :-2]).sum(axis=1).max() <= 2 * 40  # unigrams + bigrams, each ±1 in one bucket
    ranker.fit(prompts[:300], lengths[:300])
    assert np.corrcoef(ranker.predict(prompts[300:]), lengths[300:])[0, 1] > 0.95


def test_sliding_window_equals_a_fresh_fit_on_its_pairs() -> None:
    task = DigitsTask()
    ps = task.prompts(0, 250)
    lengths = [float(p.target_tokens) * (1 + (i % 3)) for i, p in enumerate(ps)]
    rolling = LengthRanker(128, window=100)
    for i in range(0, 250, 30):  # batches of 30: the window keeps the last 100 pairs
        rolling.update(ps[i : i + 30], lengths[i : i + 30])
    fresh = LengthRanker(128, window=100).fit(ps[150:], lengths[150:])
    np.testing.assert_allclose(rolling.predict(ps[:50]), fresh.predict(ps[:50]), rtol=1e-6)
    assert LengthRanker(128).features([[1, 2, 3]]).tolist() == LengthRanker(128).features([(1, 2, 3)]).tolist()


def test_a_ranker_rebuilt_from_its_history_predicts_the_same() -> None:
    task = DigitsTask()
    ps = task.prompts(0, 200)
    ranker = LengthRanker(66, window=150).fit(ps[:100], [p.target_tokens for p in ps[:100]])
    ranker.update(ps[100:], [1.5 * p.target_tokens for p in ps[100:]])  # some pairs have left the window
    tokens, lengths = ranker.history()
    assert len(tokens) == 150 and tokens[0] == list(ps[50].tokens)
    again = LengthRanker(66, window=150).fit(tokens, lengths)
    np.testing.assert_allclose(again.predict(ps[:20]), ranker.predict(ps[:20]), rtol=1e-6)


def test_the_inverse_kept_by_rank_k_changes_matches_a_fresh_solve_after_many_windows() -> None:
    """200 batches through a 96-pair window (each batch in and, later, out: Woodbury changes past several exact
    recomputations of the inverse) predict what a fresh fit on the window's pairs does."""
    task = DigitsTask()
    ps = task.prompts(0, 16 * 200)
    rng = np.random.default_rng(0)
    lengths = [float(p.target_tokens) * rng.lognormal(0.0, 0.3) for p in ps]
    rolling = LengthRanker(256, window=96)
    for i in range(0, len(ps), 16):
        rolling.update(ps[i : i + 16], lengths[i : i + 16])
    tokens, ys = rolling.history()
    fresh = LengthRanker(256, window=96).fit(tokens, ys)
    probe = task.prompts(10**6, 64)
    np.testing.assert_allclose(rolling.predict(probe), fresh.predict(probe), rtol=1e-6)
