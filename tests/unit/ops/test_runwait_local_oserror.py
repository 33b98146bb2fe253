"""The launcher's wait for its run, where a file of the job dir here does not read (summary.json a symlink loop:
ELOOP, root or not; another user's, a disk's error alike): one RlctlError naming the file and the OS's reason, versus
the OSError's traceback out of `rlctl launch`; not a LaunchError, which the automatic resume takes for the run's
failure (and resumes a run that may have finished). The launcher's stop after it (its `finally`) records what it can,
the summary it cannot said in one warning line naming the file, versus the same OSError's traceback in the wait's
place and the stop's `agents_stopped` unwritten."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from rlctl.errors import LaunchError, RlctlError
from tests.unit.ops.test_run_summary import _controller_gone_trainer_left


def test_a_summary_that_does_not_read_as_the_run_ends_is_one_line_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    jd, run, _, _ = _controller_gone_trainer_left(tmp_path, "pass")
    os.symlink(jd.summary_json.name, jd.summary_json)  # (it points at itself)
    with pytest.raises(RlctlError) as e:
        run.wait(poll_s=0.01)
    assert not isinstance(e.value, LaunchError)
    assert str(e.value) == (
        f"{jd.summary_json}: the launcher could not read or write it as it waited for the run (Too many levels of "
        "symbolic links)"
    )
    assert f"`ls -la {jd.path}`" in str(e.value.hint)
    run.stop(grace_s=5)
    assert [e["exits"] for e in jd.read_events() if e["event"] == "agents_stopped"] == [
        {"controller-0": 0, "trainer-0": 0}
    ]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"{jd.summary_json}: Too many levels of symbolic links: agent_exits not written into it" in warned
