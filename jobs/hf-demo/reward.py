"""The HF demo's reward, in the signature RL users already write (verl's `compute_score`): 1.0 for the
exact answer, else the fraction of (letter, count) runs that are right."""

from __future__ import annotations

import itertools
from typing import Any


def _runs(words: list[str]) -> list[tuple[str, int]]:
    return [(w, len(list(g))) for w, g in itertools.groupby(words)]


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    got, want = solution_str.split(), ground_truth.split()
    if got == want:
        return 1.0
    a, b = _runs(want), _runs(got)
    return sum(1 for x, y in zip(a, b, strict=False) if x == y) / max(len(a), len(b), 1)
