"""A launcher lock whose holder line names a pid no process can have (a hand-edited `.launcher.lock`: one past a C
int, or 0) is held by no live launcher here: the launch tries again as for a gone launcher's, and takes it once the
holder of the moment (a `status -w` probe) lets go, versus the OverflowError's traceback of `os.kill` (a huge pid)
or pid 0 taken for a live launcher (`kill(0, 0)` signals this process's own group): refused at once."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rlctl.launch.jobdir import JobDir
from tests.unit.lock_probe import probed_until_a_retry


@pytest.mark.parametrize("pid", ["99999999999999999999", "0"], ids=["past-a-c-int", "zero"])
def test_a_launcher_lock_naming_an_unusable_pid_is_taken_once_let_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pid: str
) -> None:
    jd = JobDir.create("demo", explicit=tmp_path / "j")
    lock = jd.path / ".launcher.lock"
    lock.write_text(f"pid {pid} on {socket.gethostname()}\n")
    probe, slept = probed_until_a_retry(lock, monkeypatch)  # a probe's instant, over as the launcher retries
    with jd.launcher_lock():
        assert lock.read_text().startswith("pid ") and f"pid {pid} " not in lock.read_text()
    assert len(slept) == 1 and probe.closed
