"""One module per CLI command; each exposes `register(app)` and stays a thin adapter."""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator

import typer

from rlctl.config.base import MAX_WAIT_S


def seconds_at_least(low: float) -> Callable[[float | None], float | None]:
    """A typer callback for an option in seconds: finite, ≥ `low` (a typer `min=` alone lets nan and inf through)
    and at most a week (MAX_WAIT_S, as a job file's seconds: past about 3 × 10^8 years every wait on a lock, a socket
    or a queue raised OverflowError, a traceback: `status --timeout 1e12`), else the one-line usage error, exit 2;
    None (an option not given that defaults to none) passes. Not a `min=`: the option's help text stays as it is."""

    def check(value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and value >= low):
            raise typer.BadParameter(f"{value} is not a number of seconds ≥ {low:g}")
        if value is not None and value > MAX_WAIT_S:
            raise typer.BadParameter(f"{value:g} s is more than a week; valid: {low:g} to {MAX_WAIT_S} s (7 days)")
        return value

    return check


@contextlib.contextmanager
def said_if_interrupted(what: Callable[[], str]) -> Iterator[None]:
    """A Ctrl-C in the block says in one line what it interrupted and what that left (`what()`), exit 130, versus
    exit 130 with nothing said: typer ends a command's KeyboardInterrupt so."""
    try:
        yield
    except KeyboardInterrupt:
        sys.stderr.write(f"rlctl: interrupted: {what()}\n")
        raise typer.Exit(130) from None
