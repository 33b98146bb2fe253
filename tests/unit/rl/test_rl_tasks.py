import numpy as np
import pytest

from rlctl.config.task import DigitsTask as DigitsTaskConfig
from rlctl.rl.tasks import BOS, EOS, PAD, VOCAB_SIZE, DigitsTask, answer_for, decode, encode, score


def test_tokenizer_round_trip() -> None:
    text = "90817=aaaaaaaaabcccccccddddddd" + "zA"
    ids = encode(text)
    assert min(ids) >= 3 and max(ids) < VOCAB_SIZE == 66
    assert decode([BOS, *ids, EOS, *encode("abc"), PAD]) == text  # stops at EOS, drops BOS
    with pytest.raises(ValueError, match="not in the demo vocabulary"):
        encode("3+4")


def test_answer_rule() -> None:
    assert answer_for("3172") == "aaabcccccccdd"


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("aaabcccccccdd", 1.0),
        ("aaabccccccdd", 0.75),  # c run too short
        ("aaabcccccccddx", 0.8),  # extra run: 4 right of 5 produced
        ("aab", 0.25),  # (b, 1) is right in place
        ("", 0.0),
        ("aaabcccccccdd" + "d", 0.75),
    ],
)
def test_reward_rule(output: str, expected: float) -> None:
    assert score("aaabcccccccdd", output) == pytest.approx(expected)


def test_reward_from_tokens() -> None:
    task = DigitsTask()
    p = task.prompt(7)
    assert task.reward(p, [*encode(p.answer), EOS]) == 1.0
    assert task.exact(p, [*encode(p.answer), EOS])
    assert not task.exact(p, encode(p.answer))  # no EOS: truncated
    assert task.reward(p, [EOS]) == 0.0


def test_prompts_are_deterministic_and_consistent() -> None:
    task = DigitsTask()
    a, b = task.prompts(0, 300), DigitsTask().prompts(0, 300)
    assert a == b
    assert len({p.prompt_id for p in a}) == 300
    other = DigitsTask(DigitsTaskConfig(kind="digits", seed=1)).prompts(0, 300)
    assert [p.text for p in a] != [p.text for p in other]
    for p in a:
        digits = p.text[:-1]
        assert p.text.endswith("=") and set(digits) <= set("123456789")
        assert len(p.answer) == sum(int(d) for d in digits) == p.target_tokens - 1
        assert p.tokens == [BOS, *encode(p.text)]
        assert p.target_tokens <= task.max_new_tokens and len(p.tokens) <= task.max_prompt_tokens


def test_sample_prompts_follow_the_rng() -> None:
    task = DigitsTask()
    one = task.sample_prompts(5, np.random.default_rng(3))
    assert one == task.sample_prompts(5, np.random.default_rng(3))
    assert one != task.sample_prompts(5, np.random.default_rng(4))
    assert task.prompt(int(one[0].prompt_id[1:])) == one[0]


def test_lengths_are_long_tailed() -> None:
    lengths = np.array([len(p.answer) for p in DigitsTask().prompts(0, 3000)])
    assert 26 <= np.median(lengths) <= 34
    assert 90 <= np.percentile(lengths, 95) <= 135
    top = np.sort(lengths)[::-1][: len(lengths) // 5]
    assert 0.40 <= top.sum() / lengths.sum() <= 0.55  # top 20 % of prompts carry ~47 % of the tokens


def test_cap_and_digit_bounds() -> None:
    cfg = DigitsTaskConfig(kind="digits", max_output_tokens=20, num_digits_min=2, num_digits_max=2)
    task = DigitsTask(cfg)
    for p in task.prompts(0, 200):
        assert len(p.answer) <= 19
        assert len(p.text) - 1 >= 2 or len(p.answer) < 2
