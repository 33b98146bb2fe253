"""A job's id (`JobDir.id`): its directory's name, unless a fresh launch finds another job of that name in the index
(`JobDB.id_for`); every command names the job by it, and the sites' job dirs are `W/jobs/<id>`."""

from __future__ import annotations

import json
import re
import shutil
from contextlib import closing
from pathlib import Path

import pytest

from rlctl.config import load_job
from rlctl.errors import LaunchError, UsageError
from rlctl.launch.jobdir import JobDir
from rlctl.launch.sitefs import site_root
from rlctl.ops.counts import resolve_job
from rlctl.ops.detach import this_launcher
from rlctl.ops.jobdb import JobDB
from rlctl.ops.jobref import resolve
from rlctl.ops.launchdir import launch_dir

DEMO = Path(__file__).resolve().parents[3] / "jobs" / "demo.yaml"


def test_a_launch_into_another_directory_of_the_same_name_gets_its_own_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh launch into /b/run while the index holds a job in /a/run took over /a/run's row: `rlctl status run`
    and `rlctl stop run` then meant the new job, and both jobs had the site job dir `W/jobs/run`."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    job = load_job(DEMO)
    spec = resolve_job(job, iterations=None, mode=None)

    def launched(where: Path) -> JobDir:
        jd = launch_dir(job, spec, where)
        with closing(JobDB()) as db:
            db.put(jd.id, job_dir=str(jd.path), spec={"name": spec.name})
        (jd.path / "job.json").write_text("{}")
        return jd

    a = launched(tmp_path / "a" / "run")
    b = launched(tmp_path / "b" / "run")
    assert a.id == "run" and b.id.startswith("run-") and len(b.id) == len("run-") + 8, (a.id, b.id)
    assert JobDir(b.path).id == b.id  # what every later command reads back
    with closing(JobDB()) as db:
        assert [(r.name, r.job_dir) for r in db.list()] == [("run", str(a.path)), (b.id, str(b.path))]
        assert resolve("run", db=db).jobdir.path == a.path
        assert resolve(b.id, db=db).jobdir.path == b.path
        assert resolve(str(b.path), db=db).id == b.id
    site = job.inventory.sites["local"]
    site = site.model_copy(update={"scheduler": site.scheduler.model_copy(update={"workdir": str(tmp_path / "w")})})
    assert site_root(site, a.id, here=a.path) != site_root(site, b.id, here=b.path)
    assert launch_dir(job, spec, tmp_path / "b2" / "run").id not in ("run", b.id)  # one per directory
    shutil.rmtree(a.path)  # a row whose directory is gone is taken over, as before
    assert launch_dir(job, spec, tmp_path / "c" / "run").id == "run"


def test_launches_at_once_into_directories_of_the_same_name_take_two_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two launchers that each chose their id before either had put its row (`rlctl launch` twice at the same
    instant) both chose `run`: the row was put later, once preparing began. The id and its `launching` row are one
    transaction now, and the row names its launcher, so that a launcher gone before it prepared is seen as gone."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    job = load_job(DEMO)
    spec = resolve_job(job, iterations=None, mode=None)
    a, b = (launch_dir(job, spec, tmp_path / d / "run") for d in ("a", "b"))
    assert a.id == "run" != b.id, (a.id, b.id)
    with closing(JobDB()) as db:
        rows = {r.name: r for r in db.list()}
    assert {n: (r.job_dir, r.state) for n, r in rows.items()} == {
        "run": (str(a.path), "launching"),
        b.id: (str(b.path), "launching"),
    }
    assert rows["run"].info["launcher"] == this_launcher() and rows["run"].spec["name"] == spec.name
    assert JobDir(b.path).id == b.id  # written before the row was committed

    def cannot_write(job_id: str) -> None:
        raise OSError("read-only file system")

    with closing(JobDB()) as db, pytest.raises(OSError):  # the id not recorded in its dir: no row either
        db.reserve(tmp_path / "c" / "run", spec={}, info={}, record=cannot_write)
    with closing(JobDB()) as db:
        assert len(db.list()) == 2


