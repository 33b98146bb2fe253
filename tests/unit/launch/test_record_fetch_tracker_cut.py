"""A tracker file's copy from the controller's site (tensorboard/, wandb/) goes through a name of its own, then is
renamed: one cut short (the site gone mid-copy; the tracker's file removed since the listing) leaves the copy here as
the fetch before brought it, versus emptied or cut short, as SFTP's get opens the local file before it reads the
site's."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.errors import LaunchError
from rlctl.launch import sitefs
from rlctl.launch.record import fetch_record
from tests.unit.launch.test_stage import _controller_site


def test_a_tracker_files_copy_cut_short_leaves_the_one_here_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, site, root = _controller_site(tmp_path)
    (root / "tensorboard" / "run").mkdir(parents=True)
    (root / "tensorboard" / "run" / "events.out.tfevents.1").write_bytes(b"step 1\n")
    assert fetch_record(src, site, "localhost", str(root)) == ["tensorboard/run/events.out.tfevents.1"]
    (root / "tensorboard" / "run" / "events.out.tfevents.1").write_bytes(b"step 1\nstep 2\n")

    def cut_short(self: sitefs.LocalFiles, path: str, local: Path) -> None:  # as SFTP's get: the local file first
        with local.open("wb") as f:
            f.write(b"st")
            raise LaunchError(f"ssh c-1: cannot copy {path} to {local}: Socket is closed")

    monkeypatch.setattr(sitefs.LocalFiles, "get", cut_short)
    assert fetch_record(src, site, "localhost", str(root)) == []
    assert (src / "tensorboard" / "run" / "events.out.tfevents.1").read_bytes() == b"step 1\n"
    assert [p.name for p in src.rglob("*.part")] == []
