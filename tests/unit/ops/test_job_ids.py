"""A job's id (`JobDir.id`): its directory's name, unless a fresh launch finds another job of that name in the index
(`JobDB.id_for`); every command names the job by it, and the sites' job dirs are `W/jobs/<id>`."""

from __future__ import annotations

import shutil
from contextlib import closing
from pathlib import Path

import pytest

from rlctl.config import load_job
from rlctl.launch.jobdir import JobDir
from rlctl.launch.sitefs import site_root
from rlctl.ops.counts import resolve_job
from rlctl.ops.jobdb import JobDB
from rlctl.ops.jobref import resolve
from rlctl.ops.run import launch_dir

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


def test_the_directory_name_needs_no_record(tmp_path: Path) -> None:
    jd = JobDir.create("j", explicit=tmp_path / "run")
    assert jd.id == "run"
    jd.name_as("run-0123abcd")
    assert JobDir(jd.path).id == "run-0123abcd"
    jd.name_as("run")
    assert not (jd.path / "id").exists() and jd.id == "run"
    assert JobDir(tmp_path / "gone").id == "gone"
