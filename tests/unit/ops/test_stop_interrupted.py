"""`rlctl stop` cut short by Ctrl-C says what it left: typer ended it with exit 130 and no word, so a stop whose
request was written (the launcher then never resumes the job) but never seen through read as one that did nothing."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from rlctl.launch.jobdir import JobDir
from rlctl.ops import stop as opstop
from rlctl.ops.jobref import JobRef, resolve
from tests.conftest import run_cli
from tests.unit.job_rows import indexed_row


def _running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JobDir:
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("demo", explicit=tmp_path / "demo-1")
    indexed_row("demo-1", jd.path, job="demo", state="running")
    jd.event("controller_listening", address="tcp://127.0.0.1:1")
    return jd


def test_ctrl_c_while_the_stop_waits_for_the_controller_says_the_stop_is_not_seen_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jd = _running(tmp_path, monkeypatch)

    def ctrl_c(ref: JobRef, kind: str, body: Any = None, *, timeout_s: float) -> dict[str, Any]:
        raise KeyboardInterrupt  # while it waits for the controller's answer to `shutdown`

    monkeypatch.setattr(opstop, "ask_controller", ctrl_c)
    r = run_cli("stop", "demo-1")
    assert r.exit_code == 130 and r.stdout == ""
    assert r.stderr == (
        "rlctl: interrupted: the stop of job demo-1 was asked for but not seen through (its launcher will not resume "
        "the job); `rlctl stop demo-1` again finishes it, `rlctl status demo-1` says where the job stands\n"
    )
    assert [e["event"] for e in jd.read_events()] == ["controller_listening", opstop.STOP_REQUESTED]


def test_ctrl_c_before_the_stop_asked_anything_says_the_job_was_not_asked_to_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jd = _running(tmp_path, monkeypatch)
    long_ago = time.time() - 3600  # an earlier stop, seen through, then a resume: not this stop's request
    earlier = [{"event": opstop.STOP_REQUESTED}, {"event": "stopped_by_operator"}, {"event": "controller_listening"}]
    with jd.events.open("a") as f:
        f.writelines(json.dumps({"t": long_ago, **e}) + "\n" for e in earlier)

    def ctrl_c(_: JobDir) -> bool:
        raise KeyboardInterrupt

    monkeypatch.setattr(opstop, "stop_under_way", ctrl_c)
    r = run_cli("stop", "demo-1")
    assert r.exit_code == 130
    assert r.stderr == "rlctl: interrupted: job demo-1 was not asked to stop (`rlctl status demo-1`)\n"


@pytest.mark.parametrize("t", [None, "yesterday", True])
def test_an_event_without_a_number_for_its_time_is_read_as_before_the_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, t: Any
) -> None:
    """An event whose `t` is null or text (edited by hand) is older than the stop, as one without a `t` was: `float`
    of it was a TypeError/ValueError traceback in the Ctrl-C line of stop, and in the launcher's stop check."""
    from rlctl.ops.runstate import stop_requested

    jd = _running(tmp_path, monkeypatch)
    with jd.events.open("a") as f:
        f.write(json.dumps({"t": t, "event": opstop.STOP_REQUESTED}) + "\n")
    ref = resolve("demo-1")
    assert (
        opstop.stop_cut_short(ref, since=time.time() - 60) == "job demo-1 was not asked to stop (`rlctl status demo-1`)"
    )
    assert stop_requested(jd, since=time.time() - 60) is False
