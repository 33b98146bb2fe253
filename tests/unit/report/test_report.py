"""`rlctl.report`: the PNG and HTML of a job directory, while it runs and after, and its one-line errors."""

from __future__ import annotations

import json
import math
import tracemalloc
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from rlctl.errors import RlctlError, UsageError
from rlctl.report import build_report, busy_fractions
from rlctl.reportrecord import load
from tests.conftest import run_cli
from tests.unit.report.fake_jobdir import ITERATIONS, make_job_dir, metrics_row, write_lines


class Tables(HTMLParser):
    """Body rows per table id, and every <img> src."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, int] = {}
        self.imgs: list[str] = []
        self._table: str | None = None
        self._in_body = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table":
            self._table = a.get("id") or ""
            self.rows[self._table] = 0
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body and self._table is not None:
            self.rows[self._table] += 1
        elif tag == "img":
            self.imgs.append(a.get("src") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "tbody":
            self._in_body = False
        elif tag == "table":
            self._table = None


def parse(page: str) -> Tables:
    t = Tables()
    t.feed(page)
    return t


def test_report_of_a_run_with_a_scale_out(tmp_path: Path) -> None:
    d = make_job_dir(tmp_path)
    files = build_report(d)
    assert files.png == d / "report.png" and files.html == d / "report.html"
    png = files.png.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(png) > 20_000
    page = files.html.read_text()
    t = parse(page)
    assert t.rows["iterations"] == ITERATIONS
    assert t.rows["scale"] == 1
    assert "rollout-2" in page and "rebalance" in page
    assert len(t.imgs) == 1 and t.imgs[0].startswith("data:image/png;base64,iVBORw0KGgo")
    assert "no summary.json yet" in page


def test_held_out_evaluations_during_the_run_get_a_table_and_a_curve(tmp_path: Path) -> None:
    d = make_job_dir(tmp_path)
    plain = build_report(d).png.read_bytes()
    rows = [
        {"version": v, "greedy_reward": 0.3 + v / 40, "greedy_exact": v / 100, "prompts": 64, "versions": [v, v + 1]}
        for v in (0, 6, 12)
    ]
    (d / "evaluations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    files = build_report(d)
    page = files.html.read_text()
    assert parse(page).rows["evaluations"] == 3
    assert "<td>6</td><td>0.4500</td><td>0.0600</td><td>6–7</td><td>64</td>" in page
    assert files.png.read_bytes() != plain  # the curve is drawn
    (d / "evaluations.jsonl").unlink()
    assert "Held-out evaluations" not in build_report(d).html.read_text()


def test_a_mixed_jobs_held_out_evaluations_give_each_data_source_a_line_below_the_table(tmp_path: Path) -> None:
    """The report's held-out table gave the mean alone (GSM8K improving while MATH regressed read as one flat
    figure); rows of 2+ data_sources now give one line per source, its first and last figure; one source: none."""
    d = make_job_dir(tmp_path)
    by = [{"a/gsm8k": 0.5, "b/MATH": 0.5}, {"a/gsm8k": 0.6, "b/MATH": 0.4}, {"a/gsm8k": 0.75, "b/MATH": 0.25}]
    rows = [
        {"version": v, "greedy_reward": 0.5, "prompts": 8, "versions": [v, v], "greedy_reward_by_source": b}
        for v, b in zip((0, 6, 12), by, strict=True)
    ]
    (d / "evaluations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = build_report(d).html.read_text()
    assert "<p>a/gsm8k: greedy reward 0.5000 at v0 → 0.7500 at v12 (3 evaluations)</p>" in page
    assert "<p>b/MATH: greedy reward 0.5000 at v0 → 0.2500 at v12 (3 evaluations)</p>" in page
    for r in rows:
        del r["greedy_reward_by_source"]
    (d / "evaluations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = build_report(d).html.read_text()
    assert "Held-out evaluations" in page and "greedy reward 0.5000 at v0" not in page


def test_a_data_source_is_written_on_one_line_and_html_escaped_in_the_report(tmp_path: Path) -> None:
    """A data_source as the rows wrote it: its line breaks and control characters escaped (`one_line`, versus a raw
    escape sequence in the page) and its HTML escaped (versus a <script> run by the browser that opens the report)."""
    d = make_job_dir(tmp_path)
    odd = "<script>alert(1)</script>\ngsm8k\x1b[31m"
    rows = [
        {"version": v, "greedy_reward": 0.5, "prompts": 8, "versions": [v, v], "greedy_reward_by_source": b}
        for v, b in ((0, {odd: 0.5, "b": 0.5}), (6, {odd: 0.75, "b": 0.25}))
    ]
    (d / "evaluations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = build_report(d).html.read_text()
    line = (
        "&lt;script&gt;alert(1)&lt;/script&gt;\\ngsm8k\\x1b[31m: greedy reward 0.5000 at v0 → 0.7500 at v6 "
        "(2 evaluations)"
    )
    assert f"<p>{line}</p>" in page
    assert "<script>alert" not in page and "\x1b" not in page


def test_the_summary_s_samples_per_s_is_the_job_s_across_its_resumes(tmp_path: Path) -> None:
    """The report's samples/s was summary.json's, its last run's (40 after a resume), beside the job's iterations
    and its wall time since the first start; without a summary, the last row's, one iteration's. It is every
    iteration's samples over their periods: 6 at 10/s and 6 at 40/s, 2 s each, are 25/s."""
    d = make_job_dir(tmp_path)
    rows = [metrics_row(i) | {"samples_per_s": 10.0 if i <= 6 else 40.0} for i in range(1, ITERATIONS + 1)]
    write_lines(d / "metrics.jsonl", rows)
    cell = "<td>samples/s (every iteration, across resumes)</td><td>25.00</td>"
    assert cell in build_report(d).html.read_text().replace("\n", "")  # running: no summary yet
    summary = {"state": "done", "iterations": ITERATIONS, "samples_per_s": 40.0, "run_s": 12.0, "ledger": {}}
    (d / "summary.json").write_text(json.dumps(summary))  # the resumed run's own
    assert cell in build_report(d).html.read_text().replace("\n", "")


