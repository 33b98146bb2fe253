"""A resumed controller's scale events of the job's history (`scale_history` → `ScaleLog`): fed one at a time as
events.jsonl is read, so that a job of weeks, with many scale events, holds its latest only at a resume."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

from rlctl.agents.books import SCALE_EVENTS_KEPT, ScaleLog
from rlctl.agents.ledger import Ledger
from rlctl.checkpoint.controller import save_controller
from rlctl.launch.agentenv import ENV_RESUME
from rlctl.launch.jobdir import JobDir, abandoned, resume_points
from tests.unit.controller_harness import HandledController, resumed_measured, small_job

JOB = small_job("history", iterations=12)
SCALE = {"site": "local", "reason": "manual", "delta_s": None, "delta_prime_s": None}


def _jobs_with_history(root: Path, *, scales: tuple[int, ...]) -> list[JobDir]:
    """Jobs (one a count of `scales`) whose events.jsonl holds that many scale events (out, in, …) at iterations
    0 … 9, then a resume from v4 (those at 4 and past it before that resume were abandoned), then as many again;
    their controller's checkpoint is v6."""
    h = HandledController(root / "made", JOB, listen="inproc://history-made")
    h.close()
    state = {"iteration": 6, "ranker": {"tokens": [], "lengths": []}, "rebalance_window": [], "samples_log_bytes": 0}
    save_controller(h.jd, 6, state=state, ledger=Ledger(), trainer_digest="d" * 64)
    jobs = []
    for n in scales:
        jd = JobDir(Path(shutil.copytree(h.jd.path, root / f"job-{n}")))
        t = 1_000_000.0
        with jd.events.open("a") as f:
            for run in range(2):
                for i in range(n // 2):
                    t += 1.0
                    direction = "out" if i % 2 == 0 else "in"
                    row = {"t": t, "event": "scale", "direction": direction, "agent": f"rollout-{run}-{i}"}
                    f.write(json.dumps(row | {"iteration": i % 10, **SCALE}) + "\n")
                if run == 0:
                    t += 1.0
                    f.write(json.dumps({"t": t, "event": "resumed_from", "version": 4}) + "\n")
        jobs.append(jd)
    return jobs


def _resumed(jd: JobDir, *, listen: str, monkeypatch: Any) -> tuple[ScaleLog, int]:
    """The scale log of a controller resumed from v6 in `jd`, and the most memory its resume held at once."""
    ctl, peak = resumed_measured(jd, JOB, listen=listen, monkeypatch=monkeypatch)
    return ctl.scaler.scale_log, peak


def _as_before(jd: JobDir, version: int) -> ScaleLog:
    """The scale log a resume made before: every scale event of the history in a list, then the log of it."""
    before = jd.read_events("scale", "resumed_from")
    resumes = [*resume_points(before), (math.inf, version)]
    return ScaleLog(
        [
            {k: v for k, v in e.items() if k not in ("t", "event")}
            for e in before
            if e.get("event") == "scale" and not abandoned(e, resumes)
        ]
    )


def _state(log: ScaleLog) -> tuple[list[dict[str, Any]], dict[str, int], int]:
    return log.latest(), dict(log.totals), log.unlisted()


def test_a_resume_holds_the_latest_scale_events_only_and_keeps_the_same_log(tmp_path: Path, monkeypatch) -> None:
    """A history of 20,000 scale events, resumed: the controller's resume takes no more memory than with 400 (its
    ScaleLog lists the latest SCALE_EVENTS_KEPT, fed one event at a time), versus some 22 MB more: every scale event
    of the job's history parsed into a list before the log kept its latest. The log is the one it made before:
    the same events listed, counted, unlisted (those of the run the resume to v4 abandoned left out)."""
    small, large = _jobs_with_history(tmp_path, scales=(400, 20_000))
    monkeypatch.setenv(ENV_RESUME, "6")
    small_log, small_peak = _resumed(small, listen="inproc://history-small", monkeypatch=monkeypatch)
    large_log, large_peak = _resumed(large, listen="inproc://history-large", monkeypatch=monkeypatch)
    for jd, log in ((small, small_log), (large, large_log)):
        assert _state(log) == _state(_as_before(jd, 6))
    # those at 4 and past it of the first run abandoned, and at 6 and past it of the second (the checkpoint's)
    assert large_log.totals == {"out": 5_000, "in": 5_000} and len(large_log) == SCALE_EVENTS_KEPT
    assert large_peak - small_peak < 1_000_000, (small_peak, large_peak)
