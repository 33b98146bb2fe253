"""`rlctl report` of a job whose job.json is JSON of the wrong shape (edited by hand): one line naming the file and
the field that is not there or not an object, versus one ending in Python's own words ('list indices must be
integers or slices, not str', or just 'job')."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from tests.unit.report.fake_jobdir import make_job_dir


@pytest.mark.parametrize(
    ("record", "said"),
    [
        ([1, 2], "its top level is an array, not a JSON object with job.name"),
        ({"source": "x.yaml"}, "no job.name in it (no job)"),
        ({"job": "demo"}, "job is a string, not a JSON object with job.name"),
        ({"job": {"name": "demo"}}, "no job.pipeline.mode in it (no job.pipeline)"),
        ({"job": {"name": "demo", "pipeline": None}}, "job.pipeline is null, not a JSON object with job.pipeline.mode"),
        ({"job": {"name": "demo", "pipeline": {}}}, "no job.pipeline.mode in it"),
    ],
)
def test_a_job_json_of_the_wrong_shape_is_named_in_one_line(tmp_path: Path, record: Any, said: str) -> None:
    d = make_job_dir(tmp_path)
    (d / "job.json").write_text(json.dumps(record))
    r = run_cli("report", str(d))
    assert r.exit_code == 1, r.stderr
    assert r.stderr == f"rlctl: error: {d / 'job.json'}: {said} (hint: was it edited?)\n", r.stderr
