"""The report of one job run: a PNG (reward, stage times with scale events, agent busy/idle) and an HTML page.

job_dir/job.json ─────────┐
job_dir/metrics.jsonl ────┼─▶ load() ─▶ JobRecord ─┬─▶ _figure() ─▶ report.png ─┐
job_dir/events.jsonl ─────┤                        └─▶ _html() ◀── PNG bytes ◀──┴─▶ report.html
job_dir/summary.json ─────┘   (only job.json is required: a running job may have written nothing yet)

A damaged record file (a line cut short or edited, a summary that is no JSON and whose run's end the events do not
say) is exit 1, as in `rlctl status`: it is neither a command line nor a config file the user wrote (exit 2), but
the job's state.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rlctl import reportrows
from rlctl.errors import RlctlError, UsageError
from rlctl.launch.jobdir import JobDir, abandoned, event_time, open_record, record_text, resume_points
from rlctl.ops.runstate import run_summary
from rlctl.reportrows import MERGED

log = logging.getLogger(__name__)

NO_DATA = "no data yet"


@dataclass(frozen=True)
class ReportFiles:
    png: Path
    html: Path


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


def build_report(job_dir: Path, *, out: Path | None = None, ended: str | None = None) -> ReportFiles:
    """Write `<job_dir>/report.{png,html}` (or `out` and its sibling with the other suffix). `ended`: how the job
    ended by its record (`rlctl.ops.operate.job_end`), None while it may run."""
    files = _paths(job_dir, out)
    rec = replace(load(job_dir), ended=ended)
    png = _figure(rec)
    page = _html(rec, png)
    try:
        files.png.parent.mkdir(parents=True, exist_ok=True)
        files.png.write_bytes(png)
        files.html.write_text(page, encoding="utf-8")
    except OSError as e:
        said = f"cannot write the report: {e.strerror or e}: {e.filename or files.png}"
        if out is not None:  # the operator's path (below a file, a folder not theirs): exit 2, as the option's others
            raise UsageError(f"--out {out}: {said}", hint="write elsewhere") from e
        raise RlctlError(said) from e
    return files


def _paths(job_dir: Path, out: Path | None) -> ReportFiles:
    if out is None:
        return ReportFiles(job_dir / "report.png", job_dir / "report.html")
    sibling = "the sibling with the other suffix is written too"
    try:
        return _out_paths(out, sibling)
    except OSError as e:  # asking whether it is a directory failed (a name too long, a folder this user may not enter)
        raise UsageError(f"--out {out}: {e.strerror or e}", hint=sibling) from e


def _out_paths(out: Path, sibling: str) -> ReportFiles:
    if out.is_dir():
        raise UsageError(f"--out {out}: a directory; name a file in it, e.g. {out / 'report.png'}", hint=sibling)
    if out.suffix not in (".png", ".html"):
        raise UsageError(f"--out {out}: must end in .png or .html", hint=sibling)
    files = ReportFiles(out.with_suffix(".png"), out.with_suffix(".html"))
    taken = next((p for p in (files.png, files.html) if p.is_dir()), None)  # `--out r.png` beside a directory r.html
    if taken is not None:
        raise UsageError(f"--out {out}: {taken} is a directory, where the report's {taken.suffix} goes", hint=sibling)
    return files


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


# -- derived series ---------------------------------------------------------------------------------


def busy_fractions(rows: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """Per agent, per row: busy seconds in that iteration's interval / period_s, clipped to [0, 1].

    None where the agent is absent from the row's `agents` (joined later, gone before it, or an older
    run) or was not running at either end of the interval (lost or stopped: gone, not idle; the
    controller lists it once more, in the first row after it went, and older records in every row).
    An agent's first row counts all its busy seconds: it started from zero inside it.
    Busy seconds arrive with heartbeats (every second), which can be slower than iterations: rows in
    which a running agent's figure did not move share the next change evenly over their periods
    (when inside them the work happened is not known); rows still unchanged at the end count as idle.
    """
    out: dict[str, list[float | None]] = {}
    prev: dict[str, tuple[float, bool]] = {}  # name → (busy_s, running) at the previous row
    pending: dict[str, list[int]] = {}  # name → rows since its figure last changed
    for i, row in enumerate(rows):
        agents = row.get("agents") or {}
        period = row["period_s"]
        for name, a in agents.items():
            series = out.setdefault(name, [None] * len(rows))
            busy, running = float(a["busy_s"]), a.get("state", "running") == "running"
            before_s, was_running = prev.get(name, (0.0, False))
            if not (running or was_running) or period <= 0:
                for j in pending.pop(name, []):
                    series[j] = 0.0
                continue
            spent = busy - before_s
            if spent < 0:  # the agent was restarted under the same name: its counter began again
                spent = busy
            if spent == 0 and running and was_running:
                pending.setdefault(name, []).append(i)  # no new heartbeat yet (or idle): decide later
                continue
            idx = [*pending.pop(name, []), i]
            span = sum(rows[j]["period_s"] for j in idx)
            for j in idx:
                series[j] = min(1.0, max(0.0, spent / span))
        # an agent this row leaves out is gone: not running, its busy seconds as last seen (it may come back)
        prev = {name: (busy, False) for name, (busy, _) in prev.items()} | {
            name: (float(a["busy_s"]), a.get("state", "running") == "running") for name, a in agents.items()
        }
    for name, idx in pending.items():
        for j in idx:
            out[name][j] = 0.0
    return out


def _agent_labels(rows: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """name → (role, site) as last seen; trainers first, then rollouts, each in order of first appearance."""
    seen: dict[str, tuple[str, str]] = {}
    for row in rows:
        for name, a in (row.get("agents") or {}).items():
            seen[name] = (str(a.get("role", "?")), str(a.get("site", "?")))
    order = sorted(seen, key=lambda n: seen[n][0] != "trainer")
    return {n: seen[n] for n in order}


BUSY_ROWS = 40  # the busy panel's rows at most: past that many agents (units replaced and scaled for weeks), one a site


def busy_rows(rows: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """The busy panel's rows: label → busy fraction per row of `rows`. One per agent ("rollout-1 (rollout, h20)")
    while the run had at most BUSY_ROWS; past that, one per role and site ("rollout on h20: 312 agents"), each row
    the mean of its agents present then (None where none was), versus a row per agent the run ever had (hundreds
    after weeks of units replaced and scaled: a figure of 0.25 inch each, some 600 MB of pixels)."""
    fractions, labels = busy_fractions(rows), _agent_labels(rows)
    if len(labels) <= BUSY_ROWS:
        return {f"{n} ({role}, {site})": fractions[n] for n, (role, site) in labels.items() if n in fractions}
    groups: dict[tuple[str, str], list[str]] = {}
    for name, where in labels.items():
        if name in fractions:
            groups.setdefault(where, []).append(name)
    out: dict[str, list[float | None]] = {}
    for (role, site), names in groups.items():
        present = [[f for n in names if (f := fractions[n][i]) is not None] for i in range(len(rows))]
        out[f"{role} on {site}: {len(names)} agents"] = [sum(fs) / len(fs) if fs else None for fs in present]
    return out


def _scale_label(e: dict[str, Any]) -> str:
    sign = "+" if e.get("direction") == "out" else "-"
    return f"{sign}{e.get('agent', '?')} ({e.get('reason', '?')})"


def _col(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [math.nan if r.get(key) is None else float(r[key]) for r in rows]


# -- the PNG ----------------------------------------------------------------------------------------


def _figure(rec: JobRecord) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = rec.rows
    panel = busy_rows(rows)
    n_agents = len(panel)
    fig, (ax_r, ax_t, ax_b) = plt.subplots(
        3,
        1,
        figsize=(10, 8.5 + 0.25 * max(0, n_agents - 4)),
        sharex=True,
        layout="constrained",
        gridspec_kw={"height_ratios": [1.0, 1.3, 0.5 + 0.15 * max(1, n_agents)]},
    )
    state = rec.summary["state"] if rec.summary else f"{rec.ended}, no summary" if rec.ended else "no summary yet"
    merged = f" (a point: {rec.merged} iterations)" if rec.merged > 1 else ""
    fig.suptitle(f"{rec.name} ({rec.mode}): {rec.iterations} iterations{merged}, {state}", fontsize=11)
    ax_r.set_title("(a) mean reward" + (", held-out greedy" if rec.evaluations else ""), fontsize=9, loc="left")
    ax_t.set_title("(b) stage times per iteration, scale events", fontsize=9, loc="left")
    each = "agent" if len(panel) == len(_agent_labels(rows)) else "role and site: the mean of its agents"
    ax_b.set_title(f"(c) busy fraction per iteration, per {each} (blank: absent)", fontsize=9, loc="left")
    ax_b.set_xlabel("iteration")
    if rows:
        its = [int(r["iteration"]) for r in rows]
        _reward(ax_r, rows, its, rec.evaluations)
        _stages(ax_t, rows, its)
        _scale_marks(rec, ax_t, ax_b)
        _busy(fig, ax_b, rows, its, panel)
        # the evaluated versions too: the final policy's (version N, after iteration N − 1) was drawn past the edge
        xs = [its[0] - int(rows[0].get(MERGED, 1)) + 1, *its] + [int(e["version"]) for e in rec.evaluations]
        ax_b.set_xlim(min(xs) - 0.5, max(xs) + 0.5)
        ax_b.xaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        for ax in (ax_r, ax_t, ax_b):
            ax.set_xticks([])
            ax.set_yticks([])
            _no_data(ax)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _marker(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"marker": "o", "markersize": 3} if len(rows) <= 60 else {}


def _reward(ax: Any, rows: list[dict[str, Any]], its: list[int], evaluations: list[dict[str, Any]]) -> None:
    """Sampled reward per iteration; held-out greedy reward (and exact share) at the version evaluated, which
    iteration v's samples were drawn from."""
    ax.set_ylabel("reward")
    ax.plot(its, _col(rows, "reward_mean"), color="tab:green", label="sampled (training batch)", **_marker(rows))
    if evaluations:
        versions = [int(e["version"]) for e in evaluations]
        ax.plot(versions, _col(evaluations, "greedy_reward"), "s-", color="tab:purple", label="held-out greedy")
        if all("greedy_exact" in e for e in evaluations):
            ax.plot(versions, _col(evaluations, "greedy_exact"), "^--", color="tab:gray", label="held-out exact")
        ax.legend(loc="best", fontsize=8)