def test_every_held_out_point_is_inside_the_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The x axis spans the evaluated versions as well as the iterations: the last one (the final policy, version N
    after iterations 0 … N − 1) was cut off at the plot's right edge."""
    import matplotlib.figure

    d = make_job_dir(tmp_path)  # iterations 1 … 12
    rows = [{"version": v, "greedy_reward": 0.5, "prompts": 8, "versions": [v, v]} for v in (0, 6, ITERATIONS + 1)]
    (d / "evaluations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spans: list[tuple[float, float]] = []
    savefig = matplotlib.figure.Figure.savefig

    def spy(fig: Any, *args: Any, **kwargs: Any) -> Any:
        spans.append(fig.axes[0].get_xlim())
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    build_report(d)
    ((lo, hi),) = spans
    assert lo < 0 < ITERATIONS + 1 < hi


def test_summary_and_escaping(tmp_path: Path) -> None:
    d = make_job_dir(tmp_path)
    summary = {
        "job": "demo",
        "mode": "stream",
        "eta": 0,
        "state": "failed: <trainer lost>",
        "iterations": ITERATIONS,
        "reward_first": 0.15,
        "reward_last": 0.7,
        "samples_per_s": 19.5,
        "ledger": {"prompts": 96, "trained": 90, "requeued": 4, "lost": 0, "duplicated": 1},
    }
    (d / "summary.json").write_text(json.dumps(summary))
    page = build_report(d).html.read_text()
    assert "failed: &lt;trainer lost&gt;" in page and "<trainer lost>" not in page
    assert "0.150 → 0.700" in page
    assert "prompts 96, trained 90, requeued 4, lost 0, duplicated 1" in page
    assert "quarantined prompts" not in page
    summary["ledger"] |= {"quarantined": 2}  # prompts set aside for crashing the units that ran them
    (d / "summary.json").write_text(json.dumps(summary))
    page = build_report(d).html.read_text()
    assert "<td>quarantined prompts</td><td>2</td>" in page.replace("\n", "")


def test_a_job_that_wrote_nothing_yet_still_renders(tmp_path: Path) -> None:
    d = make_job_dir(tmp_path, metrics=False)
    files = build_report(d)
    assert files.png.read_bytes()[:4] == b"\x89PNG"
    page = files.html.read_text()
    assert "no data yet" in page and "no scale events" in page
    assert "iterations" not in parse(page).rows


def test_an_unfinished_last_line_is_being_written_not_corrupt(tmp_path: Path) -> None:
    d = make_job_dir(tmp_path)
    with (d / "metrics.jsonl").open("a") as f:
        f.write('{"iteration": 13, "rew')
    assert parse(build_report(d).html.read_text()).rows["iterations"] == ITERATIONS


def test_out_names_one_file_and_its_sibling(tmp_path: Path) -> None:
    d = make_job_dir(tmp_path)
    files = build_report(d, out=tmp_path / "reports" / "demo.html")
    assert files.png == tmp_path / "reports" / "demo.png" and files.png.exists() and files.html.exists()
    assert not (d / "report.png").exists()
    with pytest.raises(UsageError, match=r"demo\.pdf: must end in \.png or \.html"):
        build_report(d, out=tmp_path / "demo.pdf")


def test_out_a_directory_names_the_option_and_what_is_valid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a directory named r.png was "cannot write the report: [Errno 21] Is a directory: '…/r.png'", exit 1
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    d = make_job_dir(tmp_path)
    (tmp_path / "r.png").mkdir()
    (tmp_path / "s.html").mkdir()
    (tmp_path / "file").write_text("")
    said = {
        "r.png": f"--out {tmp_path / 'r.png'}: a directory; name a file in it, e.g. {tmp_path}/r.png/report.png",
        "s.png": f"--out {tmp_path / 's.png'}: {tmp_path / 's.html'} is a directory, where the report's .html goes",
    }
    for out, line in said.items():
        r = run_cli("report", str(d), "--out", str(tmp_path / out))
        hint = " (hint: the sibling with the other suffix is written too)"
        assert r.exit_code == 2 and r.stderr == f"rlctl: error: {line}{hint}\n", r.stderr
    # what the write met: named too, the operator's path (exit 2, as the option's other lines), versus exit 1
    r = run_cli("report", str(d), "--out", str(tmp_path / "file" / "r.png"))
    assert r.exit_code == 2 and r.stderr.startswith(f"rlctl: error: --out {tmp_path / 'file' / 'r.png'}: "), r.stderr
    assert r.stderr.endswith(" (hint: write elsewhere)\n") and len(r.stderr.splitlines()) == 1, r.stderr
    long = tmp_path / ("a" * 300 + ".png")  # asking whether it is a directory fails: a traceback (review of c4ec59d)
    r = run_cli("report", str(d), "--out", str(long))
    assert r.exit_code == 2 and r.stderr.startswith(f"rlctl: error: --out {long}: File name too long"), r.stderr


def test_missing_job_json_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"not a job directory \(no job\.json\)"):
        build_report(tmp_path)
    # a job dir (its plan.json, which `prepare` writes first) whose job.json was removed: said "not a job directory"
    (tmp_path / "plan.json").write_text("{}")
    said = r"/job\.json: missing \(the resolved job, written with its plan\.json\)$"
    with pytest.raises(UsageError, match=said) as e:
        build_report(tmp_path)
    assert e.value.hint == "put the job dir's job.json back from a copy"


