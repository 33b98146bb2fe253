"""A resume's moves of summary.json (aside as its run starts, here and on the controller's site; back where the run
never started) against a fetch of the controller site's record at the same moment (`rlctl status`): the moves hold
the fetch's lock (`fetching`, held across the fetch's reads of the site) and, for the copy here, the summary lock
(`summary_lock`, held by the fetch's read-merge-write of it), versus the fetch writing between them: the run before's
summary back as the new run's, or the controller's copy over the launcher's keys (held-out figures) the resume had
just put back."""

from __future__ import annotations

import fcntl
import json
import os
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import pytest

from rlctl.launch.jobdir import JobDir
from rlctl.launch.record import FETCH_LOCK, SUMMARY_LOCK, fetch_record, fetching, summary_lock
from rlctl.launch.sitefs import LocalFiles
from rlctl.ops.run import JobRun
from tests.unit.ops.test_resume_point import job_run

CONTROLLERS = {"run": "r0", "state": "done", "iterations": 9}  # the controller's copy of the run before's summary
HELD = {**CONTROLLERS, "heldout": {"prompts": 8, "greedy_reward_last": 0.75}}  # the launcher's, here


class Fetch:
    """A fetch on another thread as `fetch_record` makes one: under the fetch lock it has read the controller's copy
    of the summary on the site (CONTROLLERS); then, under the summary lock too, it reads the copy here and writes the
    two merged. It stops `at` "site" (after its read of the site, before the summary lock) or "here" (after its read
    of the copy here) until the resume waits for a lock it holds, or moves the summary without one (then it writes,
    as a fetch would, whatever the move did)."""

    def __init__(self, jd: JobDir, monkeypatch: pytest.MonkeyPatch, *, at: Literal["site", "here"]) -> None:
        self.jd, self.at = jd, at
        self.holding, self.resume_came = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._fetch)
        held = (FETCH_LOCK,) if at == "site" else (FETCH_LOCK, SUMMARY_LOCK)
        flock, move = fcntl.flock, LocalFiles.move

        def flocking(fd: Any, op: int) -> None:  # the resume at a lock the fetch holds: let the fetch write
            path = os.readlink(f"/proc/self/fd/{fd if isinstance(fd, int) else fd.fileno()}")
            if threading.current_thread() is not self.thread and path.endswith(held) and self.holding.is_set():
                self.resume_came.set()
            flock(fd, op)

        def moving(files: LocalFiles, src: str, dst: str) -> bool:  # a move without the lock: the fetch writes now
            moved = move(files, src, dst)
            if "summary" in src and self.holding.is_set():
                self.resume_came.set()
            return moved

        monkeypatch.setattr(fcntl, "flock", flocking)
        monkeypatch.setattr(LocalFiles, "move", moving)

    def start(self) -> None:
        self.thread.start()
        assert self.holding.wait(timeout=10)

    def written(self) -> None:
        """Until the fetch has written (at once where it wrote before the resume's move)."""
        self.thread.join(timeout=10)
        assert not self.thread.is_alive()

    def _fetch(self) -> None:
        with fetching(self.jd.path):
            if self.at == "site":
                self._stop()
            with summary_lock(self.jd.path):
                here = json.loads(self.jd.summary_json.read_text()) if self.jd.summary_json.exists() else {}
                if self.at == "here":
                    self._stop()
                self.jd.write_json(self.jd.summary_json, {**CONTROLLERS, **here})

    def _stop(self) -> None:
        self.holding.set()
        self.resume_came.wait(timeout=10)


def test_a_fetch_as_a_resume_sets_the_summary_aside_does_not_put_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, sites = job_run(tmp_path)
    jd = sites.c
    jd.write_json(jd.summary_json, HELD)
    fetch = Fetch(jd, monkeypatch, at="site")  # it read the run before's summary on the site
    seen: list[bool] = []

    def prepare(self: JobRun, aside: str, *, resume: bool, checkpoint: int | None) -> None:
        fetch.written()
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
    fetch = Fetch(jd, monkeypatch, at="here")

    def prepare(self: JobRun, aside: str, *, resume: bool, checkpoint: int | None) -> None:
        fetch.start()  # a `rlctl status` as the resume stages: no summary here, it reads
        raise KeyboardInterrupt

    monkeypatch.setattr(JobRun, "_prepare", prepare)
    with pytest.raises(KeyboardInterrupt):
        run.start(resume=True)
    fetch.written()
    assert json.loads(jd.summary_json.read_text()) == HELD


