"""The report of one job run: a PNG (reward, stage times with scale events, agent busy/idle) and an HTML page.

job_dir/job.json ─────────┐
job_dir/metrics.jsonl ────┼─▶ load() ─▶ JobRecord ─┬─▶ _figure() ─▶ report.png ─────┐
job_dir/events.jsonl ─────┤                        └─▶ html_page() ◀── PNG bytes ◀──┴─▶ report.html
job_dir/summary.json ─────┘   (only job.json is required: a running job may have written nothing yet)

load() and JobRecord are rlctl.reportrecord's, html_page() rlctl.reporthtml's; the busy series and the PNG are here.
A damaged record file (a line cut short or edited, a summary that is no JSON and whose run's end the events do not
say) is exit 1, as in `rlctl status`: it is neither a command line nor a config file the user wrote (exit 2), but
the job's state.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlctl.errors import RlctlError, UsageError
from rlctl.ownfiles import png_metadata, refuse_foreign
from rlctl.reporthtml import NO_DATA, html_page
from rlctl.reportrecord import JobRecord, load
from rlctl.reportrows import MERGED


@dataclass(frozen=True)
class ReportFiles:
    png: Path
    html: Path


def build_report(job_dir: Path, *, out: Path | None = None, ended: str | None = None) -> ReportFiles:
    """Write `<job_dir>/report.{png,html}` (or `out` and its sibling with the other suffix). `ended`: how the job
    ended by its record (`rlctl.ops.operate.job_end`), None while it may run."""
    files = _paths(job_dir, out)
    rec = replace(load(job_dir), ended=ended)
    png = _figure(rec)
    page = html_page(rec, png)
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
    refuse_foreign(files.png, named_by=f"--out {out}", what="the report's image")
    refuse_foreign(files.html, named_by=f"--out {out}", what="the report's page")
    return files


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
    fig.savefig(buf, format="png", dpi=110, metadata=png_metadata("report"))
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
