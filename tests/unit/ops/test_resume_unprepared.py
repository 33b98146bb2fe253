"""`launch --resume` of a job without job.json (`prepare` writes it last): one whose launch ended before it was
prepared is said to have nothing to resume; one whose launcher still prepares it (its lock held) is said to be
prepared, versus told it was stopped or failed and to launch it anew (a second job)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.errors import UsageError
from rlctl.launch.jobdir import JobDir
from rlctl.ops.run import refuse_if_unprepared


def test_a_job_whose_launch_ended_before_it_was_prepared_has_nothing_to_resume(tmp_path: Path) -> None:
    jd = JobDir.create("prep", explicit=tmp_path / "prep-1")
    with pytest.raises(UsageError, match=r"^job prep-1 was never prepared") as e:
        refuse_if_unprepared(jd, source="jobs/prep.yaml")
    assert e.value.hint == "launch it anew: `rlctl launch jobs/prep.yaml`"


def test_a_job_its_launcher_still_prepares_is_said_to_be_prepared(tmp_path: Path) -> None:
    jd = JobDir.create("prep", explicit=tmp_path / "prep-1")
    said = r"^job prep-1 is being prepared by its launcher \(pid \d+ on "
    with jd.launcher_lock(), pytest.raises(UsageError, match=said) as e:  # the launch, in its SFT warm-up
        refuse_if_unprepared(jd, source="jobs/prep.yaml")
    assert "rlctl stop prep-1" in (e.value.hint or "")
