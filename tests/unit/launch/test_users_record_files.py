"""A fresh launch into a directory holding the user's events.jsonl or metrics.jsonl (no launch prepared a job there)
is refused: the job appended its record to the user's files."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.errors import UsageError
from rlctl.launch.jobdir import JobDir, refuse_taken


@pytest.mark.parametrize("name", ["events.jsonl", "metrics.jsonl", "samples.jsonl", "controller.json"])
def test_a_users_record_file_is_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / name).write_text('{"mine": 1}\n')
    with pytest.raises(UsageError) as e:
        refuse_taken(tmp_path / "mine")
    assert f"--job-dir: {tmp_path / 'mine'} holds {name}, which rlctl did not write" in str(e.value)
    assert "choose another --job-dir" in (e.value.hint or "")


def test_a_launch_stopped_while_it_prepared_may_be_launched_again(tmp_path: Path) -> None:
    jd = JobDir.create("demo", explicit=tmp_path / "run")  # `prepare` wrote its secret, then a stop its event
    jd.secret()
    jd.event("prepare_stopped")
    refuse_taken(jd.path)  # nothing raised
    refuse_taken(tmp_path / "new")  # nor for a directory not there
