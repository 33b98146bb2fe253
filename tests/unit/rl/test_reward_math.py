"""The built-in `math` reward scores as verl's MATH scorer: the output's last \\boxed{…} against the ground truth,
both normalised by its rewrites (not algebra)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.rl.reward import builtin_scorer_hint, load_reward
from rlctl.rl.reward_math import last_boxed, math_boxed, normalized


@pytest.mark.parametrize(
    ("output", "ground_truth", "score"),
    [
        ("so the answer is $\\boxed{\\dfrac{1}{2}}$.", "\\frac{1}{2}", 1.0),
        ("\\boxed{0.5}", "\\frac12", 1.0),  # 0.5 and \frac12 both read \frac{1}{2}
        ("\\boxed{1/2}", "\\frac{1}{2}", 1.0),
        ("\\boxed{-1/2}", "\\frac{-1}{2}", 1.0),
        ("\\boxed{2/4}", "\\frac{1}{2}", 0.0),  # rewrites, not algebra
        ("\\boxed{\\frac{\\sqrt3}{2}}", "\\frac{\\sqrt{3}}{2}", 1.0),  # nested braces matched
        ("\\boxed{10\\%}", "10", 1.0),
        ("\\boxed{x = 3}", "3", 1.0),
        ("\\boxed{90^\\circ}", "90", 1.0),
        ("\\boxed{5 \\text{ cm}}", "5", 1.0),
        ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)", 1.0),
        ("\\boxed{.5}", "0.5", 1.0),
        ("first \\boxed{4}, then \\boxed{5}", "5", 1.0),  # the last one
        ("first \\boxed{4}, then \\boxed{5}", "4", 0.0),
        ("$\\boxed 7$", "7", 1.0),  # no braces: up to the `$`
        ("\\boxed{5", "5", 0.0),  # cut off inside it
        ("\\fbox{5}", "5", 0.0),  # verl's scorer fails on it
        ("the answer is 5", "5", 0.0),  # no box: none
        ("\\boxed{\\sqrt}", "\\sqrt", 1.0),  # unreadable by the rewrites: compared as written
        ("\\boxed{6}", 6, 1.0),  # a number as its str
    ],
)
def test_the_math_builtin_scores_as_verls_math_scorer(output: str, ground_truth: object, score: float) -> None:
    assert math_boxed("lighteval/MATH", output, ground_truth) == score


def test_the_math_builtin_loads_by_name_and_its_rewrites() -> None:
    assert load_reward("math", Path(".")) is math_boxed
    assert last_boxed("a \\boxed{\\frac{1}{2}} b") == "\\frac{1}{2}"
    assert normalized("k = \\tfrac{3}{4}") == "\\frac{3}{4}"
    assert normalized("\\frac1{72}") == "\\frac{1}{72}"


def test_check_names_the_math_builtin_for_verls_math_rows() -> None:
    hint = builtin_scorer_hint("exact_match", {"lighteval/MATH"})
    assert hint is not None and hint.endswith("verl scores them with its MATH scorer): an output that is not the bare "
                                              "answer scores 0; set reward: math")  # fmt: skip
    assert builtin_scorer_hint("exact_match", {"lighteval/MATH", "openai/gsm8k"}) is None  # two built-ins: neither
    assert builtin_scorer_hint("math", {"lighteval/MATH"}) is None
