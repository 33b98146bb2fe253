"""The launcher's fetches of the controller site's record (its run's end, its stop) take an OSError (a file here the
fetch could not write; a fetch beside it on a filesystem with no flock) as they take a LaunchError: one line, the
stop going on to record its end, versus the OSError's traceback ending the launcher (the stop's `agents_stopped`
and exits unwritten)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlctl.errors import LaunchError
from rlctl.ops import runbase, runwait
from tests.unit.ops.test_run_summary import _controller_gone_trainer_left


def _fails(job_dir: Path, *view: Any) -> list[str]:
    raise FileNotFoundError(2, "No such file or directory", str(job_dir / ".metrics.jsonl.part"))


def test_the_launchers_wait_says_a_fetch_that_raised_an_oserror_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, run, _, _ = _controller_gone_trainer_left(tmp_path, "pass")
    run._record = (run.sites["train"], "localhost", str(tmp_path / "site-job"))
    monkeypatch.setattr(runwait, "fetch_record", _fails)
    with pytest.raises(LaunchError, match=r"^the job ended \(controller exit 0\); its record on site train could not"):
        run.wait(poll_s=0.01)


def test_the_launchers_stop_goes_on_past_a_fetch_that_raised_an_oserror(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jd, run, _, _ = _controller_gone_trainer_left(tmp_path, "pass")
    run._record = (run.sites["train"], "localhost", str(tmp_path / "site-job"))
    monkeypatch.setattr(runbase, "fetch_record", _fails)
    with pytest.raises(LaunchError, match=r"^cannot fetch the job's record from site train: .*No such file"):
        run.stop(grace_s=5)
    assert [e["exits"] for e in jd.read_events() if e["event"] == "agents_stopped"] == [
        {"controller-0": 0, "trainer-0": 0}
    ]