@pytest.mark.parametrize("hung", ["summary.json", "controller.json"])
def test_a_fetch_that_read_the_run_befores_summary_writes_none_after_the_resume_set_it_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hung: str
) -> None:
    """The resume's move of the summary on the controller's site (`_set_run_before_aside`, as its run stages; its
    controller.json emptied with it) as a `rlctl status` fetch reads the site (`hung` in its read of that file): the
    move waits for the fetch (the fetch lock), whose writes here it then removes; no summary here after (the run
    before's, which would be taken for this run's end), no controller.json (the run before's controller's), and the
    site's summary is aside. Versus the move between the fetch's read of the site and its write here: the run
    before's written back."""
    run, sites = job_run(tmp_path)
    jd = sites.c
    root = tmp_path / "on-the-site"
    root.mkdir()
    (root / "summary.json").write_text(json.dumps(CONTROLLERS))
    (root / "controller.json").write_text(json.dumps({"address": "tcp://10.0.0.7:41234"}))
    jd.write_json(jd.summary_json, HELD)  # fetched back here as the run staged
    run._record = (run.sites["c"], "localhost", str(root))
    read, moved = threading.Event(), threading.Event()
    read_text, flock = LocalFiles.read_text, fcntl.flock

    def reading(files: LocalFiles, path: str) -> str | None:
        text = read_text(files, path)
        if path.endswith(f"/{hung}") and threading.current_thread() is fetch:
            read.set()
            moved.wait(timeout=10)  # until the resume waits for the fetch lock, or moved without it
        return text

    def flocking(fd: Any, op: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd if isinstance(fd, int) else fd.fileno()}")
        if threading.current_thread() is not fetch and path.endswith(FETCH_LOCK):
            moved.set()
        flock(fd, op)

    monkeypatch.setattr(LocalFiles, "read_text", reading)
    monkeypatch.setattr(fcntl, "flock", flocking)
    fetch = threading.Thread(target=fetch_record, args=(jd.path, run.sites["c"], "localhost", str(root)))
    fetch.start()
    try:
        assert read.wait(timeout=10)
        run._set_run_before_aside(LocalFiles(), str(root), "summary.1.json")
    finally:
        moved.set()
        fetch.join(timeout=10)
    assert not jd.summary_json.exists() and not jd.controller_json.exists()
    assert sorted(p.name for p in root.glob("summary*")) == ["summary.1.json"]
    fetch_record(jd.path, run.sites["c"], "localhost", str(root))  # the next fetch: none there, none here
    assert not jd.summary_json.exists() and not jd.controller_json.exists()


@pytest.mark.parametrize("staged", [True, False])
def test_a_refused_resume_puts_the_run_befores_controller_json_and_the_sites_agent_record_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, staged: bool
) -> None:
    """A resume refused once it staged (`staged`: a checkpoint its job.json cannot run on, a site short of slots) or
    before (staging failed): the run before's controller.json here and on the controller's site, and the site's
    agents.jsonl (the units its controller started, recorded there alone: `rlctl status` lists them, `rlctl stop`
    and the next resume stop those left), are as they were. Before: the copy here removed and the site's two emptied
    for good (a stop then found no unit the controller had started)."""
    run, sites = job_run(tmp_path)
    jd = sites.c
    root = tmp_path / "on-the-site"
    root.mkdir()
    address = json.dumps({"address": "tcp://10.0.0.7:41234"})
    units = json.dumps({"name": "rollout-3", "role": "rollout", "site": "c", "ident": {"pid": 7}}) + "\n"
    (root / "summary.json").write_text(json.dumps(CONTROLLERS))
    (root / "controller.json").write_text(address)
    (root / "agents.jsonl").write_text(units)
    jd.write_json(jd.summary_json, HELD)
    jd.controller_json.write_text(address)

    def prepare(self: JobRun, aside: str, *, resume: bool, checkpoint: int | None) -> None:
        if staged:
            self._record = (self.sites["c"], "localhost", str(root))
            self._set_run_before_aside(LocalFiles(), str(root), aside)
            assert (root / "controller.json").read_text() == (root / "agents.jsonl").read_text() == ""
        assert not jd.controller_json.exists()  # (no address of the run before asked while this one starts)
        raise KeyboardInterrupt

    monkeypatch.setattr(JobRun, "_prepare", prepare)
    with pytest.raises(KeyboardInterrupt):
        run.start(resume=True)
    assert jd.controller_json.read_text() == address
    assert (root / "controller.json").read_text() == address and (root / "agents.jsonl").read_text() == units
    assert json.loads(jd.summary_json.read_text()) == HELD
    assert json.loads((root / "summary.json").read_text()) == CONTROLLERS