def test_corrupt_metrics_line_names_file_and_line(tmp_path: Path) -> None:
    d = make_job_dir(tmp_path)
    path = d / "metrics.jsonl"
    path.write_text(json.dumps(metrics_row(1)) + "\n{not json\n")
    with pytest.raises(RlctlError, match=f"^{path}: line 2: not JSON") as e:
        build_report(d)
    assert e.value.exit_code == 1


def test_a_damaged_metrics_line_is_exit_1_in_report_as_in_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # report said exit 2 (a config or usage error), status exit 1: the job's record damaged is neither
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    d = make_job_dir(tmp_path)
    path = d / "metrics.jsonl"
    # (the line before the last, that one being written: status reads the file's end alone, from the last whole row)
    path.write_text(json.dumps(metrics_row(1)) + "\n{not json\n" + json.dumps(metrics_row(2))[:9])
    for command in ("report", "status"):
        r = run_cli(command, str(d))
        assert r.exit_code == 1 and r.stderr.startswith(f"rlctl: error: {path}: line 2"), (command, r.stderr)
        assert r.stderr.count("\n") == 1, r.stderr


def test_a_line_that_is_json_but_no_object_names_file_and_line(tmp_path: Path) -> None:
    # `[1, 2]` or `5` on a line of its own raised AttributeError ('list' object has no attribute 'get'): a traceback
    d = make_job_dir(tmp_path)
    path = d / "metrics.jsonl"
    path.write_text(json.dumps(metrics_row(1)) + "\n[1, 2]\n")
    with pytest.raises(RlctlError, match=f"^{path}: line 2: list, not a JSON object$"):
        build_report(d)
    path.write_text(json.dumps(metrics_row(1)) + "\n")
    (d / "events.jsonl").write_text('5\n{"t": 1.0, "event": "controller_listening"}\n')  # the events: left out
    assert parse(build_report(d).html.read_text()).rows["iterations"] == 1


