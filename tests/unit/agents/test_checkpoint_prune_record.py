"""The controller's prune: the job's record says what goes before it goes, so that a controller killed in between
never leaves a checkpoint `completed_checkpoints` offers (status --checkpoints, launch --resume --checkpoint V)
whose controller part is gone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlctl.agents.ledger import Ledger
from rlctl.checkpoint import files
from rlctl.checkpoint.controller import prune_controller, save_controller
from rlctl.launch.jobdir import JobDir
from rlctl.launch.sitefs import LocalFiles
from rlctl.ops.extend import completed_checkpoints
from rlctl.ops.resumepoint import stored_checkpoints

STATE = {"iteration": 0, "ranker": {"tokens": [], "lengths": []}, "rebalance_window": [], "samples_log_bytes": 0}


class Killed(BaseException):
    """The controller killed (SIGKILL, the OOM killer) in the middle of its prune."""


def _job(tmp_path: Path, versions: list[int], *, keep: int) -> JobDir:
    jd = JobDir(tmp_path)
    for v in versions:  # as the controller completes each: its part, then the event
        save_controller(jd, v, state={**STATE, "iteration": v}, ledger=Ledger(), trainer_digest="d" * 64)
        jd.event("checkpoint", version=v, keep=keep)
    return jd


def _offered_but_gone(jd: JobDir) -> list[int]:
    on_disk = set(stored_checkpoints(LocalFiles(), jd))  # what `launch --resume --checkpoint V` finds there
    return [v for v in completed_checkpoints(jd) if v not in on_disk]


@pytest.mark.parametrize("steps_before_kill", [0, 1, 2])
def test_a_kill_in_the_middle_of_a_prune_leaves_no_checkpoint_offered_that_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, steps_before_kill: int
) -> None:
    # the controller removed the parts, then wrote `checkpoints_pruned`: killed in between, v1 and v2 were still
    # listed by `status --checkpoints`, and `--checkpoint 1` then said 'not on the controller's site'
    jd = _job(tmp_path, [1, 2, 3], keep=1)
    steps: list[str] = []  # the prune's three: the event, the removal of v1's part and of v2's
    real_remove, real_event = files.remove_part, jd.event

    def step(name: str) -> None:
        if len(steps) == steps_before_kill:
            raise Killed
        steps.append(name)

    def remove_part(ckpt: Path, part: str) -> None:
        step(ckpt.name)
        real_remove(ckpt, part)

    def event(kind: str, **fields: Any) -> dict[str, Any]:
        if kind == files.PRUNED:
            step(kind)
        return real_event(kind, **fields)

    monkeypatch.setattr(files, "remove_part", remove_part)
    monkeypatch.setattr(jd, "event", event)
    with pytest.raises(Killed):
        prune_controller(jd, complete=[1, 2, 3], keep=1)
    assert _offered_but_gone(jd) == []


def test_a_prune_says_what_it_removed_and_a_later_one_removes_what_a_kill_left(tmp_path: Path) -> None:
    jd = _job(tmp_path, [1, 2, 3], keep=2)
    assert prune_controller(jd, complete=[1, 2, 3], keep=2) == [1]
    assert completed_checkpoints(jd) == [2, 3] and sorted(stored_checkpoints(LocalFiles(), jd)) == [2, 3]
    assert [e["versions"] for e in jd.read_events(files.PRUNED)] == [[1]]
    assert prune_controller(jd, complete=[1, 2, 3], keep=2) == []  # nothing left to go: nothing said
    assert [e["versions"] for e in jd.read_events(files.PRUNED)] == [[1]]
