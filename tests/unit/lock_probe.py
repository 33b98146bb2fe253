"""A `launcher_holder` probe's instant on a launcher lock (a `status -w`, `logs -f` or `stop` holds it shared that
long), for the tests of how a launch takes a lock held by a launcher that is not running here."""

from __future__ import annotations

import fcntl
import time
from pathlib import Path
from typing import TextIO

import pytest


def probed_until_a_retry(lock: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[TextIO, list[float]]:
    """`lock` held shared by a probe that lets go as the launcher first sleeps to try again (`time.sleep`
    patched): the probe's file, and the seconds each sleep was asked for."""
    probe = lock.open("r")
    fcntl.flock(probe.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        probe.close()

    monkeypatch.setattr(time, "sleep", sleep)
    return probe, slept