@pytest.mark.parametrize(
    ("file", "edit", "said"),
    [
        ("metrics.jsonl", lambda rows: rows[1].pop("period_s"), "line 2: no 'period_s'"),
        ("metrics.jsonl", lambda rows: rows[2].update(iteration=None), "line 3: 'iteration' is None, not a number"),
        (
            "metrics.jsonl",
            lambda rows: rows[0]["agents"]["rollout-1"].pop("busy_s"),
            "line 1: no number 'agents.rollout-1.busy_s'",
        ),
        ("evaluations.jsonl", lambda rows: rows.append({"greedy_reward": 0.5}), "line 4: no 'version'"),
        # present, of another type: a ValueError traceback in the plot or the table (review of 4b75f51)
        ("metrics.jsonl", lambda rows: rows[0].update(reward_mean="x"), "line 1: 'reward_mean' is 'x', not a number"),
        (
            "metrics.jsonl",
            lambda rows: rows[1].update(rollout_units="2"),
            "line 2: 'rollout_units' is '2', not a number",
        ),
        (
            "evaluations.jsonl",
            lambda rows: rows[0].update(greedy_reward="x"),
            "line 1: 'greedy_reward' is 'x', not a number",
        ),
        ("evaluations.jsonl", lambda rows: rows[0].update(versions=3), "line 1: 'versions' is 3, not a list"),
        # JSON's NaN parses: an int() of it was a ValueError traceback
        (
            "evaluations.jsonl",
            lambda rows: rows[1].update(version=math.nan),
            "line 2: 'version' is nan, not a finite number",
        ),
        (
            "metrics.jsonl",
            lambda rows: rows[0].update(period_s=math.inf),
            "line 1: 'period_s' is inf, not a finite number",
        ),
    ],
)
def test_a_row_without_a_field_the_report_reads_names_file_line_and_field(
    tmp_path: Path, file: str, edit: Any, said: str
) -> None:
    # was a KeyError or TypeError traceback (a hand-edited row)
    d = make_job_dir(tmp_path)
    rows = [metrics_row(i) for i in range(1, 4)] if file == "metrics.jsonl" else [{"version": v} for v in (2, 4, 6)]
    edit(rows)
    (d / file).write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(RlctlError, match=f"^{d / file}: {said}$") as e:
        build_report(d)
    assert e.value.exit_code == 1  # a damaged record, as a line that does not parse


def test_a_scale_event_without_its_time_is_left_out_as_a_damaged_event_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # was a KeyError traceback; the report leaves out a damaged line of events.jsonl, saying which
    d = make_job_dir(tmp_path)
    scale, joined = (json.loads(line) for line in (d / "events.jsonl").read_text().splitlines())
    del scale["t"]
    (d / "events.jsonl").write_text(json.dumps(scale) + "\n" + json.dumps(joined) + "\n")
    page = build_report(d).html.read_text()
    assert "no scale events" in page
    assert [r.getMessage() for r in caplog.records] == [f"{d / 'events.jsonl'}: line 1: no 't': left out"]


def test_busy_fractions_join_leave_restart_and_clip() -> None:
    def row(period_s: float, **busy_s: float | tuple[float, str]) -> dict[str, Any]:
        agents = {}
        for name, b in busy_s.items():
            seconds, state = b if isinstance(b, tuple) else (b, "running")
            agents[name] = {"role": "rollout", "site": "h20", "busy_s": seconds, "state": state}
        return {"period_s": period_s, "agents": agents}

    rows = [
        row(2.0, a=1.0, c=(0.0, "lost")),  # c is listed but was never running here: blank
        row(2.0, a=4.0, b=0.5),  # a: 3 s busy in 2 s (clipped); b joins: all its 0.5 s fall in this interval
        row(4.0, a=5.0, b=2.5),
        row(4.0, a=(6.0, "lost"), b=1.0),  # a lost during the interval: its last 1 s counts; b restarted
        row(4.0, a=(6.0, "lost"), b=2.0),  # a still listed, gone: blank, not idle
        {"period_s": 1.0},  # an older row without per-agent figures
    ]
    assert busy_fractions(rows) == {
        "a": [0.5, 1.0, 0.25, 0.25, None, None],
        "c": [None, None, None, None, None, None],
        "b": [None, 0.25, 0.5, 0.25, 0.25, None],
    }
    assert busy_fractions([{"period_s": 1.0}]) == {}