def test_a_second_launch_into_the_directory_a_launch_prepares_is_refused_and_leaves_its_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rlctl launch demo.yaml --job-dir run` again while the first launch prepares run (its SFT warm-up: no job.json
    yet): the second put its own `launching` row over the first's (its launcher, its job file) before the launcher
    lock refused it, and the first job's row named a launcher that had exited."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    job = load_job(DEMO)
    spec = resolve_job(job, iterations=None, mode=None)
    first = launch_dir(job, spec, tmp_path / "run")
    with first.launcher_lock():  # the first launcher, preparing the job
        with closing(JobDB()) as db:
            db.update(first.id, info={"source": str(DEMO)})
            before = db.get(first.id)
        with pytest.raises(UsageError, match=f"^--job-dir: {tmp_path / 'run'}: a launch is preparing a job there "):
            launch_dir(job, spec, tmp_path / "run")
    with closing(JobDB()) as db:
        assert db.list() == [before]


def test_the_directory_name_needs_no_record(tmp_path: Path) -> None:
    jd = JobDir.create("j", explicit=tmp_path / "run")
    assert jd.id == "run"
    jd.name_as("run-0123abcd")
    assert JobDir(jd.path).id == "run-0123abcd"
    jd.name_as("run")
    assert not (jd.path / ".job-id").exists() and jd.id == "run"
    assert JobDir(tmp_path / "gone").id == "gone"


def test_a_job_directory_under_a_home_that_is_not_there_is_refused() -> None:
    # `launch --job-dir '~nosuchuser/run'` (no such user) ended in a RuntimeError traceback, exit 1
    # (Path.expanduser's 'Could not determine home directory'), versus one line
    with pytest.raises(UsageError, match=r"^~rlctl-no-such-user/run: ~rlctl-no-such-user is no home directory here"):
        JobDir.choose_path("j", explicit="~rlctl-no-such-user/run")
    assert JobDir.choose_path("j", explicit="~/run") == Path.home() / "run"


@pytest.mark.parametrize("recorded", ["../../etc", "a/b", "..", ".", "a\tb"])
def test_a_hand_edited_job_id_that_is_no_id_is_refused_naming_its_file(tmp_path: Path, recorded: str) -> None:
    # it was taken as it was: the sites' job dirs are W/jobs/<id>, so `../../x` named a directory outside them
    jd = JobDir.create("j", explicit=tmp_path / "run")
    (jd.path / ".job-id").write_text(recorded + "\n")
    with pytest.raises(LaunchError, match=rf"^{jd.path}/.job-id: {re.escape(repr(recorded))} is no job id \(one"):
        _ = JobDir(jd.path).id


@pytest.mark.parametrize("name", ["lr=1e-5", "run 2", "_scratch", "exp+bs64"])
def test_the_id_a_launch_records_for_a_directory_of_any_name_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # a launch into /b/lr=1e-5 while /a/lr=1e-5 is indexed records `lr=1e-5-<digest>` in .job-id, which reading it
    # back refused as no job id (only letters, digits, '.', '_', '-', a letter or digit first): every command of the
    # job, and its agents (the controller reads its id), failed on it
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    job = load_job(DEMO)
    spec = resolve_job(job, iterations=None, mode=None)
    a = launch_dir(job, spec, tmp_path / "a" / name)
    b = launch_dir(job, spec, tmp_path / "b" / name)
    assert a.id == name and b.id.startswith(f"{name}-"), (a.id, b.id)
    assert JobDir(b.path).id == b.id


def test_a_resume_of_a_job_the_index_lacks_whose_id_a_live_job_has_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job dir copied here (or launched before ids were unique) resumed by its directory: its row was put under its
    id over the live job's, whose sites' job dirs it then staged into."""
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    live = JobDir.create("j", explicit=tmp_path / "a" / "run")
    with closing(JobDB()) as db:
        db.put("run", job_dir=str(live.path), spec={"name": "j"})
        db.update("run", state="running")
    copied = JobDir.create("j", explicit=tmp_path / "c" / "run")
    # (a job.json and a plan of the shapes a launch writes: a resume refuses either out of shape first, b44da7d)
    copied.write_job(load_job(DEMO).spec, source=str(DEMO))
    plan = {"controller_site": "local", "trainer": {"site": "local", "ranks": 1}, "rollout": []}
    (copied.path / "plan.json").write_text(json.dumps(plan))
    r = run_cli("launch", "--resume", str(copied.path))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(
        f"rlctl: error: job dir {copied.path}: its id run is the indexed job in {live.path}, which is running"
    ), r.stderr
    with closing(JobDB()) as db:
        assert db.get("run").job_dir == str(live.path)


def test_a_dry_run_shows_the_site_job_dirs_of_the_id_the_launch_would_take(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    import yaml

    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    inv = yaml.safe_load((DEMO.parent.parent / "clusters" / "local.yaml").read_text())
    inv["sites"]["local"]["scheduler"]["workdir"] = str(tmp_path / "w")
    (tmp_path / "local.yaml").write_text(yaml.safe_dump(inv))
    job = yaml.safe_load(DEMO.read_text())
    job["inventory"] = [str(tmp_path / "local.yaml")]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    other = JobDir.create("j", explicit=tmp_path / "a" / "run")
    with closing(JobDB()) as db:
        db.put("run", job_dir=str(other.path), spec={"name": "j"})
    b = str(tmp_path / "b" / "run")
    r = run_cli("launch", str(tmp_path / "job.yaml"), "--job-dir", b, "--dry-run", "-o", "json")
    assert r.exit_code == 0, r.stderr
    text = json.dumps(json.loads(r.stdout))
    assert f"{tmp_path / 'w'}/jobs/run-" in text and f"{tmp_path / 'w'}/jobs/run/" not in text, text[:2000]


@pytest.mark.parametrize("detach", [False, True])
def test_two_launches_at_once_of_one_job_file_get_a_directory_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, detach: bool
) -> None:
    """`rlctl launch demo.yaml` twice in the same second: each chose runs/demo-<time> before its preflight and made it
    after, so the second was refused, naming a --job-dir it was never given ('--job-dir: …/demo-… already holds a
    job'). Here the other launch makes that directory (and writes its job.json) while this one's preflight runs."""
    from rlctl.commands import launch as launch_cli
    from rlctl.launch import jobdir
    from rlctl.ops import preflight
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(jobdir.time, "strftime", lambda _: "20261205-072558")  # both in the same second
    chosen = tmp_path / "home" / "runs" / "demo-20261205-072558"

    def other_launch_meanwhile(*_: object, **__: object) -> None:
        JobDir.create("demo", explicit=chosen).job_json.write_text("{}")

    got: list[Path] = []
    monkeypatch.setattr(preflight, "preflight", other_launch_meanwhile)
    monkeypatch.setattr(launch_cli, "be_launcher", lambda jd, _spec, _plan, db, *_: (got.append(jd.path), db.close()))
    monkeypatch.setattr(launch_cli, "run_detached", lambda args, path, *_, **__: got.append(path))
    r = run_cli("launch", str(DEMO), *(["--detach"] if detach else []))
    assert r.exit_code == 0, r.stderr
    assert got == [chosen.with_name("demo-20261205-072558-1")] and (chosen / "job.json").read_text() == "{}"


def test_a_timestamped_directory_made_between_its_choice_and_its_mkdir_is_not_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken, free = tmp_path / "demo-1", tmp_path / "demo-2"
    taken.mkdir()  # another launch's, made after this one chose the name
    names = iter([taken, free])
    monkeypatch.setattr(JobDir, "choose_path", staticmethod(lambda name, explicit=None: next(names)))
    assert JobDir.create("demo").path == free
