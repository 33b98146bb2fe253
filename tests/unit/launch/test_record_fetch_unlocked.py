"""The launcher's summary writes (`update_summary`) take the summary lock alone, which a fetch of the controller
site's record (`fetch_record`) holds only around its read-merge-write of summary.json here, versus the fetch lock,
which the fetch holds across its reads of the site: a site that did not answer (each read up to its timeout) held
it for minutes, and a `rlctl stop` recording its agents' exits in summary.json waited behind a `status -w`."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from rlctl.launch import sitefs
from rlctl.launch.jobdir import JobDir
from rlctl.launch.record import fetch_record
from rlctl.ops.runstate import update_summary
from tests.unit.launch.test_stage import _controller_site

BOUND_S = 5.0  # how long the summary write may take here; the fetch holds its read far past it


def test_a_summary_write_does_not_wait_for_a_fetch_from_a_site_that_does_not_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, site, root = _controller_site(tmp_path)
    jd = JobDir(src)
    jd.write_json(jd.summary_json, {"run": "r1", "state": "done"})
    (root / "metrics.jsonl").write_text('{"iteration": 0}\n')
    hanging, answer = threading.Event(), threading.Event()
    read_from = sitefs.LocalFiles.read_from

    def not_answering(self: sitefs.LocalFiles, path: str, offset: int, limit: int) -> tuple[bytes, int] | None:
        if path.endswith("metrics.jsonl"):
            hanging.set()
            answer.wait(timeout=60)
        return read_from(self, path, offset, limit)

    monkeypatch.setattr(sitefs.LocalFiles, "read_from", not_answering)
    fetched: list[list[str]] = []
    fetch = threading.Thread(target=lambda: fetched.append(fetch_record(src, site, "localhost", str(root))))
    write = threading.Thread(target=update_summary, args=(jd, "r1", {"agent_exits": {"trainer-0": 0}}))
    fetch.start()
    try:
        assert hanging.wait(timeout=10)
        write.start()
        write.join(timeout=BOUND_S)
        assert not write.is_alive(), "the summary write waited for the fetch's read of the site"
    finally:
        answer.set()
        fetch.join(timeout=30)
        if write.is_alive():
            write.join(timeout=30)
    assert json.loads(jd.summary_json.read_text()) == {"run": "r1", "state": "done", "agent_exits": {"trainer-0": 0}}
    assert fetched == [["metrics.jsonl"]]
    assert (src / "metrics.jsonl").read_text() == '{"iteration": 0}\n'
