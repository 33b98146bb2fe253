"""A controller that gets SIGTERM (the agent's handler: SystemExit 143) with no stop asked for — a SLURM time limit, a
pre-emption, a `kill` — ends the run failed, which `checkpoint.auto_resume` resumes; a stop asked for (`rlctl stop`,
whose request it may not have answered, or its launcher's own stop) still ends it `stopped`."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.agents import controller
from rlctl.agents.messages import LAUNCHER_STOP
from tests.unit.controller_harness import HandledController, small_job


@pytest.mark.parametrize(
    ("before", "state"),
    [
        (None, "failed: controller got SIGTERM"),  # before: "stopped", and no auto-resume
        (LAUNCHER_STOP, "stopped"),  # the launcher's own stop (Ctrl-C) TERMs it
        ("stop_requested", "stopped"),  # `rlctl stop`, its request not answered: forced
    ],
)
def test_sigterm_with_no_stop_asked_for_ends_the_run_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: str | None, state: str
) -> None:
    monkeypatch.setattr(controller, "BYE_WAIT_S", 0.0)
    h = HandledController(tmp_path, small_job("term", iterations=6), listen=f"inproc://term-{before}")
    try:
        if before is not None:
            h.jd.event(before)

        def terminated(now: float) -> None:
            raise SystemExit(143)  # what `rlctl.agents.__main__._on_sigterm` raises in the loop

        monkeypatch.setattr(h.ctl.scaler, "tick", terminated)
        with pytest.raises(SystemExit):
            h.ctl.run()
        assert h.jd.read_json(h.jd.summary_json)["state"] == state
        assert [e["state"] for e in h.jd.read_lines(h.jd.events) if e["event"] == "job_end"] == [state]
    finally:
        h.close()


def test_a_second_sigterm_while_it_waits_for_the_byes_still_writes_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the first SIGTERM ends the loop; the second comes while `_shutdown` waits for the agents' byes (they are slow
    # to stop): before, it raised out of the wait, and no summary.json or job_end was written
    h = HandledController(tmp_path, small_job("term2", iterations=6), listen="inproc://term-twice")
    try:

        def terminated(*_: object, **__: object) -> None:
            raise SystemExit(143)  # what `rlctl.agents.__main__._on_sigterm` raises

        monkeypatch.setattr(h.ctl.scaler, "tick", terminated)
        monkeypatch.setattr(h.ctl.inbox, "get", terminated)  # the wait: no agent has said bye yet
        with pytest.raises(SystemExit) as e:
            h.ctl.run()
        assert e.value.code == 143
        state = "failed: controller got SIGTERM"
        assert h.jd.read_json(h.jd.summary_json)["state"] == state
        assert [e["state"] for e in h.jd.read_lines(h.jd.events) if e["event"] == "job_end"] == [state]
    finally:
        h.close()