@pytest.mark.parametrize("how", ["interrupted", "unopenable"])
def test_a_resume_ended_as_its_start_takes_the_fetch_lock_is_one_that_changed_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A resume's start that ends as it takes the fetch lock, before it set anything aside (Ctrl-C while a `rlctl
    status -w` fetching from a site that does not answer holds it: minutes; a lock that cannot be opened, a
    LaunchError): the job is as it was (`unstarted`: `launch --resume --iterations` puts job.json's count back, and
    the Ctrl-C line says the job is as it was), versus a run taken as started: job.json kept the new count, and the
    line said the job was stopped (every agent)."""
    from rlctl.errors import LaunchError
    from rlctl.launch import record

    run, sites = job_run(tmp_path)
    jd = sites.c
    jd.write_json(jd.summary_json, HELD)
    if how == "interrupted":

        def waiting(f: Any, op: int) -> None:
            raise KeyboardInterrupt

        monkeypatch.setattr(record, "flock", waiting)
    else:
        (jd.path / FETCH_LOCK).mkdir()
    with pytest.raises(KeyboardInterrupt if how == "interrupted" else LaunchError):
        run.start(resume=True)
    assert run.unstarted
    assert json.loads(jd.summary_json.read_text()) == HELD


def test_a_started_resume_removes_the_run_befores_files_it_set_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume whose every agent started: the run before's controller.json (here and on the controller's site) and
    the site's agents.jsonl, which its start set aside for a refusal to put back, are gone, versus kept beside the
    job's own (a gone controller's address, the units stopped before the resume) until the next start; this run's
    record is untouched."""
    run, sites = job_run(tmp_path)
    jd = sites.c
    root = tmp_path / "on-the-site"
    root.mkdir()
    address = json.dumps({"address": "tcp://10.0.0.7:41234"})
    (root / "summary.json").write_text(json.dumps(CONTROLLERS))
    (root / "controller.json").write_text(address)
    (root / "agents.jsonl").write_text(json.dumps({"name": "rollout-3", "role": "rollout"}) + "\n")
    jd.write_json(jd.summary_json, HELD)
    jd.controller_json.write_text(address)
    controller = SimpleNamespace(role="controller")

    def prepare(self: JobRun, aside: str, *, resume: bool, checkpoint: int | None) -> tuple[list[Any], bool]:
        self._record = (self.sites["c"], "localhost", str(root))
        self._set_run_before_aside(LocalFiles(), str(root), aside)
        return [(controller, {})], True

    def listening(self: JobRun, remote: bool) -> str:  # this run's controller writes its own controller.json
        (root / "controller.json").write_text(json.dumps({"address": "tcp://10.0.0.8:50000"}))
        return "tcp://10.0.0.8:50000"

    monkeypatch.setattr(JobRun, "_prepare", prepare)
    monkeypatch.setattr(JobRun, "_start", lambda self, a, env=None, *, controller=None: SimpleNamespace())
    monkeypatch.setattr(JobRun, "_controller_address", listening)
    monkeypatch.setattr(JobRun, "_stop_if_asked", lambda self: None)
    run.start(resume=True)
    assert sorted(p.name for p in jd.path.glob(".*run-before")) == []
    assert sorted(p.name for p in root.glob(".*run-before")) == []
    assert json.loads((root / "controller.json").read_text()) == {"address": "tcp://10.0.0.8:50000"}
    assert (root / "agents.jsonl").read_text() == ""  # (the units this run's controller starts go here)
