"""A dict reward's other numeric keys (verl's reward_extra_info: {'score': 1.0, 'acc': 1.0, 'format': 0.5}) are
averaged over each iteration's trained samples into its metrics row (`reward_extra`) and the trackers
(reward_extra/<key>), versus checked, kept in RewardResult.extra and never read."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rlctl.config.task import DatasetTask
from rlctl.rl.dataset import prepare_dataset
from rlctl.rl.reward import DROPPED_KEYS, check_result, extra_figures
from rlctl.rl.reward_pool import RewardPool
from rlctl.rl.source import DatasetSource
from rlctl.rl.tokenizer import load_tokenizer
from rlctl.tracking import row_to_metrics
from tests.unit.hf_tokenizer import SPECIALS, write_tokenizer
from tests.unit.rl.test_dataset import write_jsonl

REWARD = """\
def f(data_source, solution_str, ground_truth):
    right = solution_str.strip() == ground_truth
    out = {"score": float(right), "acc": float(right), "note": "not a number"}
    if right:
        out["format"] = 0.5
    return out
"""


def test_a_dict_rewards_other_figures_are_averaged_over_the_samples_asked(tmp_path: Path) -> None:
    tok = load_tokenizer(write_tokenizer(tmp_path / "model"))
    path = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "what is 1 + 2 ?", "ground_truth": "3"}])
    (tmp_path / "r.py").write_text(REWARD)
    cfg = DatasetTask.model_validate(
        {"kind": "dataset", "path": "train.jsonl", "max_output_tokens": 8, "reward": "r.py:f", "reward_workers": 0}
    )
    prepare_dataset(cfg, data_path=path, tokenizer=tok, out_dir=tmp_path / "data")
    source = DatasetSource(cfg, tmp_path, tmp_path / "model", scoring=True)
    try:
        end = SPECIALS.index("<|end|>")
        right = [*tok.encode("3", add_special_tokens=False), end]
        wrong = [*tok.encode("4", add_special_tokens=False), end]
        scores = [source.score(sid, "p0", out).result() for sid, out in (("s0", right), ("s1", wrong), ("s2", right))]
        assert scores == [1.0, 0.0, 1.0]
        assert source.reward_extras(["s0", "s1"]) == {"acc": 0.5, "format": 0.5}  # each key over the samples with it
        assert source.reward_extras(["s0", "s1"]) == {}  # said once
        source.cancel_score("s2")  # a sample dropped: its figures go with it
        assert source.reward_extras(["s2"]) == {}
    finally:
        source.close()


def test_the_trackers_get_each_extra_figure_as_a_series() -> None:
    row = {"iteration": 3, "reward_mean": 0.5, "reward_extra": {"acc": 0.25, "format": 0.5, "bad": "x"}}
    assert row_to_metrics(row) == {"reward/mean": 0.5, "reward_extra/acc": 0.25, "reward_extra/format": 0.5}


def test_the_controller_puts_an_iterations_extra_figures_in_its_row(tmp_path: Path) -> None:
    """The controller asks the task for the figures of the samples the iteration trained (the digits task has none:
    its rows have no reward_extra)."""
    from tests.unit.agents.test_agents_gone_peers import Running

    r = Running(tmp_path, "reward-extras")
    try:
        assert "reward_extra" not in r.train()
        asked: list[list[str]] = []

        def extras(sample_ids: list[str]) -> dict[str, float]:
            asked.append(list(sample_ids))
            return {"acc": 1 / 3}

        r.ctl.task.reward_extras = extras  # type: ignore[method-assign]
        row = r.train()
        assert row["reward_extra"] == {"acc": 0.333333}
        assert len(asked) == 1 and len(asked[0]) == 4  # the iteration's 2 prompts × 2 samples
    finally:
        r.close()


NAMES = """\
def f(data_source, solution_str, ground_truth):
    return {
        "score": 1.0,
        "acc": True,
        "pred_len_2": 7,
        "acc/strict": 1.0,
        "format score": 0.5,
        "x" * 65: 1.0,
        3: 1.0,
        "note": "not a number",
        "ratio": float("nan"),
    }
"""


@pytest.mark.parametrize("workers", [0, 1])
def test_a_dict_rewards_extra_keys_are_names_and_numbers_others_left_out_said_once_a_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, workers: int
) -> None:
    # every key was kept as it was (str(3) too): 'acc/strict' nested W&B's panels, 'format score' and a 65-character
    # name broke a Prometheus or TensorBoard series name; a value that was no number was left out unsaid
    caplog.set_level(logging.WARNING, logger="rlctl.rl.reward_pool")
    (tmp_path / "r.py").write_text(NAMES)
    with RewardPool("r.py:f", base_dir=tmp_path, workers=workers) as pool:
        results = [pool.score(f"s{i}", "d", "x", "y") for i in range(3)]
    with RewardPool("r.py:f", base_dir=tmp_path, workers=0) as pool:  # (the held-out evaluation's pool: said already)
        pool.score("h0", "d", "x", "y")
    assert all(r.ok and r.score == 1.0 for r in results)
    assert results[0].extra == {"acc": 1.0, "pred_len_2": 7.0}
    names = "a key is a name of letters, digits and _, at most 64 characters"
    assert results[0].dropped == {
        "'acc/strict'": names,
        "'format score'": names,
        repr("x" * 65): names,
        "3": names,
        "'note'": "its value is no finite number ('not a number')",
        "'ratio'": "its value is no finite number (nan)",
    }
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 6  # once a key, over the calls of both pools
    assert said[0] == (
        "reward r.py:f returned 'acc/strict' beside 'score' (sample s0): left out of its figures (reward_extra/<key>): "
        f"{names}; said once a key"
    )


def test_a_dict_with_many_bad_keys_says_its_first_ones() -> None:
    result = check_result({"score": 0.5, **{f"k/{i}": 1.0 for i in range(1000)}}, on_error=0.0)
    assert (result.score, result.extra, len(result.dropped)) == (0.5, {}, DROPPED_KEYS)


def test_a_dict_of_many_values_that_are_no_numbers_reprs_those_it_says_alone() -> None:
    """Each value left out past the DROPPED_KEYS said was repr'd all the same (a scorer's 1000 debug lists: 1000
    reprs a sample, 992 thrown away); the values kept are all kept."""
    made: list[int] = []

    class Debug:
        def __repr__(self) -> str:
            made.append(1)
            return "Debug()"

    value = {"score": 0.5, "acc": 1.0, **{f"debug_{i}": Debug() for i in range(1000)}, "len": 7}
    kept, dropped = extra_figures(value)
    assert kept == {"acc": 1.0, "len": 7.0}
    assert list(dropped) == [f"'debug_{i}'" for i in range(DROPPED_KEYS)]
    assert set(dropped.values()) == {"its value is no finite number (Debug())"}
    assert len(made) == DROPPED_KEYS