def _stages(ax: Any, rows: list[dict[str, Any]], its: list[int]) -> None:
    ax.set_ylabel("seconds")
    ax.plot(its, _col(rows, "t_gen_s"), label="T_gen", color="tab:blue", **_marker(rows))
    ax.plot(its, _col(rows, "t_train_s"), label="T_train", color="tab:orange", **_marker(rows))
    ax.plot(its, _col(rows, "delta_s"), label="δ = T_gen − T_train", color="tab:red", **_marker(rows))
    if any(r.get("delta_prime_s") is not None for r in rows):
        ax.plot(its, _col(rows, "delta_prime_s"), linestyle="--", label="δ' (rebalance threshold)", color="k")
    ax.axhline(0.0, color="0.6", linewidth=0.6)
    ax.margins(y=0.2)  # headroom for the scale-event boxes along the top edge
    # Legend in the title line, right-aligned: inside it would cover data, to the right it narrows every panel.
    ax.legend(fontsize=7, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=4, frameon=False, borderaxespad=0.1)


def _scale_marks(rec: JobRecord, ax_t: Any, ax_b: Any) -> None:
    """A dotted line per scale event (panels b and c); in b one label box per iteration, staggered in 3 heights."""
    by_iteration: dict[int, list[str]] = {}
    for e in rec.scales:
        if e.get("iteration") is not None and "failed" not in e:  # a failed start changed no unit count
            by_iteration.setdefault(int(e["iteration"]), []).append(_scale_label(e))
    for k, (it, texts) in enumerate(sorted(by_iteration.items())):
        for ax in (ax_t, ax_b):
            ax.axvline(it, color="tab:purple", linewidth=1.0, linestyle=":")
        ax_t.annotate(
            "\n".join(texts),
            xy=(it, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -3 - 12 * (k % 3)),  # neighbouring iterations' boxes would overlap at one height
            textcoords="offset points",
            va="top",
            fontsize=7,
            color="tab:purple",
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "tab:purple", "alpha": 0.85},
        )


