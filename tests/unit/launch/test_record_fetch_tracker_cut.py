"""A tracker file's copy from the controller's site (tensorboard/, wandb/) goes through a name of its own, then is
renamed or appended: one cut short (the site gone mid-copy; the tracker's file removed since the listing) leaves the
copy here as the fetch before brought it, versus emptied or cut short, as SFTP's get opens the local file before it
reads the site's. A file the site only appended to is fetched by what it grew (`fetch_grown`), versus whole at every
fetch: a TensorBoard event file grows by a few kB an iteration, and every `rlctl status` of an ended job copied it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.errors import LaunchError
from rlctl.launch import sitefs
from rlctl.launch.record import fetch_record
from tests.unit.launch.test_stage import _controller_site

EVENTS = Path("tensorboard") / "run" / "events.out.tfevents.1"


@pytest.mark.parametrize(("then", "copy"), [(b"step 1\nstep 2\n", "get_range"), (b"step 0\nstep 2\n", "get")])
def test_a_tracker_files_copy_cut_short_leaves_the_one_here_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: bytes, copy: str
) -> None:
    """The site's file grew (its new bytes copied) or was written anew (copied whole): cut short either way."""
    src, site, root = _controller_site(tmp_path)
    (root / EVENTS).parent.mkdir(parents=True)
    (root / EVENTS).write_bytes(b"step 1\n")
    assert fetch_record(src, site, "localhost", str(root)) == [str(EVENTS)]
    (root / EVENTS).write_bytes(then)

    def cut_short(self: sitefs.LocalFiles, path: str, local: Path, *_: int) -> None:  # as SFTP's: the local file first
        with local.open("wb") as f:
            f.write(b"st")
            raise LaunchError(f"ssh c-1: cannot copy {path} to {local}: Socket is closed")

    monkeypatch.setattr(sitefs.LocalFiles, copy, cut_short)
    assert fetch_record(src, site, "localhost", str(root)) == []
    assert (src / EVENTS).read_bytes() == b"step 1\n"
    assert [p.name for p in src.rglob("*.part")] == []
    monkeypatch.undo()
    assert fetch_record(src, site, "localhost", str(root)) == [str(EVENTS)]
    assert (src / EVENTS).read_bytes() == then


def test_a_tracker_file_is_copied_by_what_it_grew_and_not_at_all_when_it_did_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, site, root = _controller_site(tmp_path)
    (root / EVENTS).parent.mkdir(parents=True)
    copied: list[int] = []
    get, get_range = sitefs.LocalFiles.get, sitefs.LocalFiles.get_range

    def counted_get(self: sitefs.LocalFiles, path: str, local: Path) -> None:
        get(self, path, local)
        copied.append(local.stat().st_size)

    def counted_range(self: sitefs.LocalFiles, path: str, local: Path, start: int, end: int) -> None:
        get_range(self, path, local, start, end)
        copied.append(local.stat().st_size)

    monkeypatch.setattr(sitefs.LocalFiles, "get", counted_get)
    monkeypatch.setattr(sitefs.LocalFiles, "get_range", counted_range)
    step = bytes(range(256)) * 4  # an iteration's scalars: a binary record of 1 kB
    for i in range(300):  # a `rlctl status` after each iteration, and one more with nothing new
        with (root / EVENTS).open("ab") as f:
            f.write(i.to_bytes(4, "little") + step)
        assert str(EVENTS) in fetch_record(src, site, "localhost", str(root))
    assert str(EVENTS) not in fetch_record(src, site, "localhost", str(root))
    assert (src / EVENTS).read_bytes() == (root / EVENTS).read_bytes()
    size = (root / EVENTS).stat().st_size
    assert sum(copied) == size, (sum(copied), size)  # each byte once: was the whole file at every fetch (46 MB here)


def test_an_empty_tracker_file_is_copied_once_not_at_every_fetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty file on the site (a tracker's file created, its first record not written yet) whose copy here is empty
    too is the host's whole file: nothing to copy, as for any other (`fetch_grown`), versus copied whole again and
    said fetched at every fetch."""
    src, site, root = _controller_site(tmp_path)
    (root / EVENTS).parent.mkdir(parents=True)
    (root / EVENTS).write_bytes(b"")
    assert fetch_record(src, site, "localhost", str(root)) == [str(EVENTS)]
    copied: list[str] = []
    get = sitefs.LocalFiles.get

    def counted(self: sitefs.LocalFiles, path: str, local: Path) -> None:
        copied.append(path)
        get(self, path, local)

    monkeypatch.setattr(sitefs.LocalFiles, "get", counted)
    assert fetch_record(src, site, "localhost", str(root)) == [] and copied == []
    (root / EVENTS).write_bytes(b"step 1\n")  # its first record: copied
    assert fetch_record(src, site, "localhost", str(root)) == [str(EVENTS)]
    assert (src / EVENTS).read_bytes() == b"step 1\n"
