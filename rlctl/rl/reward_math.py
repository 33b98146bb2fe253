"""The built-in `math` reward: verl's MATH scorer (verl.utils.reward_score.math, after the MATH benchmark's own
check, Hendrycks et al.), for the rows verl's MATH preprocessing writes (data_source lighteval/MATH): the last
`\\boxed{…}` of the output, normalised, against the ground truth normalised alike.

    output ─▶ its last \\boxed{…} (braces matched) ─▶ its content ─▶ normalised ─┐
                                                                                ├─ equal: 1.0, else 0.0
    ground truth ──────────────────────────────────────────────────▶ normalised ─┘

The normalisation is a fixed list of rewrites, not algebra: `\\dfrac12`, `1/2`, `0.5` and `\\frac{1}{2}` are one
answer, `2/4` and `1/2` are two. Where it cannot read an answer (a `\\sqrt` with nothing after it), the two are
compared as written.
"""

from __future__ import annotations

import decimal
import math
import numbers
import re
from typing import Any

BOXED = "\\boxed"


def math_boxed(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """1.0 where the output's last boxed answer is the ground truth, both normalised (`normalized`), else 0.0."""
    answer = last_boxed(solution_str)
    if answer is None:
        return 0.0
    truth = answer_text(ground_truth)
    try:
        same = normalized(answer) == normalized(truth)
    except _Unreadable:
        same = answer == truth
    return 1.0 if same else 0.0


def answer_text(ground_truth: Any) -> str:
    """A ground truth as the text the gsm8k, math and exact_match built-ins compare an output (its answer) with: a
    string as it is; a number as verl's GSM8K and MATH rows write it (their preprocessing stores the answer as text),
    in decimal: 42 and 42.0 as "42", 0.5 as "0.5", 1e-05 as "0.00001" — versus str(42.0), "42.0", which no `#### 42`,
    `\\boxed{42}` or bare 42 matched. Anything else (a list, a dict, a bool, a NaN) is a ValueError saying what it
    is: a row that holds one is refused (`rlctl.rl.reward.ground_truth_problem`)."""
    if isinstance(ground_truth, str):
        return ground_truth
    if isinstance(ground_truth, bool) or not isinstance(ground_truth, numbers.Real):
        raise ValueError(f"expected a string or a number, got {type(ground_truth).__name__}")
    if isinstance(ground_truth, numbers.Integral):
        return str(int(ground_truth))
    x = float(ground_truth)
    if not math.isfinite(x):
        raise ValueError(f"expected a string or a finite number, got {x}")
    # (the shortest repr that reads back as x, written without an exponent: 1e+20 as "100000000000000000000")
    return str(int(x)) if x.is_integer() else format(decimal.Decimal(repr(x)), "f")


def last_boxed(text: str) -> str | None:
    """The content of the text's last `\\boxed{…}`, braces matched; of `\\boxed 5$` (no braces) up to a `$`; None
    where there is none, or its braces do not close (an output cut off inside it), or it is no `\\boxed{` (verl's
    scorer reads `\\fbox{5}` and fails on it: 0)."""
    if f"{BOXED} " in text:  # `\boxed 5`: to the next `$` (verl reads this form first, wherever it is)
        return text.rsplit(f"{BOXED} ", 1)[1].split("$", 1)[0]
    start = text.rfind(BOXED)
    if start < 0:
        return None
    open_braces = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            open_braces += 1
        elif text[i] == "}":
            open_braces -= 1
            if open_braces == 0:
                boxed = text[start : i + 1]
                return boxed[len(BOXED) + 1 : -1] if boxed.startswith(f"{BOXED}{{") else None
    return None


class _Unreadable(ValueError):
    """An answer the rewrites cannot read: compared as written."""


# rewrites, in order: each (old, new) is a plain replacement
_DROPPED = [("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"), ("\\left", ""),
            ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", "")]  # fmt: skip
_PERCENT_AND_DECIMALS = [("\\%", ""), (" .", " 0."), ("{.", "{0.")]
_SLASH = re.compile(r"(-?\d+)/(-?\d+)")  # `-1/2`: integers, written as Python writes them (not `01/2`)


def normalized(answer: str) -> str:
    """`answer` rewritten so that ways of writing one answer read the same (as verl's MATH scorer rewrites it):
    line breaks, `\\!`, `\\left`/`\\right`, degrees, `\\$`, a trailing `\\text{ unit}`, `\\%` dropped; `tfrac`/`dfrac`
    read `frac`; `.5` read `0.5`; a short `k = ` before it dropped; `\\sqrt3` read `\\sqrt{3}`, `\\frac12` and `1/2`
    read `\\frac{1}{2}` and `0.5` too; spaces dropped."""
    for old, new in _DROPPED:
        answer = answer.replace(old, new)
    if "\\text{ " in answer:  # a unit after the answer: `5 \text{ cm}`
        parts = answer.split("\\text{ ")
        if len(parts) != 2:
            raise _Unreadable(answer)
        answer = parts[0]
    for old, new in _PERCENT_AND_DECIMALS:
        answer = answer.replace(old, new)
    if answer.startswith("."):
        answer = "0" + answer
    left, equals, right = answer.partition("=")
    if equals and "=" not in right and len(left) <= 2:  # `x = 5`, `k=5`: the value
        answer = right
    answer = _braced_sqrt(answer).replace(" ", "")
    answer = _braced_fracs(answer)
    if answer == "0.5":
        return "\\frac{1}{2}"
    whole = _SLASH.fullmatch(answer)
    if whole and str(int(whole[1])) == whole[1] and str(int(whole[2])) == whole[2]:
        return f"\\frac{{{whole[1]}}}{{{whole[2]}}}"
    return answer


def _braced_sqrt(answer: str) -> str:
    """`\\sqrt3` → `\\sqrt{3}`: the one character after it braced (`\\sqrt` at the end: unreadable)."""
    head, *rest = answer.split("\\sqrt")
    out = [head]
    for part in rest:
        if not part:
            raise _Unreadable(answer)
        out.append(part if part[0] == "{" else f"{{{part[0]}}}{part[1:]}")
    return "\\sqrt".join(out)


def _braced_fracs(answer: str) -> str:
    """`\\frac12` → `\\frac{1}{2}`, `\\frac1{2}` → `\\frac{1}{2}`: the one-character numerator and denominator
    braced; one with one character after it is left as it was, one with none is unreadable."""
    head, *rest = answer.split("\\frac")
    out = [head]
    for part in rest:
        if part.startswith("{"):
            out.append(part)
            continue
        if not part:
            raise _Unreadable(answer)
        if len(part) < 2:
            return answer
        numerator, denominator, tail = part[0], part[1], part[2:]
        braced = denominator if denominator == "{" else f"{{{denominator}}}"
        out.append(f"{{{numerator}}}{braced}{tail}")
    return "\\frac".join(out)
