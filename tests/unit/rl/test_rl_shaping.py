"""DAPO's soft overlong punishment (`task.overlong_buffer_tokens`, `overlong_penalty`): 0 up to the output limit
minus the buffer, then linear down to −penalty at the limit; added to every score of the digits task and of a
dataset's reward function, refused where nothing would read it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from rlctl.config.task import DatasetTask, DigitsTask
from rlctl.rl.dataset import prepare_dataset
from rlctl.rl.source import DatasetSource, DigitsSource
from rlctl.rl.tasks import EOS, encode
from rlctl.rl.tokenizer import load_tokenizer
from tests.unit.hf_tokenizer import SPECIALS, write_tokenizer
from tests.unit.rl.test_dataset import write_jsonl


def test_the_penalty_by_hand() -> None:
    # limit 40 (digits: min(max_output_tokens − 1, 9 × MAX_DIGITS) + 1), buffer 20, penalty 0.5: from 20 tokens on,
    # −0.5 · (L − 20) / 20: 20 → 0, 30 → −0.25, 39 → −0.475, 40 → −0.5
    source = DigitsSource(
        DigitsTask(kind="digits", max_output_tokens=40, overlong_buffer_tokens=20, overlong_penalty=0.5)
    )
    assert source.max_new_tokens == 40
    assert [source.length_penalty(n) for n in (1, 20, 30, 39, 40, 45)] == [0.0, 0.0, -0.25, -0.475, -0.5, -0.5]
    assert DigitsSource(DigitsTask(kind="digits")).length_penalty(55) == 0.0  # off by default
    # a buffer longer than the task's limit (the digits task may cap its outputs below max_output_tokens) is the
    # whole limit: penalised from the first token, −L / 40
    source.shaping = (110, 1.0)
    assert [source.length_penalty(n) for n in (0, 10, 40)] == [0.0, -0.25, -1.0]


def test_the_digits_score_carries_the_penalty() -> None:
    plain = DigitsSource(DigitsTask(kind="digits", max_output_tokens=40))
    shaped = DigitsSource(DigitsTask(kind="digits", max_output_tokens=40, overlong_buffer_tokens=10))
    prompt = plain.task.prompt(3)
    right = [*encode(prompt.answer), EOS]
    long = right + [EOS] * (36 - len(right))  # what follows EOS is not decoded: the same answer, 36 tokens
    for out, penalty in ((right, 0.0), (long, -0.6)):  # 36 tokens: −(36 − 30) / 10
        base = plain.score("s", "p3", out).result()
        assert shaped.score("s", "p3", out).result() == pytest.approx(base + penalty, abs=1e-12), len(out)


def test_a_dataset_reward_carries_the_penalty(tmp_path: Path) -> None:
    tok = load_tokenizer(write_tokenizer(tmp_path / "model"))
    path = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "what is 1 + 2 ?", "ground_truth": "3"}])
    cfg = DatasetTask.model_validate(
        {"kind": "dataset", "path": "train.jsonl", "max_output_tokens": 8, "overlong_buffer_tokens": 4}
    )
    cfg = cfg.model_copy(update={"reward_workers": 0})
    prepare_dataset(cfg, data_path=path, tokenizer=tok, out_dir=tmp_path / "data")
    source = DatasetSource(cfg, tmp_path, tmp_path / "model", scoring=True)
    try:
        three = tok.encode("3", add_special_tokens=False)
        end = SPECIALS.index("<|end|>")
        short = [*three, end]
        assert source.score("s0", "p0", short).result() == 1.0
        long = [*three, end, *[end] * (7 - len(three) - 1)]  # 7 tokens, still exactly "3": −(7 − 4) / 4
        assert source.score("s1", "p0", long).result() == pytest.approx(1.0 - 0.75, abs=1e-12)
    finally:
        source.close()


def test_the_job_file_refuses_a_penalty_without_a_buffer_and_a_buffer_past_the_limit() -> None:
    with pytest.raises(ValidationError, match="overlong_penalty needs overlong_buffer_tokens"):
        DigitsTask(kind="digits", overlong_penalty=0.5)
    with pytest.raises(ValidationError, match="exceeds max_output_tokens 64"):
        DatasetTask.model_validate(
            {"kind": "dataset", "path": "t.jsonl", "max_output_tokens": 64, "overlong_buffer_tokens": 65}
        )
