"""A job's runs as its job dir records them: which run is the latest (`current_run`), that run's summary
(`run_summary`, versus the run before's, set aside as summary.<n>.json: `aside_name`; `ended_run_summary`, a
resume's that died before its run started included; `update_summary`, the launcher's keys written into it), a
`rlctl stop` asked for (`stop_requested`), the resumes that count (`resumes`: less those that ended before any
agent started), and the warnings its launcher recorded for the latest run (`run_warnings`)."""

from __future__ import annotations

import logging
import mmap
import os
import re
import shlex
import time
from pathlib import Path
from typing import Any

from rlctl.errors import LaunchError, RlctlError
from rlctl.launch.jobdir import JobDir, event_time
from rlctl.launch.record import summary_lock
from rlctl.launch.recordfiles import not_a_file
from rlctl.launch.summary import read_summary, replace_damaged, write_summary

log = logging.getLogger(__name__)

STOP_REQUESTED = "stop_requested"  # the event `rlctl stop` writes first (rlctl.ops.stop.stop)
UNSTARTED = "resume_unstarted"  # a resume that ended before any agent started: its `resumed` event is void
# a line the launcher said as it started a run, for that run (`run`: its id; `line`: the line): `rlctl status` shows
# those of the latest run (`run_warnings`), versus said only on the launcher's output (and, detached, launcher.log)
WARNING = "warning"


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


def _controller_started(event: dict[str, Any]) -> bool:
    """Whether an `agent_started` event is a controller's: a run's start (its `run`, the run's id)."""
    return str(event.get("agent", "")).startswith("controller-")


def current_run(jobdir: JobDir) -> str | None:
    """The id of the job's latest run (its controller's `agent_started` event); None before one, or for a run
    started by an rlctl that gave none."""
    runs = [e.get("run") for e in jobdir.read_events("agent_started") if _controller_started(e)]
    return str(runs[-1]) if runs and runs[-1] is not None else None


def run_warnings(jobdir: JobDir) -> list[str]:
    """The warning lines its launcher recorded for the job's latest run (`WARNING` events naming the run of the
    latest controller's `agent_started`, as `current_run` reads it), in one pass over the events that parses only
    the lines naming either kind; none before a run, or for a run started by an rlctl that gave no run id. A file
    that names no warning at all (most jobs') is not parsed: `rlctl status` of a running job reads no events but
    these, each refresh of `-w` (a job of weeks: 640,000 lines, 53 MB, parsed in 0.8 s, searched in 0.07 s)."""
    if not _names(jobdir.events, f'"{WARNING}"'.encode()):
        return []
    run: str | None = None
    lines: list[tuple[str, str]] = []
    for e in jobdir.iter_events("agent_started", WARNING):
        if e.get("event") == "agent_started" and _controller_started(e):
            run = None if e.get("run") is None else str(e["run"])
        elif e.get("event") == WARNING and isinstance(e.get("line"), str):
            lines.append((str(e.get("run")), e["line"]))
    return [line for of, line in lines if run is not None and of == run]


