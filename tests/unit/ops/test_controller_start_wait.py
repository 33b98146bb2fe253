"""The launcher's wait for the controller to listen covers the controller's reward pool's first load: the controller
listens only once a worker has loaded the job's reward (`RewardPool(wait=True)`), within the pool's deadline for it
(`load_deadline_s`: 6 × task.reward_timeout_s, at least 60 s), so a fixed 120 s gave up on a slow import the pool
would still take (reward_timeout_s 30: 180 s)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlctl.config.job import DatasetTask
from rlctl.errors import LaunchError
from rlctl.launch.jobdir import JobDir
from rlctl.ops import run
from rlctl.rl.reward import load_deadline_s


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

    monkeypatch.setattr(run, "CONTROLLER_START_S", 0.2)
    monkeypatch.setattr(run, "load_deadline_s", deadline)
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