def _busy(fig: Any, ax: Any, rows: list[dict[str, Any]], its: list[int], panel: dict[str, list[float | None]]) -> None:
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    if not panel:
        ax.set_yticks([])
        _no_data(ax, "no per-agent busy time in metrics.jsonl (older run)")
        return
    cmap, norm = colormaps["viridis"], Normalize(0.0, 1.0)
    for y, fractions in enumerate(panel.values()):
        cells = [
            (it - n + 0.5, float(n))  # (a row of n iterations merged: their span)
            for it, n, f in zip(its, (int(r.get(MERGED, 1)) for r in rows), fractions, strict=True)
            if f is not None
        ]
        colours = [cmap(norm(f)) for f in fractions if f is not None]
        ax.broken_barh(cells, (y - 0.4, 0.8), facecolors=colours)
    ax.set_yticks(range(len(panel)), list(panel))
    ax.tick_params(axis="y", labelsize=7)
    ax.set_ylim(len(panel) - 0.5, -0.5)
    fig.colorbar(ScalarMappable(norm, cmap), ax=ax, label="busy fraction", fraction=0.04, pad=0.01)


def _no_data(ax: Any, text: str = NO_DATA) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=10, color="0.4")


# -- the HTML ---------------------------------------------------------------------------------------

_CSS = (
    "body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:0.5em 0 1.5em}"
    "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}th{background:#f3f3f3}"
    "td:first-child,th:first-child{text-align:left}img{max-width:100%}.none{color:#777;font-style:italic}"
)