def _names(path: Path, text: bytes) -> bool:
    """Whether the file `path` holds the bytes `text` (searched mapped, never read whole into memory); False where
    there is no such file, or it is empty. A directory in its place is a LaunchError naming it, as `open_record`
    says one (an IsADirectoryError's traceback from `rlctl status`, before); any other OSError passes."""
    try:
        with path.open("rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return False
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                return m.find(text) != -1
    except FileNotFoundError:
        return False
    except IsADirectoryError as e:
        raise not_a_file(path) from e


def run_summary(jobdir: JobDir, run: str | None) -> dict[str, Any] | None:
    """summary.json when the run `run` wrote it; None when there is none, or when it is another run's (the run
    before, fetched back from the controller's site while this one staged). One that names no run (written by an
    rlctl without run ids), or any when `run` is None, is taken."""
    return _read_summary(jobdir, run)[0]


def _read_summary(jobdir: JobDir, run: str | None) -> tuple[dict[str, Any] | None, str]:
    """`run_summary`, and where it is the end read from the events in place of a file that does not read, what is
    wrong with that file ("" where it reads)."""
    read = read_summary(jobdir.summary_json)
    if read is None:
        return None, ""
    summary, problem = read
    if summary is None:
        return _summary_from_events(jobdir, run, problem), problem
    if run is not None and summary.get("run") not in (None, run):
        log.warning("%s is run %s's, not run %s's: not taken", jobdir.summary_json, summary.get("run"), run)
        return None, ""
    return summary, ""


def update_summary(jobdir: JobDir, run: str | None, changes: dict[str, Any]) -> dict[str, Any] | None:
    """Run `run`'s summary.json (`run_summary`) with `changes` (the launcher's keys: held-out figures, its agents'
    exits, a state) written into it; None, nothing written, where there is no summary of that run. One that does not
    read is kept aside whole (summary.json.damaged) and the end read from the events, with `changes`, written in its
    place (`rlctl.launch.summary.replace_damaged`: the repair renamed over it, so a reader finds one or the other),
    versus that short end (state and iterations) written over it as if it were the summary: what the rest of it held
    is kept. Read, changed and written under the summary lock (`summary_lock`), which a fetch of the job's record
    holds as it reads this file and writes it back with the controller's copy: a key written between its read and
    its write was lost (held-out figures, by a `rlctl status` as the launcher evaluated). Not the fetch lock, which
    a fetch holds across its reads of the controller's site: a `rlctl stop` recording exits waited behind a
    `status -w` whose site did not answer."""
    with summary_lock(jobdir.path):
        return _update_summary(jobdir, run, changes)


def _update_summary(jobdir: JobDir, run: str | None, changes: dict[str, Any]) -> dict[str, Any] | None:
    summary, problem = _read_summary(jobdir, run)
    if summary is None:
        return None
    summary.update(changes)
    if not problem:
        write_summary(jobdir.summary_json, summary)
        return summary
    aside, written = replace_damaged(jobdir.summary_json, summary, problem=problem)
    log.warning(
        "%s is kept as %s; the summary written in its place is its run's end as read from %s",
        jobdir.summary_json,
        aside,
        jobdir.events,
    )
    return written


_SAID_DAMAGED: set[str] = set()  # the damaged summaries this process said it read the end of from the events


def _summary_from_events(jobdir: JobDir, run: str | None, problem: str) -> dict[str, Any]:
    """A summary.json that does not read (`problem`) — edited or damaged since, as rlctl writes it whole (renamed
    into place): how run `run` ended, from its controller's `job_end` event, written beside it in events.jsonl, the
    job's record of what happened (state and iterations; `summary_damaged` says why the rest is missing), said once a
    process. Every command reads the end as that (a plain resume, `status`, `scale`, `stop` and `report` failed on it,
    exit 1, where `launch --resume --iterations` read it as no summary and went ahead). LaunchError, one line naming
    the file and what to do, where the events have no end of that run."""
    said = f"{jobdir.summary_json}: {problem}"
    end = _run_end_event(jobdir, run)
    if end is None:
        raise LaunchError(
            said,
            hint="rlctl writes it whole, so it was edited or damaged since, and events.jsonl has no end of its run to "
            "read instead: put it back from a copy, or move it aside (the run then ended without a summary)",
        )
    if said not in _SAID_DAMAGED:
        _SAID_DAMAGED.add(said)
        log.warning("%s; how its run ended is read from %s (job_end: %s)", said, jobdir.events, end.get("state"))
    return {"state": end.get("state"), "iterations": end.get("iterations"), "run": run, "summary_damaged": said}


def _run_end_event(jobdir: JobDir, run: str | None) -> dict[str, Any] | None:
    """Run `run`'s `job_end` event (its controller writes it as it writes summary.json): the first after that run's
    controller started (`run` None: after the latest controller's start); None before its run ended."""
    events = jobdir.read_events("agent_started", "job_end")
    starts = [
        i
        for i, e in enumerate(events)
        if e.get("event") == "agent_started"
        and str(e.get("agent", "")).startswith("controller-")
        and (run is None or e.get("run") == run)
    ]
    after = starts[-1] + 1 if starts else 0
    if run is not None and not starts:
        return None
    return next((e for e in events[after:] if e.get("event") == "job_end"), None)


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


def event_or_unrecorded(
    jd: JobDir, kind: str, unrecorded: list[str], *, then: str = "", **fields: Any
) -> dict[str, Any]:
    """The event `kind` appended to the job's events.jsonl (`JobDir.event`), for a command that must go on where it
    cannot be (another user's job dir, a read-only mount: `rlctl stop`, whose agents are stopped all the same): a
    line in `unrecorded` (the command says it) naming the file, what its absence does (`then`) and where to look,
    versus the OSError's traceback (a stop's first event, its request: nothing stopped). The row either way (the
    controller's site may take it: `rlctl.launch.record.event_to_record`)."""
    row = {"t": round(time.time(), 3), "event": kind, **fields}
    try:
        jd.append(jd.events, row)
    except OSError as e:
        look = f"look at its owner and permissions: `ls -la {shlex.quote(str(jd.path))}`"
        unrecorded.append(
            f"{jd.events}: cannot record the {kind} event ({e.strerror or e})"
            + (f": {then}" if then else "")
            + f" ({look})"
        )
    return row


def stop_requested(jobdir: JobDir, *, since: float) -> bool:
    """Whether `rlctl stop` was asked for the job at or after `since` (time.time()): its `stop_requested` event.
    Only the lines that name it are parsed (the others blank, for the line numbers): a launcher asks before each
    agent it starts. A damaged one is left out and said once, bytes that are no UTF-8 too (`JobDir.read_events`,
    a line at a time, versus the whole file read as text: a UnicodeDecodeError traceback from the launcher)."""
    return any(event_time(e) >= since for e in jobdir.read_events(STOP_REQUESTED))
