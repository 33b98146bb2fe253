"""The report's HTML page (`html_page`): the job's summary, its scale events, held-out evaluations, checkpoints and
iterations as tables around the PNG, every value from the record HTML-escaped."""

from __future__ import annotations

import base64
import html
import time
from typing import Any

from rlctl.launch.jobdir import event_time
from rlctl.ownfiles import HTML_GENERATOR
from rlctl.reportrecord import JobRecord
from rlctl.reportrows import MERGED

NO_DATA = "no data yet"

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


def html_page(rec: JobRecord, png: bytes) -> str:
    from rlctl.ops.checkpoints import unchecked_line
    from rlctl.ops.evaluation import by_source_lines

    title = html.escape(f"rlctl report: {rec.name}")
    none = f'<p class="none">{NO_DATA}</p>'
    scales = _scale_rows(rec)
    iterations = _iteration_rows(rec)
    parts = [
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n{HTML_GENERATOR}',
        f"<title>{title}</title>",
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