def _f(v: Any, spec: str = ".3f") -> str:
    if v is None:
        return "-"
    try:  # (a count written as 2.0 by hand is no "d")
        return format(v, spec) if isinstance(v, float | int) else str(v)
    except ValueError:
        return str(v)


def _table(headers: list[str] | None, rows: list[list[str]], *, id_: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers or [])
    thead = f"<thead><tr>{head}</tr></thead>\n" if headers else ""
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>\n" for r in rows)
    return f'<table id="{id_}">\n{thead}<tbody>\n{body}</tbody>\n</table>'


def _summary_rows(rec: JobRecord) -> list[list[str]]:
    s, rows = rec.summary or {}, rec.rows
    # the job's first controller start to its last trained iteration, across resumes (metrics rows' wall_s)
    wall = s.get("job_wall_s", rows[-1].get("wall_s") if rows else None)
    ledger = s.get("ledger") or {}
    keys = ("prompts", "trained", "requeued", "lost", "duplicated")
    return [
        ["job", rec.name],
        ["mode", rec.mode],
        ["state", rec.state],
        ["iterations", str(s.get("iterations", rec.iterations))],
        ["reward first → last", _reward_span(s, rows)],
        ["samples/s (every iteration, across resumes)", _f(job_rate(rows, "samples_per_s"), ".2f")],
        ["wall s (job start → last iteration)", _f(wall, ".1f")],
        [
            "ledger",
            ", ".join(f"{k} {ledger[k]}" for k in keys if k in ledger)
            or ("- (not written: the job ended without a summary)" if rec.ended else "- (written when the job ends)"),
        ],
        *([["quarantined prompts", str(ledger["quarantined"])]] if ledger.get("quarantined") else []),
    ]


def _reward_span(s: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The reward at the job's start and end, and over what: the summary's means over its first and last
    `reward_window` iterations, else (no summary yet, or one without them) the first and last metrics rows' own.
    Before, both read `0.150 → 0.700` under one label, the window unsaid."""
    if "reward_first" in s and "reward_last" in s:
        k = s.get("reward_window")
        window = "iterations (how many: not recorded)"
        if isinstance(k, int):
            window = f"{k} iteration{'s' if k != 1 else ''}"
        return f"{_f(s['reward_first'])} → {_f(s['reward_last'])} (means over the first and last {window})"
    if not rows:
        return "- → -"
    first, last = rows[0], rows[-1]
    n = int(first.get(MERGED, 1))  # (rows merged: each the mean of its iterations, up to the one it names)
    each = "one each" if n == 1 else f"the mean of {n} up to each"
    return (
        f"{_f(first.get('reward_mean'))} → {_f(last.get('reward_mean'))} (iteration {_f(first.get('iteration'), 'd')}"
        f" → {_f(last.get('iteration'), 'd')}, {each}: no summary)"
    )


def job_rate(rows: list[dict[str, Any]], key: str) -> float | None:
    """Per-second figure `key` (samples_per_s) of the job: what every iteration, of every run, did over the time
    they took (each row's figure is its own iteration's, over its `period_s`). Versus summary.json's, which is its
    last run's (a resumed job's 40/s beside its iterations and wall time since the first start, where the job did 25),
    or, before there was one, the last row's: one iteration's, bursty in async mode. None without a row's time."""
    span = sum(float(r["period_s"]) for r in rows)
    return round(sum(float(r[key] or 0.0) * float(r["period_s"]) for r in rows) / span, 2) if span > 0 else None


