"""rlctl.exits: how a process that may have formed a gloo group ends (os._exit, its code kept)."""

from __future__ import annotations

import atexit
import io
import os
import sys

import pytest

from rlctl import exits


class _Full(io.StringIO):
    def flush(self) -> None:
        raise OSError(28, "No space left on device")


class _Ended(Exception):
    pass


@pytest.mark.parametrize(
    ("stream", "replaced"),
    [("stdout", _Full()), ("stderr", _Full()), ("stdout", None)],
    ids=["stdout", "stderr", "none"],
)
def test_a_stream_that_does_not_flush_still_ends_by_os_exit_with_the_code(
    monkeypatch, stream: str, replaced: io.StringIO | None
) -> None:
    # a log on a full disk (or no stdout at all): its error escaped before os._exit, and the process went through the
    # finalization
    ended: list[int] = []

    def fake_exit(code: int) -> None:
        ended.append(code)
        raise _Ended

    monkeypatch.setattr(os, "_exit", fake_exit)
    monkeypatch.setattr(atexit, "_run_exitfuncs", lambda: None)  # (this process's own handlers stay)
    monkeypatch.setattr(sys, stream, replaced)
    with pytest.raises(_Ended):
        exits.end_without_finalization(143)
    assert ended == [143]