def test_busy_fractions_of_an_agent_the_rows_leave_out_once_it_went_and_list_again_when_back() -> None:
    """The controller lists a gone agent once, in the first row after it went: absent after, it is blank; back under
    its name with its counter going on, it counts what it did since (not all its busy seconds in one interval)."""

    def row(period_s: float, **busy_s: tuple[float, str]) -> dict[str, Any]:
        agents = {n: {"role": "rollout", "site": "h20", "busy_s": b, "state": st} for n, (b, st) in busy_s.items()}
        return {"period_s": period_s, "agents": agents}

    rows = [
        row(2.0, a=(1.0, "running")),
        row(2.0, a=(2.0, "unreachable")),  # silent for a while: its last heartbeat's figure
        row(2.0, a=(2.0, "lost")),  # listed once more, gone (and not running at either end: blank)
        row(2.0),  # left out
        row(4.0, a=(4.0, "running")),  # back, its counter from 2 s on
    ]
    assert busy_fractions(rows) == {"a": [0.5, 0.5, None, None, 0.5]}


def test_busy_seconds_reported_every_other_iteration_are_spread_not_alternating() -> None:
    """Heartbeats (1 s) slower than iterations (0.5 s): the figure moves every other row."""

    def row(busy_s: float) -> dict[str, Any]:
        return {"period_s": 0.5, "agents": {"r": {"role": "rollout", "site": "s", "busy_s": busy_s}}}

    rows = [row(0.4), row(0.4), row(1.2), row(1.2), row(2.0), row(2.0)]
    assert busy_fractions(rows)["r"] == pytest.approx([0.8, 0.8, 0.8, 0.8, 0.8, 0.0])


