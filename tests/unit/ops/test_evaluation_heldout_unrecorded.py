"""A finished job's held-out figures that cannot be written into its summary.json (a summary lock that cannot be
opened; a summary damaged since the run's end was read, with no end of its run in the events): one warning line, and
the launch goes on to print its summary with them, versus `add_heldout` raising update_summary's LaunchError: the
launch of a done job exited 1 with its summary unprinted."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rlctl.config.job import load_job
from rlctl.launch.jobdir import JobDir
from rlctl.launch.record import SUMMARY_LOCK
from rlctl.ops.evaluation import add_heldout
from tests.conftest import ROOT

FIGURES = {"prompts": 8, "greedy_reward_first": 0.25, "greedy_reward_last": 0.5}


@pytest.mark.parametrize("why", ["lock", "damaged"])
def test_heldout_figures_that_cannot_be_recorded_are_a_warning_and_the_summary_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, why: str
) -> None:
    job = load_job(ROOT / "jobs" / "demo.yaml")
    spec = job.spec.model_copy(update={"evaluation": job.spec.evaluation.model_copy(update={"heldout_prompts": 8})})
    jd = JobDir.create("demo", explicit=tmp_path / "job")
    jd.event("agent_started", agent="controller-0", run="r1")
    if why == "lock":
        jd.write_json(jd.summary_json, {"state": "done", "iterations": 3, "run": "r1"})
        (jd.path / SUMMARY_LOCK).mkdir()  # (a lock file that cannot be opened)
        said = "cannot open the lock of the job's summary"
    else:
        jd.summary_json.write_text('{"state": "done", "iterat')  # damaged since; no job_end of r1 in the events
        said = f"{jd.summary_json}: "
    before = jd.summary_json.read_text()
    monkeypatch.setattr("rlctl.ops.evaluation.heldout", lambda *_: dict(FIGURES))
    with caplog.at_level(logging.WARNING):
        out = add_heldout(jd, spec, {"state": "done", "iterations": 3, "run": "r1"}, say=lambda _: None)
    assert out == {"state": "done", "iterations": 3, "run": "r1", "heldout": FIGURES}
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith("held-out figures not recorded in the summary here: ")
    assert said in warned[0] and "(hint: " in warned[0]
    assert jd.summary_json.read_text() == before
