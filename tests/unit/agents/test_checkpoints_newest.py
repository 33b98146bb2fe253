"""The complete checkpoints the controller and each trainer rank hold to prune by: the few a prune reads, versus one
per checkpoint of a job of weeks (`rlctl.checkpoint.files.newest_complete`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.checkpoint.files import newest_complete, prunable


@pytest.mark.parametrize("keep", [0, 1, 3])
def test_the_newest_complete_prune_as_every_one_did(tmp_path: Path, keep: int) -> None:
    for v in range(1, 40):
        (tmp_path / f"iter-{v}").mkdir()
    every: list[int] = []
    newest: list[int] = []
    for v in [5, *range(7, 40, 2)]:  # the resumed one first, then those sealed
        every.append(v)
        newest = newest_complete([*newest, v], keep=keep)
        assert len(newest) <= max(keep, 1)
        assert prunable(tmp_path, "trainer", complete=newest, keep=keep) == prunable(
            tmp_path, "trainer", complete=every, keep=keep
        )