def test_an_older_run_without_agents_delta_prime_or_units(tmp_path: Path) -> None:
    d = make_job_dir(tmp_path)
    old = ("agents", "delta_prime_s", "rollout_units")
    rows = [{k: v for k, v in metrics_row(i).items() if k not in old} for i in range(1, ITERATIONS + 1)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = build_report(d).html.read_text()
    assert parse(page).rows["iterations"] == ITERATIONS
    assert "<td>1</td><td>0.1500</td><td>3.00</td><td>1.50</td><td>+1.50</td><td>-</td><td>-</td>" in page


def test_a_count_written_as_a_float_is_shown_as_written(tmp_path: Path) -> None:
    # `_f(2.0, "d")`: "Unknown format code 'd' for object of type 'float'", a traceback (review of 4b75f51)
    d = make_job_dir(tmp_path)
    rows = [metrics_row(i) | {"rollout_units": 2.0} for i in range(1, 4)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "<td>2.0</td>" in build_report(d).html.read_text()


def test_scale_events_past_the_checkpoint_a_resume_went_back_to_are_left_out(tmp_path: Path) -> None:
    # a run scaled rollout-2 out at 2 and in at 6, failed, and was resumed from v4 (its rows 4… discarded): the '-in'
    # at 6 was drawn, and listed, on the resumed run's iteration 6, where rollout-2 never ran
    d = make_job_dir(tmp_path)
    scale = {"event": "scale", "agent": "rollout-2", "site": "h20", "reason": "manual"}
    events = [
        {"t": 1.0, **scale, "direction": "out", "iteration": 2},
        {"t": 2.0, **scale, "direction": "in", "iteration": 6},
        {"t": 3.0, "event": "resumed_from", "version": 4, "rows_kept": 4},
        {"t": 4.0, **scale, "agent": "rollout-3", "reason": "resume", "direction": "out", "iteration": 4},
    ]
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert [(e["agent"], e["iteration"]) for e in load(d).scales] == [("rollout-2", 2), ("rollout-3", 4)]
    assert parse(build_report(d).html.read_text()).rows["scale"] == 2


def test_a_resume_whose_time_or_version_is_a_bool_leaves_the_scale_events_in(tmp_path: Path) -> None:
    """A resumed_from event whose t (or version) is `true` (an edited file) says no time: the scale events stay, as
    event_time reads such a t (0), versus t read as 1.0 and the scale-in at 0.5 past v2 left out."""
    d = make_job_dir(tmp_path)
    scale = {"event": "scale", "agent": "rollout-2", "site": "h20", "reason": "manual", "direction": "in"}
    events = [
        {"t": 0.5, **scale, "iteration": 6},
        {"t": True, "event": "resumed_from", "version": 2},
        {"t": 3.0, "event": "resumed_from", "version": True},
        {"t": 2.0, **scale, "iteration": 7},
    ]
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert [e["iteration"] for e in load(d).scales] == [6, 7]


def test_a_scale_event_at_the_checkpoint_a_resume_went_back_to_is_left_out(tmp_path: Path) -> None:
    # a run scaled rollout-2 out at iteration 4 (the trainer at v4, as the checkpoint v4 was taken), failed, and was
    # resumed from v4: its row 4 went aside, the resumed run made its own (with its own units), but the '+rollout-2'
    # at 4 was still drawn and listed there
    d = make_job_dir(tmp_path)
    scale = {"event": "scale", "site": "h20", "reason": "rebalance", "direction": "out"}
    events = [
        {"t": 1.0, **scale, "agent": "rollout-1", "iteration": 3},
        {"t": 2.0, **scale, "agent": "rollout-2", "iteration": 4},
        {"t": 3.0, "event": "resumed_from", "version": 4, "rows_kept": 4},
        {"t": 4.0, **scale, "agent": "rollout-3", "reason": "resume", "iteration": 4},
    ]
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert [(e["agent"], e["iteration"]) for e in load(d).scales] == [("rollout-1", 3), ("rollout-3", 4)]


def test_the_report_parses_only_the_events_it_draws(tmp_path: Path) -> None:
    # it parsed every line of events.jsonl and held them all: a job of weeks writes a weights_applied event per unit
    # and weight version (64 units × 10⁴ versions: 640,000 lines, ≈ 130 MB, some 600 MB as dicts)
    d = make_job_dir(tmp_path)
    applied = {"event": "weights_applied", "agent": "rollout-1", "source": "trainer-0", "encoding": "delta"}
    scale = {"t": 5.0, "event": "scale", "agent": "rollout-2", "direction": "out", "iteration": 2}
    events = [{"t": 1.0 + v / 1000, **applied, "version": v} for v in range(500)]
    events += [scale, {"t": 6.0, "event": "resumed_from", "version": 4}, {"t": 7.0, **applied, "version": 500}]
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert [e["event"] for e in load(d).events] == ["scale", "resumed_from"]
    assert [e["agent"] for e in load(d).scales] == ["rollout-2"]


def test_the_report_holds_a_line_of_events_at_a_time_not_the_file(tmp_path: Path) -> None:
    # a job of weeks: a weights_applied event per version, its units' reports in it (64 units × 10⁵ versions, hundreds
    # of MB), which the report read whole, its text and its list of lines, to keep its few scale events
    d = make_job_dir(tmp_path)
    units = {f"rollout-{k}": {"t": 1.5, "fetch_s": 0.25} for k in range(64)}
    applied = {"event": "weights_applied", "source": "trainer-0", "encoding": "delta", "units": units}
    scale = {"t": 5.0, "event": "scale", "agent": "rollout-2", "direction": "out", "iteration": 2}
    with (d / "events.jsonl").open("w") as f:
        f.write("".join(json.dumps({"t": 1.0, **applied, "version": v}) + "\n" for v in range(1000)))
        f.write(json.dumps(scale) + "\n")
    size = (d / "events.jsonl").stat().st_size
    tracemalloc.start()
    try:
        scales = load(d).scales
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [e["agent"] for e in scales] == ["rollout-2"]
    assert size > 2_500_000 and peak < size // 10, (size, peak)  # was twice the file's size and more


@pytest.mark.parametrize(
    ("summary", "says"),
    [({"iterations": 4}, "'state' is None, not a word"), ({"state": "done", "ledger": [1]}, "'ledger' is list, not a")],
)
def test_a_summary_without_its_state_or_with_a_ledger_that_is_no_object_is_one_line(
    tmp_path: Path, summary: dict[str, Any], says: str
) -> None:
    # edited by hand: a KeyError ('state') or an AttributeError ('list' object has no attribute 'get') traceback
    d = make_job_dir(tmp_path)
    (d / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(RlctlError, match=rf"summary\.json: {says}"):
        build_report(d)


def test_the_checkpoints_get_a_table_with_the_reward_that_made_each(tmp_path: Path) -> None:
    from rlctl.config import load_job
    from rlctl.launch.jobdir import JobDir
    from tests.conftest import ROOT

    d = make_job_dir(tmp_path)
    assert "Checkpoints" not in build_report(d).html.read_text()  # none written (and a job.json of an older rlctl)
    jd = JobDir(d)
    jd.write_job(load_job(ROOT / "jobs" / "demo.yaml").spec, source="jobs/demo.yaml")
    for v in (6, 12):
        jd.event("checkpoint", version=v)
    page = build_report(d).html.read_text()
    assert parse(page).rows["checkpoints"] == 2
    # metrics rows 1 … 12 (fake_jobdir): v6 is made by iterations 1 … 6, rows 0 … 5, of which rows 1 … 5 are there
    assert "<td>v6</td>" in page and "<td>1–6</td><td>0.2500</td>" in page
    assert "<td>v12 (latest)</td>" in page and "<td>7–12</td><td>0.5250</td>" in page


def test_the_checkpoints_table_marks_a_damaged_checkpoint_as_status_does(tmp_path: Path) -> None:
    """v12's MANIFEST.trainer.json cut short, on a local site (its files on this machine): the report listed it as
    'v12 (latest)', sound, versus 'damaged: …' and v6 the latest, the check `status --checkpoints` makes (a stat per
    file, no weights hashed); a job whose parts' files are not here says under the table that none was checked."""
    from rlctl.checkpoint.files import write_part
    from rlctl.config import load_job
    from rlctl.config.inventory import Site
    from rlctl.launch.backends import write_sites
    from rlctl.launch.jobdir import JobDir
    from rlctl.launch.stage import write_staged
    from tests.conftest import ROOT

    d = make_job_dir(tmp_path)
    jd = JobDir(d)
    jd.write_job(load_job(ROOT / "jobs" / "demo.yaml").spec, source="jobs/demo.yaml")
    for v in (6, 12):
        jd.event("checkpoint", version=v)
    unchecked = "the trainer and controller parts&#x27; manifests not checked here"
    assert unchecked in build_report(d).html.read_text()  # never launched: where its parts are is unknown
    site = {
        "datacenter": "a",
        "gpu": "CPU",
        "nodes": [{"host": "localhost", "gpus": 2}],
        "scheduler": {"kind": "local"},
    }
    jd.write_json(jd.plan_json, {"trainer": {"site": "local", "ranks": 1}, "controller_site": "local", "rollout": []})
    write_sites(d, {"local": Site.model_validate(site)})
    write_staged(d, {"local": {"roots": {"localhost": str(d)}, "files": []}})
    for v in (6, 12):
        weights = {"model": lambda p, v=v: p.mkdir() or (p / "w.bin").write_bytes(bytes(v))}
        digest = write_part(jd.checkpoint(v), "trainer", weights, meta={"counters": {"version": v}})
        state = {"controller": lambda p: p.mkdir() or (p / "state.json").write_text("{}")}
        write_part(jd.checkpoint(v), "controller", state, meta={"version": v, "trainer_digest": digest})
    page = build_report(d).html.read_text()
    assert "<td>v12 (latest)</td>" in page and "not checked here" not in page
    manifest = jd.checkpoint(12) / "MANIFEST.trainer.json"
    manifest.write_text(manifest.read_text()[:20])
    page = build_report(d).html.read_text()
    assert "<td>v6 (latest)</td>" in page, page
    assert "<td>v12 (damaged: trainer part: MANIFEST.trainer.json does not parse (JSONDecodeError" in page


def test_the_reward_first_to_last_says_over_which_iterations(tmp_path: Path) -> None:
    # the summary's means over its first/last `reward_window` iterations and the first/last rows' own (no summary)
    # both read `0.150 → 0.700` under one label, the window unsaid
    d = make_job_dir(tmp_path)
    rows = [metrics_row(i) for i in range(1, ITERATIONS + 1)]
    write_lines(d / "metrics.jsonl", rows)
    page = build_report(d).html.read_text().replace("\n", "")
    first, last = _fmt(rows[0]["reward_mean"]), _fmt(rows[-1]["reward_mean"])
    span = f"{first} → {last} (iteration 1 → {ITERATIONS}, one each: no summary)"
    assert f"<td>reward first → last</td><td>{span}</td>" in page, page
    summary = {"state": "done", "iterations": ITERATIONS, "reward_first": 0.15, "reward_last": 0.7, "reward_window": 2}
    (d / "summary.json").write_text(json.dumps(summary))
    page = build_report(d).html.read_text().replace("\n", "")
    span = "0.150 → 0.700 (means over the first and last 2 iterations)"
    assert f"<td>reward first → last</td><td>{span}</td>" in page, page


def _fmt(v: float) -> str:
    return format(v, ".3f")


def test_a_scale_out_of_a_unit_that_never_joined_is_a_failed_start_not_a_mark(tmp_path: Path) -> None:
    # rollout-3 was started (its scale "out") but never joined: stopped at its join bound (`scale_failed`); the
    # report drew it as a unit added and listed it as any other scale-out
    from rlctl.report import _scale_marks
    from rlctl.reporthtml import _scale_rows

    d = make_job_dir(tmp_path)
    scale = {"event": "scale", "site": "h20", "reason": "manual", "direction": "out"}
    events = [
        {"t": 1.0, **scale, "agent": "rollout-2", "iteration": 2},
        {"t": 2.0, **scale, "agent": "rollout-3", "iteration": 3},
        {"t": 3.0, "event": "scale_failed", "agent": "rollout-3", "site": "h20", "error": "not joined within 600 s"},
    ]
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    rec = load(d)
    rows = {r[3]: r for r in _scale_rows(rec)}
    assert rows["rollout-2"][2] == "out" and rows["rollout-2"][5] == "manual"
    assert rows["rollout-3"][2] == "out (failed start)"
    assert rows["rollout-3"][5] == "manual; it never joined: not joined within 600 s"

    class Axes:
        def __init__(self) -> None:
            self.lines: list[float] = []
            self.texts: list[str] = []

        def axvline(self, x: float, **_: Any) -> None:
            self.lines.append(x)

        def annotate(self, text: str, **_: Any) -> None:
            self.texts.append(text)

    top, bottom = Axes(), Axes()
    _scale_marks(rec, top, bottom)
    assert top.lines == bottom.lines == [2] and top.texts == ["+rollout-2 (manual)"]


def test_a_scale_out_that_exited_before_it_joined_or_a_replacement_not_joined_is_a_failed_start(tmp_path: Path) -> None:
    # the scaler says these with other events than scale_failed: a unit asked for that exited before it joined
    # (`unit_exited_before_joining`), a replacement's attempt not joined within its bound (`replacement_not_joined`,
    # by the unit); the report listed each as a unit added ('out') and drew it as one
    from rlctl.reporthtml import _scale_rows

    d = make_job_dir(tmp_path)
    scale = {"event": "scale", "site": "h20", "direction": "out"}
    events = [
        {"t": 1.0, **scale, "reason": "manual", "agent": "rollout-3", "iteration": 2},
        {"t": 2.0, "event": "unit_exited_before_joining", "agent": "rollout-3", "site": "h20"},
        {"t": 3.0, **scale, "reason": "replace", "agent": "rollout-4", "iteration": 3},
        {"t": 4.0, "event": "replacement_not_joined", "lost": "rollout-1", "by": "rollout-4", "error": "not joined"},
        {"t": 5.0, **scale, "reason": "replace", "agent": "rollout-5", "iteration": 4},
    ]
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    rows = {r[3]: r for r in _scale_rows(load(d))}
    assert rows["rollout-3"][2] == rows["rollout-4"][2] == "out (failed start)"
    assert rows["rollout-3"][5] == "manual; it never joined: exited before it joined (its log says why)"
    assert rows["rollout-4"][5] == "replace; it never joined: not joined"
    assert rows["rollout-5"][2] == "out"
