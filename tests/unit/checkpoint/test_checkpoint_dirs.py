"""Which directories under a checkpoints dir are checkpoints: `iter-N`, N in ASCII digits, as the writers name them."""

from __future__ import annotations

from pathlib import Path

from rlctl.checkpoint.files import checkpoint_dirs


def test_only_iter_and_ascii_digits_name_a_checkpoint(tmp_path: Path) -> None:
    """`iter-1_0`, `iter- 7`, `iter--3` and `iter-٣` are no checkpoints (int() read them as 10, 7, −3 and 3)."""
    for name in ("iter-1", "iter-12", "iter-1_0", "iter- 7", "iter--3", "iter-\u0663", "iter-", "iter-x", "other-5"):
        (tmp_path / name).mkdir()
    assert [(v, p.name) for v, p in checkpoint_dirs(tmp_path)] == [(12, "iter-12"), (1, "iter-1")]
