"""Two fetches of the controller site's record into one job dir at once (`rlctl status` or `stop` while the job's
launcher fetches it as its run ends, a `launch --resume --iterations` of a job another launcher holds): each brings
what the site's logs grew by once, versus both appending it (`fetch_appended`: each read how much was here, then
appended what is past it, through the one `.part` file)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import IO, Any

import pytest

from rlctl.launch import record, sitefs
from rlctl.launch.record import FETCH_LOCK, fetch_record
from tests.unit.launch.test_stage import _controller_site


def _rows(n: int) -> str:
    return "".join(json.dumps({"iteration": i}) + "\n" for i in range(n))


def test_two_fetches_at_once_bring_each_metrics_row_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, site, root = _controller_site(tmp_path)
    (root / "metrics.jsonl").write_text(_rows(1))
    fetch_record(src, site, "localhost", str(root))  # row 0 is here
    (root / "metrics.jsonl").write_text(_rows(3))
    # each fetch, at the fetch lock or at the metrics' copy, waits there until the other is at one of the two too:
    # both at the copy (where both may) have read how much is here before either appends; one held at the lock
    # waits for the other's whole fetch. Versus a Barrier of both at the copy with a timeout, which a fetch that
    # waits at the lock for the other's end never reached: every run waited the timeout out (1 s)
    arrived: set[int] = set()
    met = threading.Condition()
    get_range = sitefs.LocalFiles.get_range
    flock = record.flock

    def arrive() -> None:
        with met:
            arrived.add(threading.get_ident())
            met.notify_all()
            assert met.wait_for(lambda: len(arrived) == 2, timeout=30)  # (only a hang's bound: never waited out)

    def at_lock(f: IO[Any], how: int) -> str | None:
        if Path(f.name).name == FETCH_LOCK:
            arrive()
        return flock(f, how)

    def meeting(self: sitefs.LocalFiles, path: str, local: Path, start: int, end: int) -> None:
        if path.endswith("metrics.jsonl"):
            arrive()
        get_range(self, path, local, start, end)

    monkeypatch.setattr(record, "flock", at_lock)
    monkeypatch.setattr(sitefs.LocalFiles, "get_range", meeting)
    errors: list[Exception] = []

    def fetch() -> None:
        try:
            fetch_record(src, site, "localhost", str(root))
        except Exception as e:  # noqa: BLE001 — the test says which
            errors.append(e)

    fetches = [threading.Thread(target=fetch) for _ in range(2)]
    for t in fetches:
        t.start()
    for t in fetches:
        t.join(timeout=30)
    assert errors == []
    assert (src / "metrics.jsonl").read_text() == _rows(3)
