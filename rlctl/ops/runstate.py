"""A job's runs as its job dir records them: which run is the latest (`current_run`), that run's summary
(`run_summary`, versus the run before's, set aside as summary.<n>.json: `aside_name`; `ended_run_summary`, a
resume's that died before its run started included), a `rlctl stop` asked for
(`stop_requested`), and the resumes that count (`resumes`: less those that ended before any agent started)."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from rlctl.errors import LaunchError, RlctlError
from rlctl.launch.jobdir import JobDir, event_time

log = logging.getLogger(__name__)

STOP_REQUESTED = "stop_requested"  # the event `rlctl stop` writes first (rlctl.ops.operate.stop)
UNSTARTED = "resume_unstarted"  # a resume that ended before any agent started: its `resumed` event is void


def resumes(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The job's `resumed` events, less those of resumes that ended before any agent of them started (a refused
    --checkpoint, a site short of slots, a stop while staging): the job went on as it was, from none of them."""
    out: list[dict[str, Any]] = []
    for e in events:
        if e.get("event") == "resumed":
            out.append(e)
        elif e.get("event") == UNSTARTED and out:
            out.pop()
    return out


SUMMARY_ASIDE = re.compile(r"summary\.(\d+)\.json")  # an earlier run's summary, set aside when the next began


def aside_name(job_dir: Path) -> str:
    """Where the next run sets the job's summary.json aside: summary.<n>.json, n one past the highest there."""
    taken = [int(m.group(1)) for p in job_dir.iterdir() if (m := SUMMARY_ASIDE.fullmatch(p.name))]
    return f"summary.{max(taken, default=0) + 1}.json"


def current_run(jobdir: JobDir) -> str | None:
    """The id of the job's latest run (its controller's `agent_started` event); None before one, or for a run
    started by an rlctl that gave none."""
    started = jobdir.read_events("agent_started")
    runs = [e.get("run") for e in started if str(e.get("agent", "")).startswith("controller-")]
    return str(runs[-1]) if runs and runs[-1] is not None else None


def run_summary(jobdir: JobDir, run: str | None) -> dict[str, Any] | None:
    """summary.json when the run `run` wrote it; None when there is none, or when it is another run's (the run
    before, fetched back from the controller's site while this one staged). One that names no run (written by an
    rlctl without run ids), or any when `run` is None, is taken."""
    if not jobdir.summary_json.exists():
        return None
    summary = jobdir.read_json(jobdir.summary_json)
    if not isinstance(summary, dict):
        raise LaunchError(f"{jobdir.summary_json}: not a JSON object but {type(summary).__name__}")
    if run is not None and summary.get("run") not in (None, run):
        log.warning("%s is run %s's, not run %s's: not taken", jobdir.summary_json, summary.get("run"), run)
        return None
    return summary


def ended_run_summary(jobdir: JobDir, run: str | None) -> dict[str, Any] | None:
    """`run_summary`; else, where no launcher holds the job, run `run`'s own summary that a resume set aside (the
    latest summary.<n>.json) and could not put back: its launcher gone (a reboot, SIGKILL) before any agent of its
    own run started, `run` still the latest. `rlctl status` read that job as one whose controller exited without a
    summary, versus how its run ended. None for a summary that names no run, or does not read."""
    summary = run_summary(jobdir, run)
    if summary is not None or run is None or jobdir.launcher_holder() is not None:
        return summary
    aside = [int(m.group(1)) for p in jobdir.path.iterdir() if (m := SUMMARY_ASIDE.fullmatch(p.name))]
    if not aside:
        return None
    try:
        last = jobdir.read_json(jobdir.path / f"summary.{max(aside)}.json")
    except (OSError, RlctlError):
        return None
    return last if isinstance(last, dict) and last.get("run") == run else None


def stop_requested(jobdir: JobDir, *, since: float) -> bool:
    """Whether `rlctl stop` was asked for the job at or after `since` (time.time()): its `stop_requested` event.
    Only the lines that name it are parsed (the others blank, for the line numbers): a launcher asks before each
    agent it starts. A damaged one is left out and said once, bytes that are no UTF-8 too (`JobDir.read_events`,
    a line at a time, versus the whole file read as text: a UnicodeDecodeError traceback from the launcher)."""
    return any(event_time(e) >= since for e in jobdir.read_events(STOP_REQUESTED))
