"""The settings of this suite's Hypothesis property tests: `props(n)` — n examples, the same every run (CI
reproducible), no deadline (a shared, slow machine: a slow example is not a failure), no example database."""

from __future__ import annotations

from hypothesis import HealthCheck, settings


def props(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
