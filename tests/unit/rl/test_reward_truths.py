"""The gsm8k, math and exact_match built-ins read a ground truth that is a number (a jsonl or parquet column of ints or
floats) as the text verl's rows hold (42 and 42.0 are "42"), and a row whose ground truth they cannot read (a list for
gsm8k and math, a dict, a bool) is a bad row naming the field, refused by check and by the launch's prepare as other
bad rows are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlctl.config.task import DatasetTask
from rlctl.errors import ConfigError
from rlctl.rl.dataset import prepare_dataset
from rlctl.rl.dataset_scan import check_rows
from rlctl.rl.reward import answer_text, exact_match, gsm8k, math_boxed
from rlctl.rl.reward_pool import RewardPool
from rlctl.rl.tokenizer import HFTokenizer, load_tokenizer
from tests.unit.hf_tokenizer import write_tokenizer
from tests.unit.rl.test_dataset import task, write_jsonl, write_parquet


@pytest.fixture
def tok(tmp_path: Path) -> HFTokenizer:
    return load_tokenizer(write_tokenizer(tmp_path / "model"))


@pytest.mark.parametrize(
    ("ground_truth", "text"),
    [("72", "72"), (42, "42"), (42.0, "42"), (-3, "-3"), (0.5, "0.5"), (1e-05, "0.00001"), (1e20, "1" + "0" * 20)],
)
def test_a_number_is_the_text_verls_rows_hold(ground_truth: object, text: str) -> None:
    assert answer_text(ground_truth) == text


@pytest.mark.parametrize(
    ("output", "ground_truth", "score"),
    [
        ("so 42 in all.\n#### 42", "42", 1.0),
        ("#### 42", 42, 1.0),
        ("#### 42", 42.0, 1.0),  # str(42.0) is "42.0", which '#### 42' never matched
        ("#### 1,000", 1000.0, 1.0),
        ("#### 0.5", 0.5, 1.0),
        ("#### 41", 42.0, 0.0),
        ("#### 42.5", 42.0, 0.0),
    ],
)
def test_the_gsm8k_builtin_takes_a_numeric_ground_truth(output: str, ground_truth: object, score: float) -> None:
    assert gsm8k("openai/gsm8k", output, ground_truth) == score


@pytest.mark.parametrize(
    ("output", "ground_truth", "score"),
    [
        ("\\boxed{42}", "42", 1.0),
        ("\\boxed{42}", 42, 1.0),
        ("\\boxed{42}", 42.0, 1.0),  # str(42.0) is "42.0": scored 0
        ("\\boxed{\\frac{1}{2}}", 0.5, 1.0),
        ("\\boxed{0.25}", 0.25, 1.0),
        ("\\boxed{43}", 42.0, 0.0),
    ],
)
def test_the_math_builtin_takes_a_numeric_ground_truth(output: str, ground_truth: object, score: float) -> None:
    assert math_boxed("lighteval/MATH", output, ground_truth) == score


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
@pytest.mark.parametrize(
    ("reward", "answers", "outputs"),
    [
        ("gsm8k", [42, 7], ["#### 42", "#### 7"]),
        ("gsm8k", [42.0, 0.5], ["#### 42", "#### 0.5"]),
        ("gsm8k", ["42", "7"], ["#### 42", "#### 7"]),
        ("math", [42, 7], ["\\boxed{42}", "\\boxed{7}"]),
        ("math", [42.0, 0.5], ["\\boxed{42}", "\\boxed{\\frac12}"]),
        ("math", ["42", "7"], ["\\boxed{42}", "\\boxed{7}"]),
        ("exact_match", [42.0, 1e-05], ["42", "0.00001"]),
        ("exact_match", [[41, 42.0], [0.5]], ["42", "0.5"]),
    ],
)
def test_a_files_numeric_ground_truths_score_through_the_prepared_rows(
    tmp_path: Path, tok: HFTokenizer, fmt: str, reward: str, answers: list[Any], outputs: list[str]
) -> None:
    rows = [{"prompt": f"question {i}", "ground_truth": a} for i, a in enumerate(answers)]
    path = write_jsonl(tmp_path / "t.jsonl", rows) if fmt == "jsonl" else write_parquet(tmp_path / "t.parquet", rows)
    cfg = task(path=path.name, reward=reward, shuffle=False)
    assert check_rows(cfg, data_path=path, tokenizer=tok).good == 2
    data = prepare_dataset(cfg, data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    with RewardPool(reward, base_dir=tmp_path, workers=0) as pool:
        for i, output in enumerate(outputs):
            p = data.prompt(i)
            assert pool.score(f"s{i}", p.data_source, output, p.ground_truth).score == 1.0
            assert pool.score(f"w{i}", p.data_source, "#### 9999 \\boxed{9999}", p.ground_truth).score == 0.0


@pytest.mark.parametrize("reward", ["gsm8k", "math"])
@pytest.mark.parametrize(
    ("bad", "what"),
    [
        (["42"], "a string or a number, got list"),
        ({"value": 42}, "a string or a number, got dict"),
        (True, "a string or a number, got bool"),
        (float("nan"), "a string or a finite number, got nan"),
    ],
)
def test_a_ground_truth_the_builtin_cannot_read_is_a_bad_row_naming_the_field(
    tmp_path: Path, tok: HFTokenizer, reward: str, bad: object, what: str
) -> None:
    # a list's str was compared ("['42']"): every output scored 0, nothing said
    path = _bad_second_row(tmp_path, "42", bad)
    said = (
        f"{path}: 1 of 2 rows are bad: line 2: reward_model.ground_truth: expected {what} (reward {reward} compares "
        "the output's answer with it as text)"
    )
    _refused_by_check_and_prepare(tmp_path, tok, task(path=path.name, reward=reward), said)
    skip = task(path=path.name, reward=reward, bad_rows="skip")
    assert check_rows(skip, data_path=path, tokenizer=tok).good == 1
    assert len(prepare_dataset(skip, data_path=path, tokenizer=tok, out_dir=tmp_path / "d")) == 1
    if isinstance(bad, list):  # exact_match takes a list (any of the answers): no bad row for it
        assert check_rows(task(path=path.name), data_path=path, tokenizer=tok).good == 2


@pytest.mark.parametrize(
    ("output", "ground_truth", "score"),
    [
        ("42", 42.0, 1.0),  # str(42.0) is "42.0", which the bare answer never matched
        (" 42\n", 42, 1.0),
        ("0.00001", 1e-05, 1.0),  # str(1e-05) is "1e-05"
        ("42", [41, 42.0], 1.0),  # a list: any of them, each read alike
        ("7", ["seven", 7.0], 1.0),
        ("42", " 42 ", 1.0),
        ("42.0", 42.0, 0.0),  # as gsm8k's `#### 42.0` (verl's rows hold "42")
        ("41", [42.0, 43], 0.0),
    ],
)
def test_exact_match_reads_a_numeric_ground_truth_as_the_other_builtins_do(
    output: str, ground_truth: object, score: float
) -> None:
    assert exact_match("mine", output, ground_truth) == score


@pytest.mark.parametrize(
    ("bad", "what"),
    [
        ({"value": 42}, "a string, a number or a list of them, got dict"),
        (True, "a string, a number or a list of them, got bool"),
        (float("nan"), "a string or a finite number, got nan"),
        ([], "a string, a number or a list of them, got an empty list"),
        (["41", ["42"]], "[1]: expected a string or a number, got list"),
        ([42, None], "[1]: expected a string or a number, got NoneType"),
    ],
)
def test_a_ground_truth_exact_match_cannot_read_is_a_bad_row_naming_the_field(
    tmp_path: Path, tok: HFTokenizer, bad: object, what: str
) -> None:
    # its str was compared: "{'value': 42}", "nan", "['42']" matched no output, "True" alone matched True
    path = _bad_second_row(tmp_path, 42.0, bad)
    expected = what if what.startswith("[") else f"expected {what}"
    said = (
        f"{path}: 1 of 2 rows are bad: line 2: reward_model.ground_truth: {expected} (reward exact_match compares the "
        "output with it as text)"
    )
    _refused_by_check_and_prepare(tmp_path, tok, task(path=path.name), said)  # (exact_match: the default)
    assert check_rows(task(path=path.name, bad_rows="skip"), data_path=path, tokenizer=tok).good == 1
    assert (
        check_rows(task(path=path.name, reward="digits"), data_path=path, tokenizer=tok).good == 2
    )  # (its own reading)


def _bad_second_row(tmp_path: Path, good: object, bad: object) -> Path:
    """A dataset file of two rows, the second's ground truth `bad`."""
    rows = [
        {"prompt": "a", "reward_model": {"ground_truth": good}},
        {"prompt": "b", "reward_model": {"ground_truth": bad}},
    ]
    return write_jsonl(tmp_path / "t.jsonl", rows)


def _refused_by_check_and_prepare(tmp_path: Path, tok: HFTokenizer, cfg: DatasetTask, said: str) -> None:
    """`check_rows` and the launch's `prepare_dataset` refuse the task's file in the one line `said`."""
    path = tmp_path / cfg.path
    for step in (
        lambda: check_rows(cfg, data_path=path, tokenizer=tok),
        lambda: prepare_dataset(cfg, data_path=path, tokenizer=tok, out_dir=tmp_path / "d"),
    ):
        with pytest.raises(ConfigError) as e:
            step()
        assert str(e.value) == said
        assert e.value.hint == "fix the rows, or set `task.bad_rows: skip` to train on the others"