def _scale_rows(rec: JobRecord) -> list[list[str]]:
    return [
        [
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event_time(e))) if event_time(e) > 0 else "-",
            _f(e.get("iteration"), "d"),
            str(e.get("direction", "-")) + (" (failed start)" if "failed" in e else ""),
            str(e.get("agent", "-")),
            str(e.get("site", "-")),
            str(e.get("reason", "-")) + (f"; it never joined: {e['failed']}" if "failed" in e else ""),
            _f(e.get("delta_s"), ".2f"),
            _f(e.get("delta_prime_s"), ".2f"),
        ]
        for e in rec.scales
    ]


def _iteration_rows(rec: JobRecord) -> list[list[str]]:
    return [
        [
            str(r["iteration"]),
            _f(r["reward_mean"], ".4f"),
            _f(r["t_gen_s"], ".2f"),
            _f(r["t_train_s"], ".2f"),
            _f(r["delta_s"], "+.2f"),
            _f(r.get("delta_prime_s"), ".2f"),
            _f(r.get("rollout_units"), "d"),
        ]
        for r in rec.rows
    ]


def _checkpoint_rows(rec: JobRecord) -> list[list[str]]:
    def held(h: dict[str, Any] | None, key: str) -> str:
        return _f((h or {}).get(key), ".4f")

    return [
        [
            f"v{c['version']}"
            + (" (latest)" if c["latest"] else f" (damaged: {c['damaged']})" if c.get("damaged") else ""),
            "-" if c["written_at"] is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c["written_at"])),
            f"{c['iterations'][0]}–{c['iterations'][1]}",
            _f(c["reward_mean"], ".4f"),
            held(c["heldout"], "greedy_reward"),
            held(c["heldout"], "greedy_exact"),
        ]
        for c in rec.checkpoints
    ]


def _evaluation_rows(rec: JobRecord) -> list[list[str]]:
    return [
        [
            str(e["version"]),
            _f(e.get("greedy_reward"), ".4f"),
            _f(e.get("greedy_exact"), ".4f"),
            "–".join(str(v) for v in e.get("versions", [])),
            _f(e.get("prompts"), "d"),
            str(e.get("unit", "-")),
            _f(e.get("seconds"), ".2f"),
        ]
        for e in rec.evaluations
    ]


def _html(rec: JobRecord, png: bytes) -> str:
    from rlctl.ops.checkpoints import unchecked_line
    from rlctl.ops.evaluation import by_source_lines

    title = html.escape(f"rlctl report: {rec.name}")
    none = f'<p class="none">{NO_DATA}</p>'
    scales = _scale_rows(rec)
    iterations = _iteration_rows(rec)
    parts = [
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{title}</title>',
        f"<style>{_CSS}</style>\n</head>\n<body>\n<h1>{title}</h1>",
        f"<p>written {html.escape(time.strftime('%Y-%m-%d %H:%M:%S'))}</p>",
        _table(None, _summary_rows(rec), id_="summary"),
        f'<img alt="reward, stage times, agent busy fraction" src="data:image/png;base64,'
        f'{base64.b64encode(png).decode("ascii")}">',
        "<h2>Scale events</h2>",
        _table(["time", "iteration", "direction", "agent", "site", "reason", "δ s", "δ' s"], scales, id_="scale")
        if scales
        else '<p class="none">no scale events</p>',
        *(
            [
                "<h2>Held-out evaluations</h2>",
                _table(
                    ["version", "greedy reward", "exact", "decoded by versions", "prompts", "unit", "seconds"],
                    _evaluation_rows(rec),
                    id_="evaluations",
                ),
                *(f"<p>{html.escape(line)}</p>" for line in by_source_lines(rec.evaluations)),
            ]
            if rec.evaluations
            else []
        ),
        *(
            [
                "<h2>Checkpoints</h2>",
                _table(
                    ["checkpoint", "written", "iterations", "sampled reward", "held-out greedy reward", "exact"],
                    _checkpoint_rows(rec),
                    id_="checkpoints",
                ),
                *(
                    [f'<p class="none">{html.escape(note)}</p>']
                    if (note := unchecked_line(rec.manifests_checked))
                    else []
                ),
            ]
            if rec.checkpoints
            else []
        ),
        "<h2>Iterations</h2>",
        *(
            [f"<p>each row: {rec.merged} iterations up to the one it names, their means (rates: over their time)</p>"]
            if rec.merged > 1
            else []
        ),
        _table(["iteration", "reward", "T_gen s", "T_train s", "δ s", "δ' s", "units"], iterations, id_="iterations")
        if iterations
        else none,
        "</body>\n</html>\n",
    ]
    return "\n".join(parts)
