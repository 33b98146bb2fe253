"""A resume's moves of summary.json (aside as its run starts, back where the run never started) against a fetch of
the controller site's record at the same moment (`rlctl status`): the moves hold the fetch's lock (`fetching`),
versus the fetch, which reads the summary here and writes the controller's copy in its place, writing between them:
the run before's summary back as the new run's, or the controller's copy over the launcher's keys (held-out
figures) the resume had just put back."""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlctl.launch.jobdir import JobDir
from rlctl.launch.record import FETCH_LOCK, fetch_record, fetching
from rlctl.launch.sitefs import LocalFiles
from rlctl.ops.run import JobRun
from tests.unit.ops.test_resume_point import job_run

CONTROLLERS = {"run": "r0", "state": "done", "iterations": 9}  # the controller's copy of the run before's summary
HELD = {**CONTROLLERS, "heldout": {"prompts": 8, "greedy_reward_last": 0.75}}  # the launcher's, here


class Fetch:
    """A fetch on another thread holding the fetch lock until the resume moves the summary or waits for that lock,
    then writing the controller's copy as a fetch writes it (`fetched`: what it made of the summary here)."""

    def __init__(self, jd: JobDir, monkeypatch: pytest.MonkeyPatch, fetched: Callable[[], dict[str, Any]]) -> None:
        self.jd, self.fetched = jd, fetched
        self.holding, self.resume_came = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._fetch)
        flock, move = fcntl.flock, LocalFiles.move

        def flocking(fd: Any, op: int) -> None:  # the resume at the fetch lock: let the fetch write
            path = os.readlink(f"/proc/self/fd/{fd if isinstance(fd, int) else fd.fileno()}")
            if threading.current_thread() is not self.thread and path.endswith(FETCH_LOCK):
                self.resume_came.set()
            flock(fd, op)

        def moving(files: LocalFiles, src: str, dst: str) -> bool:  # a move without the lock: the fetch writes now
            moved = move(files, src, dst)
            if "summary" in src and self.thread.is_alive():
                self.resume_came.set()
                self.thread.join(timeout=10)
            return moved

        monkeypatch.setattr(fcntl, "flock", flocking)
        monkeypatch.setattr(LocalFiles, "move", moving)

    def start(self) -> None:
        self.thread.start()
        assert self.holding.wait(timeout=10)

    def _fetch(self) -> None:
        with fetching(self.jd.path):
            summary = self.fetched()  # read before the resume's move, as a fetch reads the copy here first
            self.holding.set()
            self.resume_came.wait(timeout=10)
            self.jd.write_json(self.jd.summary_json, summary)


def test_a_fetch_as_a_resume_sets_the_summary_aside_does_not_put_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, sites = job_run(tmp_path)
    jd = sites.c
    jd.write_json(jd.summary_json, HELD)
    fetch = Fetch(jd, monkeypatch, lambda: {**CONTROLLERS, **json.loads(jd.summary_json.read_text())})
    seen: list[bool] = []

    def prepare(self: JobRun, aside: str, *, resume: bool, checkpoint: int | None) -> None:
        seen.append(jd.summary_json.exists())
        raise KeyboardInterrupt

    monkeypatch.setattr(JobRun, "_prepare", prepare)
    fetch.start()
    with pytest.raises(KeyboardInterrupt):
        run.start(resume=True)
    assert seen == [False]  # the run staged with no summary here (the run before's was its end, before)
    assert json.loads(jd.summary_json.read_text()) == HELD  # put back as it was


def test_a_fetch_as_a_refused_resume_puts_the_summary_back_keeps_the_launchers_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, sites = job_run(tmp_path)
    jd = sites.c
    jd.write_json(jd.summary_json, HELD)

    def here_or_controllers() -> dict[str, Any]:
        return json.loads(jd.summary_json.read_text()) if jd.summary_json.exists() else CONTROLLERS

    fetch = Fetch(jd, monkeypatch, here_or_controllers)

    def prepare(self: JobRun, aside: str, *, resume: bool, checkpoint: int | None) -> None:
        fetch.start()  # a `rlctl status` as the resume stages: no summary here, it reads
        raise KeyboardInterrupt

    monkeypatch.setattr(JobRun, "_prepare", prepare)
    with pytest.raises(KeyboardInterrupt):
        run.start(resume=True)
    fetch.thread.join(timeout=10)
    assert json.loads(jd.summary_json.read_text()) == HELD


def test_a_fetch_that_read_the_run_befores_summary_writes_none_after_the_resume_set_it_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resume's move of the summary on the controller's site (`_set_summary_aside`, as its run stages) between a
    `rlctl status` fetch's read of the site and its write here: the fetch writes no summary (the run before's, which
    would be taken for this run's end), the copy fetched back while staging is gone, and the site's is aside."""
    run, sites = job_run(tmp_path)
    jd = sites.c
    root = tmp_path / "on-the-site"
    root.mkdir()
    (root / "summary.json").write_text(json.dumps(CONTROLLERS))
    jd.write_json(jd.summary_json, HELD)  # fetched back here as the run staged
    run._record = (run.sites["c"], "localhost", str(root))
    read, moved = threading.Event(), threading.Event()
    read_text = LocalFiles.read_text

    def reading(files: LocalFiles, path: str) -> str | None:
        text = read_text(files, path)
        if path.endswith("/summary.json") and threading.current_thread() is fetch:
            read.set()
            moved.wait(timeout=10)
        return text

    monkeypatch.setattr(LocalFiles, "read_text", reading)
    fetch = threading.Thread(target=fetch_record, args=(jd.path, run.sites["c"], "localhost", str(root)))
    fetch.start()
    try:
        assert read.wait(timeout=10)
        run._set_summary_aside(LocalFiles(), str(root), "summary.1.json")
    finally:
        moved.set()
        fetch.join(timeout=10)
    assert not jd.summary_json.exists()
    assert sorted(p.name for p in root.glob("summary*")) == ["summary.1.json"]
    fetch_record(jd.path, run.sites["c"], "localhost", str(root))  # the next fetch: none there, none here
    assert not jd.summary_json.exists()
