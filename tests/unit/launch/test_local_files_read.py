"""Reading a file of this machine's site (`LocalFiles.read_from`, what `rlctl logs` tails): one that is not there is
None; one that cannot be read, a directory in its place, is a LaunchError naming it, versus an IsADirectoryError
traceback from `rlctl logs JOB trainer/0`."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.errors import LaunchError
from rlctl.launch.sitefs import LocalFiles


def test_a_file_is_read_from_an_offset_and_one_not_there_is_none(tmp_path: Path) -> None:
    log = tmp_path / "trainer-0.log"
    log.write_bytes(b"one\ntwo\n")
    assert LocalFiles().read_from(str(log), 4, 100) == (b"two\n", 8)
    assert LocalFiles().read_from(str(tmp_path / "gone.log"), 0, 100) is None


def test_a_directory_in_a_file_s_place_is_named_in_one_line(tmp_path: Path) -> None:
    log = tmp_path / "trainer-0.log"
    log.mkdir()
    with pytest.raises(LaunchError, match=f"cannot read {log}: Is a directory"):
        LocalFiles().read_from(str(log), 0, 100)
    with pytest.raises(LaunchError, match=f"cannot read {log}: Is a directory"):
        LocalFiles().tail(str(log), 10)
