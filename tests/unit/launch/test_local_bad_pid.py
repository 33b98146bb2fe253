"""A pid or pgid no process can have, read from a file (a hand-edited agents.jsonl, a `.pull-PID` folder: one past a
C int, 0, a negative one, pgid 1) names no process: not alive, nothing signalled, versus os.kill's OverflowError
traceback, or `kill`/`killpg` given 0 (this process's own group: `rlctl stop` signalling itself) or pgid 1 (every
process) and the group read as alive."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlctl import procfs
from rlctl.launch.base import AgentHandle, AgentSpec
from rlctl.launch.local import LocalBackend
from rlctl.ops.pull import _abandoned

UNUSABLE = [2**31, 99999999999999999999, 0, -1]


@pytest.mark.parametrize("pid", UNUSABLE)
def test_a_pid_no_process_can_have_is_not_alive(pid: int) -> None:
    assert not procfs.alive(pid)


def test_a_pull_folder_naming_a_pid_past_a_c_int_is_abandoned(tmp_path: Path) -> None:
    (tmp_path / ".pull-99999999999").mkdir()
    assert _abandoned(tmp_path) == [tmp_path / ".pull-99999999999"]


@pytest.mark.parametrize("pgid", [*UNUSABLE, 1])
def test_stop_signals_no_group_for_a_pgid_no_group_can_have(monkeypatch: pytest.MonkeyPatch, pgid: int) -> None:
    sent: list[tuple[int, int]] = []

    def killpg(pgid: int, sig: int) -> None:  # recorded, never sent
        sent.append((pgid, sig))
        raise ProcessLookupError

    monkeypatch.setattr(os, "killpg", killpg)
    # no start time (an older rlctl's record): nothing tells that the pid was reused, the group is taken as the agent's
    handle = AgentHandle(AgentSpec("rollout", 0, "local", []), {"pid": pgid, "pgid": pgid}, "local")
    backend = LocalBackend()
    backend.stop([handle], grace_s=0)
    assert backend.poll(handle) is not None
    assert sent == []
