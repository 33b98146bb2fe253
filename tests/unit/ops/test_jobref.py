"""Which job `rlctl status|stop|logs … JOB` means (rlctl.ops.jobref.resolve): a directory in the working
directory named like a job is that job only when it is a job directory (it holds job.json)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.errors import UsageError
from rlctl.ops.jobdb import JobDB
from rlctl.ops.jobref import resolve


@pytest.fixture
def db(tmp_path: Path) -> JobDB:
    db = JobDB(tmp_path / "home" / "jobs.db")
    for name, job in (("ar1", "ar"), ("tiny1", "tiny")):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "job.json").write_text("{}")
        db.put(name, job_dir=str(tmp_path / "runs" / name), spec={"name": job})
    return db


def test_a_folder_named_like_a_job_does_not_hide_it(tmp_path: Path, db: JobDB, monkeypatch) -> None:
    # `rlctl status ar` beside a folder ar/ (the job's config folder) said "ar: not a job directory (no job.json)"
    cwd = tmp_path / "cwd"
    (cwd / "ar").mkdir(parents=True)
    (cwd / "ar1").mkdir()
    monkeypatch.chdir(cwd)
    assert resolve("ar", db=db).id == "ar1"  # by the job's name
    ref = resolve("ar1", db=db)  # by its id
    assert (ref.id, ref.jobdir.path, ref.row is not None) == ("ar1", tmp_path / "runs" / "ar1", True)
    (cwd / "other").mkdir()
    with pytest.raises(UsageError, match=r"^other: not a job directory \(no job.json\), and no job 'other' in"):
        resolve("other", db=db)
    (cwd / "other" / "plan.json").write_text("{}")  # a job dir whose job.json was removed: not "not a job directory"
    with pytest.raises(UsageError, match=r"^other/job.json: missing \(the resolved job, written with its plan.json\)$"):
        resolve("other", db=db)


def test_a_job_directory_and_another_indexed_job_of_that_name_are_refused(
    tmp_path: Path, db: JobDB, monkeypatch
) -> None:
    cwd = tmp_path / "cwd"
    (cwd / "tiny").mkdir(parents=True)
    (cwd / "tiny" / "job.json").write_text("{}")
    monkeypatch.chdir(cwd)
    with pytest.raises(UsageError) as e:
        resolve("tiny", db=db)
    here, indexed = cwd / "tiny", tmp_path / "runs" / "tiny1"
    assert str(e.value) == f"'tiny' names two jobs: the job directory {here} and the indexed job tiny1 ({indexed})"
    assert resolve("./tiny", db=db).jobdir.path == cwd / "tiny"  # as a path: the directory
    monkeypatch.chdir(tmp_path / "runs")
    ref = resolve("tiny1", db=db)  # the job's own directory and its row: one job
    assert ref.jobdir.path == tmp_path / "runs" / "tiny1" and ref.row is not None and ref.row.name == "tiny1"


def test_no_job_named_and_a_job_name_both_mean_the_one_launched_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `rlctl status` took the row updated last: another job's launcher recording its end, or an operator's stop of
    # it, made `rlctl stop` (no JOB) stop that job and not the one just launched, which `rlctl stop demo` meant
    clock = iter(float(t) for t in range(100, 1000, 100))
    monkeypatch.setattr("rlctl.ops.jobdb.time.time", lambda: next(clock))
    db = JobDB(tmp_path / "home" / "jobs.db")
    for name in ("demo-1", "demo-2", "other-1"):
        (tmp_path / name).mkdir()
    db.put("demo-1", job_dir=str(tmp_path / "demo-1"), spec={"name": "demo"})  # t 100
    db.put("demo-2", job_dir=str(tmp_path / "demo-2"), spec={"name": "demo"})  # t 200: launched last
    db.update("demo-1", state="stopped")  # t 300: the older one's launcher records its end
    assert (resolve(None, db=db).id, resolve("demo", db=db).id) == ("demo-2", "demo-2")
    db.put("demo-1", job_dir=str(tmp_path / "demo-1"), spec={"name": "demo"})  # t 400: `launch --resume demo-1`
    db.update("demo-2", state="running")  # t 500
    assert (resolve(None, db=db).id, resolve("demo", db=db).id) == ("demo-1", "demo-1")
    db.put("other-1", job_dir=str(tmp_path / "other-1"), spec={"name": "other"})  # t 600
    assert (resolve(None, db=db).id, resolve("demo", db=db).id) == ("other-1", "demo-1")


def test_a_row_without_its_launch_time_counts_from_its_creation(tmp_path: Path) -> None:
    db = JobDB(tmp_path / "jobs.db")
    db.put("old-1", job_dir="/r/old-1", spec={"name": "old"})
    db._conn.execute("UPDATE jobs SET info='{}'")  # as an rlctl before `launched_s` wrote it
    row = db.get("old-1")
    assert row.launched_s == row.created_s


def test_an_unknown_job_lists_some_job_names_not_every_runs_id(tmp_path: Path, db: JobDB, monkeypatch) -> None:
    # it listed every id and name the index ever held: a line that grows for good on a shared machine
    monkeypatch.chdir(tmp_path)
    for i in range(20):
        for run in range(3):
            db.put(f"job{i:02d}-{run}", job_dir=str(tmp_path / "gone"), spec={"name": f"job{i:02d}"})
    with pytest.raises(UsageError) as e:
        resolve("jbo03", db=db)
    said = str(e.value)
    assert "job names: ar, job00, job01," in said and " and 10 more" in said and "job00-1" not in said, said
    assert said.endswith("(did you mean 'job03'?)"), said


def test_a_job_under_a_home_that_is_not_there_is_no_job(tmp_path: Path, db: JobDB, monkeypatch) -> None:
    # `rlctl status ~nosuchuser/j` (no such user) ended in a RuntimeError traceback ('Could not determine home
    # directory', Path.expanduser's), exit 1, versus the line of a job that is not there
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=r"^no job '~rlctl-no-such-user/j' in the index"):
        resolve("~rlctl-no-such-user/j", db=db)


def test_a_job_directory_still_being_prepared_is_its_indexed_job(tmp_path: Path, db: JobDB) -> None:
    # a launch in its SFT warm-up: in the index, no job.json yet (`prepare` writes it last); `rlctl stop DIR` said
    # "not a job directory" (and, by name, meant the job launched before it)
    preparing = tmp_path / "runs" / "ar2"
    preparing.mkdir()
    db.put("ar2", job_dir=str(preparing), spec={"name": "ar"})
    ref = resolve(str(preparing), db=db)
    assert (ref.id, ref.jobdir.path, ref.row is not None) == ("ar2", preparing, True)
    assert resolve(None, db=db).id == resolve("ar", db=db).id == "ar2"


def test_a_job_directory_reached_through_a_symlink_is_its_indexed_job(tmp_path: Path, db: JobDB) -> None:
    # the index keeps the job dir as the launch was given it (absolute, not resolved): a job dir under a symlinked
    # jobs/ was `not a job directory` while being prepared, and without its row once prepared
    (tmp_path / "disk").mkdir()
    (tmp_path / "jobs").symlink_to(tmp_path / "disk")
    linked = tmp_path / "jobs" / "ar3"
    linked.mkdir()
    db.put("ar3", job_dir=str(linked), spec={"name": "ar"})
    real = tmp_path / "disk" / "ar3"
    assert resolve(str(real), db=db).id == "ar3"  # being prepared: no job.json
    (real / "job.json").write_text("{}")
    ref = resolve(str(real), db=db)
    assert ref.row is not None and ref.row.name == "ar3"


def test_a_job_file_given_for_a_job_is_said_so_with_its_name(tmp_path: Path, db: JobDB, monkeypatch) -> None:
    # `rlctl status jobs/ar.yaml` said "no job 'jobs/ar.yaml' in the index; job names: ar, tiny"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "ar.yaml").write_text("apiVersion: rlctl/v1\nkind: Job\nname: ar\n")
    with pytest.raises(UsageError, match=r"^jobs/ar.yaml: a job file; this command takes a launched job") as e:
        resolve("jobs/ar.yaml", db=db)
    assert e.value.hint is not None and "give the job's name, ar (its latest run)" in e.value.hint
    (tmp_path / "notes.yaml").write_text("- a list\n")  # not a job file: the index's names, as before
    with pytest.raises(UsageError, match=r"^no job 'notes.yaml' in the index"):
        resolve("notes.yaml", db=db)


def test_a_job_file_of_a_job_never_launched_is_said_so(tmp_path: Path, db: JobDB, monkeypatch) -> None:
    # its hint said "give the job's name, new (its latest run)": a name the index has not either ("no job 'new'")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "new.yaml").write_text("apiVersion: rlctl/v1\nkind: Job\nname: new\n")
    with pytest.raises(UsageError, match=r"^new.yaml: a job file; this command takes a launched job") as e:
        resolve("new.yaml", db=db)
    assert e.value.hint == "no job 'new' was launched; `rlctl launch new.yaml` launches it"


def test_a_command_that_changes_a_job_needs_it_named_while_two_run(tmp_path: Path, db: JobDB) -> None:
    """`rlctl stop` / `scale` with JOB omitted while two jobs of the index run is refused in one line naming them
    (exit 2), versus the one launched last stopped: a week-long job resumed after a test job was launched went with a
    bare `rlctl stop` meant for the test. One job running: that one (a bare stop said the finished job launched after it
    had ended); none running, or a command that only reads: the one launched last."""
    db.update("ar1", state="running", info={"launched_s": 100.0})
    db.update("tiny1", state="finished", info={"launched_s": 200.0})
    assert resolve(None, db=db, changes="stop").id == "ar1"  # the one running, not the latest (ended)
    assert resolve(None, db=db).id == "tiny1"  # a command that only reads: the one launched last
    db.update("ar1", state="stopped")
    assert resolve(None, db=db, changes="stop").id == "tiny1"  # none running: the one launched last, as before
    db.update("ar1", state="running")
    db.update("tiny1", state="running")
    with pytest.raises(UsageError) as e:
        resolve(None, db=db, changes="stop")
    assert str(e.value) == "2 jobs are running (tiny1, ar1): `rlctl stop` needs the job named"
    assert (
        e.value.exit_code == 2
        and e.value.hint is not None
        and "`rlctl stop tiny1` for the one launched last" in e.value.hint
    )
    assert resolve("ar1", db=db, changes="stop").id == "ar1"  # named: no question
    assert resolve(None, db=db).id == "tiny1"  # `status`, `logs`: the one launched last
