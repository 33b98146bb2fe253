"""A verl job's reward moves over unchanged: every signature verl can call, an async compute_score, verl's built-in
scorers by name; and what a reward's failure says is one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.rl.reward import load_reward
from rlctl.rl.reward_pool import RewardPool

SIGNATURES = """
def required_extra(data_source, solution_str, ground_truth, extra_info):
    return float(extra_info["bonus"])

def keyword_only(data_source, solution_str, ground_truth, *, extra_info):
    return 1.0

def any_keywords(**kwargs):
    return float(len(kwargs))

def three(data_source, solution_str, ground_truth):
    return 3.0

def needs_more(data_source, solution_str, ground_truth, extra_info, method):
    return 0.0

def positional_only(data_source, solution_str, ground_truth, /, extra_info=None):
    return 0.0
"""


@pytest.fixture
def signatures(tmp_path: Path) -> Path:
    (tmp_path / "sigs.py").write_text(SIGNATURES)
    return tmp_path


@pytest.mark.parametrize("name", ["required_extra", "keyword_only", "any_keywords", "three"])
def test_every_signature_verl_calls_loads(signatures: Path, name: str) -> None:
    # verl passes extra_info as a keyword always: a function that requires it was refused, its signature tried with
    # the first three arguments alone ("missing a required argument: 'extra_info'")
    assert callable(load_reward(f"sigs.py:{name}", signatures))


def test_a_required_extra_info_is_given_the_rows(signatures: Path) -> None:
    with RewardPool("sigs.py:required_extra", base_dir=signatures, workers=0) as pool:
        assert pool.score("s0", "d", "x", "y", {"bonus": 2}).score == 2.0
    with RewardPool("sigs.py:any_keywords", base_dir=signatures, workers=0) as pool:
        assert pool.score("s0", "d", "x", "y").score == 4.0  # extra_info among them, as verl calls it


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("needs_more", "missing a required argument: 'method'"),
        ("positional_only", "'data_source' parameter is positional only, but was passed as a keyword"),
    ],
)
def test_a_signature_verl_cannot_call_is_refused_saying_why(signatures: Path, name: str, why: str) -> None:
    with pytest.raises(ValueError) as e:
        load_reward(f"sigs.py:{name}", signatures)
    called = "cannot be called as compute_score(data_source=, solution_str=, ground_truth=, extra_info=): "
    assert called in str(e.value)
    assert str(e.value).endswith(why)
