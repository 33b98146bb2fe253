"""A fresh launch into a directory holding the user's events.jsonl or metrics.jsonl (no launch made a job there: it
writes the secret as it reserves its index row) is refused: the job appended its record to the user's files."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import pytest

from rlctl.config import load_job
from rlctl.errors import UsageError
from rlctl.launch.jobdir import JobDir, refuse_taken
from rlctl.ops.counts import resolve_job
from rlctl.ops.jobdb import LIVE, JobDB
from rlctl.ops.jobref import resolve
from rlctl.ops.launchdir import launch_dir
from rlctl.ops.runstate import STOP_REQUESTED
from rlctl.ops.stop import stop

DEMO = Path(__file__).resolve().parents[3] / "jobs" / "demo.yaml"


@pytest.mark.parametrize("name", ["events.jsonl", "metrics.jsonl", "samples.jsonl", "controller.json"])
def test_a_users_record_file_is_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / name).write_text('{"mine": 1}\n')
    with pytest.raises(UsageError) as e:
        refuse_taken(tmp_path / "mine")
    assert (
        f"--job-dir: {tmp_path / 'mine'} holds {name}, which rlctl did not write (no launch made a job there)"
        in str(e.value)
    )  # was: "(no launch prepared a job there)", as a launch wrote the secret in `prepare` then
    assert "choose another --job-dir" in (e.value.hint or "")


def test_a_launch_stopped_while_it_prepared_may_be_launched_again(tmp_path: Path) -> None:
    jd = JobDir.create("demo", explicit=tmp_path / "run")  # its reservation wrote its secret, then a stop its event
    jd.secret()
    jd.event("prepare_stopped")
    refuse_taken(jd.path)  # nothing raised
    refuse_taken(tmp_path / "new")  # nor for a directory not there


def test_a_launch_that_ended_before_it_prepared_after_a_stop_may_be_launched_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rlctl stop` found the job by its index row (`launching`) and wrote its request in events.jsonl before the
    launch's `prepare` wrote the secret; the launch then ended (an error, Ctrl-C) before it did: a relaunch into the
    directory was refused as one holding the user's events.jsonl."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    job = load_job(DEMO)
    spec = resolve_job(job, iterations=None, mode=None)
    jd = launch_dir(job, spec, tmp_path / "run")
    result = stop(resolve(jd.id), grace_s=0.0)  # no controller yet, no launcher holds it: its request written
    assert result["graceful"].startswith("no controller yet"), result
    assert jd.read_events(STOP_REQUESTED)
    with closing(JobDB()) as db:  # the launch ended before `prepare` (its launcher's row: failed)
        db.update(jd.id, state="failed", only_from=LIVE)
    assert launch_dir(job, spec, tmp_path / "run").path == jd.path  # nothing raised
