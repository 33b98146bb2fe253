"""Small text helpers shared by error messages: closest-name suggestions and lists of valid names."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, valid: Iterable[str]) -> str:
    """Return " (did you mean 'x'?)" for the closest valid name, or "" when nothing is close."""
    choices = list(valid)
    lowered = {c.lower(): c for c in choices}
    if word.lower() in lowered:
        return f" (did you mean '{lowered[word.lower()]}'?)"
    match = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not match:
        match = [lowered[m] for m in difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)]
    return f" (did you mean '{match[0]}'?)" if match else ""


def one_of(valid: Iterable[str]) -> str:
    return ", ".join(sorted(valid))
