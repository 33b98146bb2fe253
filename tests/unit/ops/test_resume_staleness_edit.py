"""A resume given `--iterations` under a pipeline.staleness edited in job.json since the launch past that count names
the edit (job.json's field, its value at the launch), exit 2, before anything starts or is written; a staleness the
job was launched with still bounds the count as the job's own. Before, the line blamed the count alone
(`--iterations 12: fewer than the job's pipeline.staleness 20`), though the count fit the job as launched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import run_cli
from tests.unit.ops.test_resume_edit_check import edit, refused_resume, started  # noqa: F401 (started: a fixture)
from tests.unit.ops.test_resume_point import split_job


def test_a_staleness_edited_past_the_resumes_count_is_said_as_the_edit(
    tmp_path: Path,
    started: list[dict[str, Any]],  # noqa: F811
) -> None:
    jd = split_job(tmp_path)
    edit(jd, "pipeline", {"staleness": 20})
    line = refused_resume(jd, started, "--iterations", "12")
    assert line.startswith(
        f"rlctl: error: {jd.job_json}: job.pipeline.staleness was edited since the launch (null → 20), past "
        "--iterations 12"
    ), line
    assert line.endswith("(hint: put job.pipeline.staleness back to null in job.json, or use --iterations 20 or more)")


def test_a_staleness_the_job_was_launched_with_still_bounds_the_count_as_the_jobs(
    tmp_path: Path,
    started: list[dict[str, Any]],  # noqa: F811
) -> None:
    jd = split_job(tmp_path)
    edit(jd, "pipeline", {"staleness": 20}, as_launched=True)
    r = run_cli("launch", "--resume", str(jd.path), "--iterations", "12")
    assert r.exit_code == 2, r.stderr
    (line,) = r.stderr.splitlines()
    assert line == "rlctl: error: --iterations 12: fewer than the job's pipeline.staleness 20; use at least 20", line
