"""Two fetches of the controller site's record into one job dir at once where the filesystem has no flock (NFS
mounted `nolock`: the fetch lock goes unlocked): a `rlctl status -w` that fetches while the job's launcher does.
Each copies through a `.part` of its own and appends only to the copy as it read it, so both end and each row is
here once, versus one `metrics.jsonl.part` both shared: the second renamed or removed it under the first, whose
FileNotFoundError ended the launcher (which catches only a LaunchError) with its traceback."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import IO, Any

import pytest

from rlctl.launch import record, sitefs
from rlctl.launch.record import fetch_record
from tests.unit.launch.test_stage import _controller_site


def _rows(n: int) -> str:
    return "".join(json.dumps({"iteration": i}) + "\n" for i in range(n))


@pytest.mark.parametrize("have", [0, 1], ids=["first-copy", "appended"])
def test_an_unlocked_fetch_beside_another_ends_and_brings_each_row_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, have: int
) -> None:
    src, site, root = _controller_site(tmp_path)
    if have:
        (root / "metrics.jsonl").write_text(_rows(have))
        fetch_record(src, site, "localhost", str(root))
    (root / "metrics.jsonl").write_text(_rows(3))

    def no_flock(f: IO[Any], how: int) -> str | None:
        return "No locks available"  # (as `locks.flock` says for ENOLCK: the caller goes on unlocked)

    # the first fetch has copied the metrics' new bytes to its .part and waits there; the second fetches whole
    at_part, go = threading.Event(), threading.Event()
    get_range = sitefs.LocalFiles.get_range
    first = threading.get_ident()

    def held(self: sitefs.LocalFiles, path: str, local: Path, start: int, end: int) -> None:
        get_range(self, path, local, start, end)
        if path.endswith("metrics.jsonl") and threading.get_ident() != first:
            at_part.set()
            assert go.wait(timeout=30)  # (only a hang's bound: never waited out)

    monkeypatch.setattr(record, "flock", no_flock)
    monkeypatch.setattr(sitefs.LocalFiles, "get_range", held)
    errors: list[BaseException] = []

    def fetch() -> None:
        try:
            fetch_record(src, site, "localhost", str(root))
        except BaseException as e:  # noqa: BLE001 — the test says which
            errors.append(e)

    launcher = threading.Thread(target=fetch)
    launcher.start()
    try:
        assert at_part.wait(timeout=30)
        assert fetch_record(src, site, "localhost", str(root)) == ["metrics.jsonl"]  # the `status -w`, meanwhile
    finally:
        go.set()
        launcher.join(timeout=30)
    assert errors == []
    assert (src / "metrics.jsonl").read_text() == _rows(3)
    assert [p.name for p in src.iterdir() if p.name.endswith(".part")] == []
