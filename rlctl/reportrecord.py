"""A job directory's record as `rlctl report` reads it: JobRecord, `load()`, and what each file's lines must hold.

job.json (its name and mode), metrics.jsonl (runs of rows merged past REPORT_ROWS), events.jsonl (its scale events
alone parsed), evaluations.jsonl, summary.json, the checkpoints' table ──▶ load() ──▶ JobRecord

Only job.json is required: a running job may have written nothing yet. A line that does not parse, or lacks a field
the report reads, is an RlctlError naming the file and the line (the job's state: exit 1).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl import reportrows
from rlctl.errors import RlctlError, UsageError
from rlctl.launch.jobdir import JobDir, abandoned, resume_points
from rlctl.launch.recordfiles import open_record, record_text
from rlctl.ops.runstate import run_summary
from rlctl.reportrows import MERGED

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobRecord:
    """What a job directory holds, read once; `summary` is None until the job ended."""

    name: str
    mode: str
    rows: list[dict[str, Any]]
    events: list[dict[str, Any]]
    summary: dict[str, Any] | None
    evaluations: list[dict[str, Any]] = field(default_factory=list)  # held-out evaluations during the run
    checkpoints: list[dict[str, Any]] = field(default_factory=list)  # `rlctl.ops.checkpoints.checkpoint_table`'s
    manifests_checked: list[str] = field(default_factory=list)  # the parts whose manifests it checked (its own)
    ended: str | None = None  # how the job ended by its record (`build_report`'s), for a run that left no summary

    @property
    def iterations(self) -> int:
        """The metrics rows read (`rows` holds runs of them merged where they were more than `REPORT_ROWS`)."""
        return sum(int(r.get(MERGED, 1)) for r in self.rows)

    @property
    def merged(self) -> int:
        """How many iterations a row of `rows` stands for (1 where none was merged; the last may stand for fewer)."""
        return max((int(r.get(MERGED, 1)) for r in self.rows), default=1)

    @property
    def state(self) -> str:
        """The summary's state; without one, the end its record knows (a controller killed: `stop --grace 0`, the
        OOM killer) or that the job runs: `running (no summary.json yet)` was said of a job stopped for good."""
        if self.summary is not None:
            return str(self.summary.get("state"))
        if self.ended is not None:
            return f"{self.ended} (no summary.json: its last run ended without writing one)"
        return "running (no summary.json yet)"

    @property
    def scales(self) -> list[dict[str, Any]]:
        """The scale events of the iterations the curves show: not those of a run at or past the checkpoint a later
        resume went back to (its `resumed_from` version v; their rows, v's too, went to metrics.discarded.jsonl),
        which were drawn on the resumed run's iterations ('-rollout-2' at 39 of a run that never had it). A scale at
        v came after the checkpoint's state was taken, or is in its units, which the resumed run starts again with
        its own events."""
        resumes = resume_points(self.events)
        return [
            _failed_start(i, self.events)
            for i, e in enumerate(self.events)
            if e.get("event") == "scale" and not abandoned(e, resumes)
        ]


# the events that say a unit started never joined, and the field that names it: a unit asked for not joined within
# its bound (`scale_failed`), one that exited first (`unit_exited_before_joining`), a replacement's attempt not joined
# within its bound (`replacement_not_joined`, by the unit)
NEVER_JOINED = {"scale_failed": "agent", "unit_exited_before_joining": "agent", "replacement_not_joined": "by"}


EXITED_FIRST = "exited before it joined (its log says why)"


def _failed_start(i: int, events: list[dict[str, Any]]) -> dict[str, Any]:
    """A scale "out" of a unit that never joined (one of `NEVER_JOINED` of it follows, before any later start of that
    name) with its error as `failed`: a failed start, not a unit the job ran with; any other event as it is. `i`: the
    event's place in `events`."""
    e = events[i]
    if e.get("direction") != "out" or e.get("agent") is None:
        return e
    for later in events[i + 1 :]:
        kind = later.get("event")
        if kind in NEVER_JOINED and later.get(NEVER_JOINED[kind]) == e["agent"]:
            why = later.get("error") or (EXITED_FIRST if kind == "unit_exited_before_joining" else "it never joined")
            return {**e, "failed": str(why)}
        if kind == "scale" and later.get("direction") == "out" and later.get("agent") == e["agent"]:
            break
    return e


# -- reading ----------------------------------------------------------------------------------------


def load(job_dir: Path) -> JobRecord:
    job_json = job_dir / "job.json"
    JobDir(job_dir).refuse_lost_job_json()
    if not job_json.is_file():
        raise UsageError(f"{job_dir}: not a job directory (no job.json)")
    record = _read_json(job_json)
    # read as written (a job of an older rlctl too): only these two fields
    name, mode = str(_field(job_json, record, "job.name")), str(_field(job_json, record, "job.pipeline.mode"))
    summary_json = job_dir / "summary.json"
    # one that does not read is its run's end as its events say it (`run_summary`), as status and resume read it
    summary = run_summary(JobDir(job_dir), None)
    if summary is not None and (problem := _summary_lacks(summary)) is not None:
        raise RlctlError(f"{summary_json}: {problem}", hint="was it edited?")
    return JobRecord(
        name=name,
        mode=mode,
        rows=_read_lines(job_dir / "metrics.jsonl", lacks=_row_lacks, at_most=reportrows.REPORT_ROWS),
        events=_read_lines(job_dir / "events.jsonl", lacks=_event_lacks, leave_out_damaged=True, naming=EVENTS_READ),
        summary=summary,
        evaluations=sorted(
            _read_lines(job_dir / "evaluations.jsonl", lacks=_evaluation_lacks),
            key=lambda r: int(r["version"]),
        ),
        **_checkpoints(job_dir),
    )


_JSON_KINDS: dict[type, str] = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a bool"}


def _field(path: Path, record: Any, dotted: str) -> Any:
    """The field `dotted` (job.pipeline.mode) of the JSON file `path` read as `record`; RlctlError naming the file and
    the first part of it that is not there or is not a JSON object (before: the message ended in Python's own words,
    'list indices must be integers or slices, not str', or just 'job')."""
    at: list[str] = []
    for key in dotted.split("."):
        if not isinstance(record, dict):
            where = ".".join(at) or "its top level"
            kind = "null" if record is None else _JSON_KINDS.get(type(record), type(record).__name__)
            raise RlctlError(f"{path}: {where} is {kind}, not a JSON object with {dotted}", hint="was it edited?")
        at.append(key)
        if key not in record:
            missing = "" if at == dotted.split(".") else f" (no {'.'.join(at)})"
            raise RlctlError(f"{path}: no {dotted} in it{missing}", hint="was it edited?")
        record = record[key]
    return record


def _checkpoints(job_dir: Path) -> dict[str, Any]:
    """JobRecord's checkpoints: the job's complete checkpoints with the reward that made each and its held-out
    figures, each part's manifests checked where its site's files are on this machine, as `status --checkpoints`
    checks them (`rlctl.ops.checkpoints.sound`: a stat per file, no connection, no weights hashed), a damaged one so
    marked and not the latest, versus every one listed as sound and the newest as the latest; none where its job.json
    is not one this rlctl reads in full (a job of an older rlctl: the rest of the report still is)."""
    from rlctl.ops.checkpoints import checkpoint_table
    from rlctl.ops.pull import checkpoint_parts

    try:
        here = checkpoint_parts(job_dir, remote=False)
    except RlctlError as e:  # (where its parts are does not read: none checked, said under the table)
        log.info("report: checkpoints' manifests not checked: %s", e)
        here = {}
    try:
        table = checkpoint_table(JobDir(job_dir), parts=here)
    except RlctlError as e:
        log.info("report: no checkpoints table: %s", e)
        return {}
    return {"checkpoints": list(table["checkpoints"]), "manifests_checked": list(table["manifests_checked"])}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(record_text(path))
    except OSError as e:
        raise RlctlError(f"{path}: cannot read: {e}") from e
    except ValueError as e:
        raise RlctlError(f"{path}: not JSON: {e}", hint="was it edited or cut short?") from e


def _read_lines(
    path: Path,
    *,
    lacks: Callable[[dict[str, Any]], str | None],
    leave_out_damaged: bool = False,
    naming: tuple[str, ...] = (),
    at_most: int | None = None,
) -> list[dict[str, Any]]:
    """The JSON lines of `path`; one that does not parse, or lacks a field the report reads (`lacks`: what the row
    lacks, None when nothing), is an RlctlError naming the file, the line and what is wrong, or (`leave_out_damaged`:
    the events, where a controller killed mid-write leaves a line cut short for good) left out with a warning.
    `naming`: only the lines that hold one of these strings are read (the others are not parsed). The file is read
    a line at a time: events.jsonl of a job of weeks is hundreds of MB, held whole twice (its text and its list of
    lines) to keep its few scale events. `at_most` (metrics rows): a file of more lines is read as runs of k
    consecutive rows, each merged into one (`reportrows.merged`; k: the fewest that leave at most that many)."""
    if not path.exists():
        return []
    try:
        with open_record(path) as f:
            every = 1 if at_most is None else max(1, -(-reportrows.count_lines(path) // at_most))
            rows = _rows(path, f, lacks=lacks, leave_out_damaged=leave_out_damaged, naming=naming)
            return list(rows if every == 1 else reportrows.merged(rows, every))
    except OSError as e:
        raise RlctlError(f"{path}: cannot read: {e}") from e


def _rows(
    path: Path,
    lines: Iterable[str],
    *,
    lacks: Callable[[dict[str, Any]], str | None],
    leave_out_damaged: bool,
    naming: tuple[str, ...],
) -> Iterator[dict[str, Any]]:
    """`_read_lines`' rows of the file's `lines` (each with its newline), one at a time."""
    for n, whole in enumerate(lines, start=1):
        if not whole.endswith("\n"):
            break  # the job may be appending right now: a last line without its newline is unfinished, not corrupt
        line = whole[:-1]
        if not line.strip() or (naming and not any(name in line for name in naming)):
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            if not leave_out_damaged:
                raise RlctlError(f"{path}: line {n}: not JSON: {e}", hint="was it edited?") from e
            log.warning("%s: line %d is not valid JSON (%s): left out", path, n, e)
            continue
        # (`5`, `[1, 2]`): every reader takes a row for an object
        problem = lacks(row) if isinstance(row, dict) else f"{type(row).__name__}, not a JSON object"
        if problem is None:
            yield row
        elif not leave_out_damaged:
            raise RlctlError(f"{path}: line {n}: {problem}", hint="was it edited?")
        else:
            log.warning("%s: line %d: %s: left out", path, n, problem)


def _lacks(
    row: dict[str, Any],
    *,
    present: tuple[str, ...] = (),
    numbers: tuple[str, ...] = (),
    optional: tuple[str, ...] = (),
) -> str | None:
    """What `row` lacks ("no 'period_s'", "'t' is 'x', not a number") of the fields `present` (a number or null:
    shown as "-"), `numbers` (the report counts with them) and `optional` (a number or null where there); None when
    nothing."""
    for name in (*present, *numbers):
        if name not in row:
            return f"no {name!r}"
    for name in (*numbers, *present, *optional):
        value = row.get(name)
        if value is None and name not in numbers:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{name!r} is {value!r}, not a number"
        if name in numbers and not math.isfinite(value):  # counted with, or made an int (a version, an iteration)
            return f"{name!r} is {value!r}, not a finite number"
    return None


def _row_lacks(row: dict[str, Any]) -> str | None:
    """What a metrics row lacks of what the report reads: its figures, and each agent's busy seconds."""
    present = ("reward_mean", "t_gen_s", "t_train_s", "delta_s", "samples_per_s")
    problem = _lacks(
        row, present=present, numbers=("iteration", "period_s"), optional=("delta_prime_s", "rollout_units")
    )
    agents = row.get("agents") or {}
    if problem is None and not isinstance(agents, dict):
        return f"'agents' is {type(agents).__name__}, not a JSON object"
    for name, a in agents.items() if problem is None else ():
        if not isinstance(a, dict) or _lacks(a, numbers=("busy_s",)) is not None:
            return f"no number 'agents.{name}.busy_s'"
    return problem


def _summary_lacks(s: Any) -> str | None:
    """What summary.json lacks of what the report reads: its state (a word) and its ledger (an object)."""
    if not isinstance(s, dict):
        return f"{type(s).__name__}, not a JSON object"
    if not isinstance(s.get("state"), str):
        return f"'state' is {s.get('state')!r}, not a word"
    if not isinstance(s.get("ledger", {}), dict):
        return f"'ledger' is {type(s['ledger']).__name__}, not a JSON object"
    return None


EVALUATION_FIGURES = ("greedy_reward", "greedy_exact", "prompts", "seconds")


def _evaluation_lacks(e: dict[str, Any]) -> str | None:
    problem = _lacks(e, numbers=("version",), optional=EVALUATION_FIGURES)
    if problem is None and not isinstance(e.get("versions", []), list):  # the table joins them: "6–7"
        return f"'versions' is {e['versions']!r}, not a list"
    return problem


# the events the report reads (`JobRecord.scales`; `NEVER_JOINED`: `_failed_start`'s): the others are not parsed,
# since a job of weeks writes tens of thousands (a `weights_applied` per weight version, 10⁴ and more; a job of an
# older rlctl wrote one per unit and version: 64 units × 10⁴ versions, ≈ 130 MB)
EVENTS_READ = ('"scale"', '"resumed_from"', *(f'"{kind}"' for kind in NEVER_JOINED))


def _event_lacks(e: dict[str, Any]) -> str | None:
    """What a scale event lacks of what the report reads (its time; its iteration, when it has one)."""
    if e.get("event") != "scale":
        return None
    return _lacks(e, numbers=("t", "iteration") if e.get("iteration") is not None else ("t",))
