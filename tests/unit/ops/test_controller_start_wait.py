"""The launcher's wait for the controller to listen covers the controller's reward pool's first load: the controller
listens only once a worker has loaded the job's reward (`RewardPool(wait=True)`), within the pool's deadline for it
(`load_deadline_s`: 6 × task.reward_timeout_s, at least 60 s), so a fixed 120 s gave up on a slow import the pool
would still take (reward_timeout_s 30: 180 s)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlctl.config.task import DatasetTask
from rlctl.errors import LaunchError, Stopped
from rlctl.launch.jobdir import JobDir
from rlctl.ops import run, runbase, runstart, runstate
from rlctl.rl.reward_pool import load_deadline_s


def test_the_deadline_for_a_reward_load_follows_its_timeout_unless_the_job_sets_one() -> None:
    assert load_deadline_s(10.0) == 60.0 and load_deadline_s(30.0) == 180.0
    assert load_deadline_s(10.0, 600.0) == 600.0 and load_deadline_s(10.0, 5.0) == 5.0


def test_the_launcher_waits_for_the_controller_as_long_as_its_reward_may_take_to_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[float, float | None]] = []

    def deadline(timeout_s: float, load_timeout_s: float | None = None) -> float:
        seen.append((timeout_s, load_timeout_s))
        return 0.6

    monkeypatch.setattr(runstart, "CONTROLLER_START_S", 0.2)
    monkeypatch.setattr(runstart, "load_deadline_s", deadline)
    r = object.__new__(run.JobRun)  # only what the wait reads: a controller that runs and never listens
    r.jobdir = JobDir.create("j", explicit=tmp_path / "j")
    task = DatasetTask(kind="dataset", path="rows.jsonl", reward="r.py:f", reward_timeout_s=30, reward_load_timeout_s=9)
    r.spec = SimpleNamespace(task=task)
    r.controller = SimpleNamespace()
    r.poll = lambda h: None  # type: ignore[method-assign]
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match="did not listen within 1 s"):
        r._controller_address(remote=False)
    assert time.monotonic() - t0 >= 0.8 and seen == [(30.0, 9.0)]


def test_a_controller_that_exits_before_listening_is_one_line_quoting_its_error(tmp_path: Path) -> None:
    """The error names the log and quotes its last ERROR record; before, it was the log's last 15 lines joined,
    printed as one line full of literal \\n."""
    tail = "\n".join(
        [
            "2026-12-04 16:44:20,382 INFO controller-0 rlctl.agents: starting on vm, pid 23684",
            "2026-12-04 16:44:22,507 ERROR controller-0 rlctl.agents: job.json: task.reward: r.py: cannot import: "
            "RuntimeError: gone",
            "2026-12-04 16:44:22,514 INFO controller-0 rlctl.agents: cpu 0.8 s (user 0.7, sys 0.0)",
        ]
    )
    r = object.__new__(run.JobRun)
    r.jobdir = JobDir.create("j", explicit=tmp_path / "j")
    r.spec = SimpleNamespace(task=None)
    log_path = tmp_path / "j" / "logs" / "controller-0.log"
    r.controller = SimpleNamespace(spec=SimpleNamespace(log_path=log_path))
    r.stop_since = time.time()
    r.poll = lambda h: 1  # type: ignore[method-assign]
    r.log_tail = lambda role, replica, lines=15: tail  # type: ignore[method-assign]
    with pytest.raises(LaunchError) as e:
        r._controller_address(remote=False)
    assert str(e.value) == (
        f"the controller exited with 1 before listening (its log: {log_path}): job.json: task.reward: r.py: cannot "
        "import: RuntimeError: gone"
    )
    assert e.value.hint == "fix what its log says, then launch the job again"
    assert runbase.last_error("INFO only\nno error here") == ""
    assert runbase.last_error("t ERROR a b: " + "x" * 500) == ": " + "x" * 399 + "…"


def test_a_controller_that_exits_before_listening_on_rlctl_stop_ends_the_start_stopped(tmp_path: Path) -> None:
    """`rlctl stop` while the controller starts (a resume loading its checkpoint, a slow reward import): it exits
    143 on the stop's TERM before listening, and the launch ends Stopped (the index: stopped), versus `the controller
    exited with 143 (SIGTERM) before listening` (a failure, exit 1) before."""
    r = object.__new__(run.JobRun)
    r.jobdir = JobDir.create("j", explicit=tmp_path / "j")
    r.spec = SimpleNamespace(task=None)
    r.stop_since = time.time() - 1
    r.controller = SimpleNamespace(spec=SimpleNamespace(log_path=tmp_path / "controller-0.log"))
    r.poll = lambda h: 143  # type: ignore[method-assign]
    r.log_tail = lambda role, replica, lines=15: ""  # type: ignore[method-assign]
    stopped: list[bool] = []

    def stopped_while_starting() -> None:
        stopped.append(True)
        raise Stopped("stopped while its launcher started a run")

    r._stopped_while_starting = stopped_while_starting  # type: ignore[method-assign]
    with pytest.raises(LaunchError, match=r"exited with 143 \(SIGTERM\) before listening"):
        r._controller_address(remote=False)  # no stop asked: a failure as before
    r.jobdir.event(runstate.STOP_REQUESTED)
    with pytest.raises(Stopped):
        r._controller_address(remote=False)
    assert stopped == [True]
