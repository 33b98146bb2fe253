"""Fixtures of the checkpoint tests: the fake 2-rank process group (`tests.unit.fake_group`)."""

from tests.unit.fake_group import fake_rank  # noqa: F401  (a fixture)
