"""`from_run`: the held-out figures of a run's own evaluations (the trainer's site reached over SSH)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from rlctl.config.job import JobFile
from rlctl.launch.jobdir import JobDir
from rlctl.ops.evaluation import from_run, heldout_line


def _run(tmp_path: Path, rows: list[dict[str, Any]]) -> JobDir:
    jd = JobDir.create("ev", explicit=tmp_path / "ev-1")
    jd.evaluations.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return jd


def _row(version: int, **kw: Any) -> dict[str, Any]:
    return {"version": version, "prompts": 8, "greedy_exact": 0.5, "versions": [version], **kw}


def test_one_evaluation_counts_its_reward_failures_once(tmp_path: Path) -> None:
    """The run evaluated its last version only (first is last): its 3 reward failures were said as 6."""
    spec = cast(JobFile, SimpleNamespace(iterations=4))
    out = from_run(_run(tmp_path, [_row(4, reward_failures=3)]), spec)
    assert out["evaluations"] == 1 and out["reward_failures"] == 3


def test_the_first_and_last_evaluations_reward_failures_add_up(tmp_path: Path) -> None:
    spec = cast(JobFile, SimpleNamespace(iterations=4))
    rows = [_row(2, reward_failures=1), _row(3, reward_failures=5), _row(4, reward_failures=3)]
    out = from_run(_run(tmp_path / "a", rows), spec)
    assert out["reward_failures"] == 4 and (out["greedy_exact_first"], out["versions_last"]) == (0.5, [4])
    assert "reward_failures" not in from_run(_run(tmp_path / "b", [_row(2), _row(4)]), spec)


def test_a_row_whose_version_is_null_or_text_is_passed_over(tmp_path: Path) -> None:
    """An evaluations.jsonl row whose version is null or text (an edited file) is passed over, versus int(None) or
    int('v3') raising as the launch's held-out evaluation read the run's figures."""
    spec = cast(JobFile, SimpleNamespace(iterations=4))
    rows = [_row(2, greedy_exact=0.25), {**_row(3), "version": None}, {**_row(3), "version": "v3"}, _row(4)]
    out = from_run(_run(tmp_path, rows), spec)
    assert (out["evaluations"], out["greedy_exact_first"], out["greedy_exact_last"]) == (2, 0.25, 0.5)


def test_a_reward_failures_count_that_is_null_or_text_counts_none(tmp_path: Path) -> None:
    """A first or last row whose reward_failures is null or text (an edited file) counts none, versus a TypeError
    (`0 + None`) as the launch's held-out evaluation read the run's figures."""
    spec = cast(JobFile, SimpleNamespace(iterations=4))
    rows = [_row(2, reward_failures=None), _row(4, reward_failures=3)]
    assert from_run(_run(tmp_path, rows), spec)["reward_failures"] == 3
    out = from_run(_run(tmp_path / "b", [_row(2), _row(4, reward_failures="3")]), spec)
    assert "reward_failures" not in out


def test_a_row_missing_prompts_versions_or_the_last_rows_figure_is_passed_over(tmp_path: Path) -> None:
    """A last row without prompts or versions, or a first row without the last's greedy figure (an older version's
    row, an edited one), leaves that field out and the summary's line still reads, versus a KeyError that lost the
    run's held-out figures as the launch ended."""
    spec = cast(JobFile, SimpleNamespace(iterations=4))
    first = {"version": 2, "greedy_reward": 0.25}
    last = {"version": 4, "greedy_reward": 0.75, "greedy_exact": 0.5, "reward_failures": 2}
    out = from_run(_run(tmp_path, [first, last]), spec)
    assert out == {
        "source": "during the run",
        "evaluations": 2,
        "greedy_reward_first": 0.25,
        "greedy_reward_last": 0.75,
        "reward_failures": 2,
    }
    assert heldout_line(out) == (
        "reward 0.250 → 0.750 (greedy, during the run); 2 reward calls failed, scored task.reward_on_error"
    )
    rows = [_row(2, versions=None), _row(4, versions=[3, "4"], greedy_reward=0.5)]
    out = from_run(_run(tmp_path / "b", rows), spec)
    assert "versions_first" not in out and "versions_last" not in out and "greedy_reward_first" not in out
    assert heldout_line(out) == "exact 0.500 → 0.500, reward - → - (greedy, 8 prompts, during the run)"


def test_a_mixed_runs_first_and_last_figures_per_data_source_are_in_its_summary(tmp_path: Path) -> None:
    """Rows with greedy_reward_by_source (held-out prompts of two data_sources): the summary has each source's first
    and last, a figure that is no number left out, and the line says them; rows without it (one source) as before."""
    spec = cast(JobFile, SimpleNamespace(iterations=4))
    first, last = {"a/x": 0.25, "b": 0.5}, {"a/x": 0.75, "b": "edited"}
    rows = [
        _row(2, greedy_reward=0.4, greedy_reward_by_source=first),
        _row(4, greedy_reward=0.6, greedy_reward_by_source=last),
    ]
    out = from_run(_run(tmp_path / "a", rows), spec)
    assert (out["greedy_reward_first_by_source"], out["greedy_reward_last_by_source"]) == (first, {"a/x": 0.75})
    assert heldout_line(out).endswith("; by data_source: a/x 0.250 → 0.750, b 0.500 → -")
    plain = from_run(_run(tmp_path / "b", [_row(2, greedy_reward=0.4), _row(4, greedy_reward=0.6)]), spec)
    assert not any("by_source" in k for k in plain)
