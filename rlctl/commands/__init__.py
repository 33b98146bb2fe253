"""One module per CLI command; each exposes `register(app)` and stays a thin adapter."""

from __future__ import annotations

import math
from collections.abc import Callable

import typer


def seconds_at_least(low: float) -> Callable[[float | None], float | None]:
    """A typer callback for an option in seconds: finite and ≥ `low` (a typer `min=` alone lets nan and inf
    through), else the one-line usage error, exit 2; None (an option not given that defaults to none) passes. Not a
    `min=`: the option's help text stays as it is."""

    def check(value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and value >= low):
            raise typer.BadParameter(f"{value} is not a number of seconds ≥ {low:g}")
        return value

    return check
