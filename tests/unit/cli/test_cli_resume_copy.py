"""A copy of a job dir (`cp -r`, rsync) made while its launcher runs the job: a `launch --resume` of the copy is
refused in one line naming the dir the job runs from and its launcher, versus passing the copy's own launcher lock
(another file, never held) and starting a second run of the job over the same sites' job dirs. A dir moved after its
job ended, or a copy of a job no launcher runs, resumes as before. (`attach` refuses a copy already: it is in no
job index.)"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.unit.cli.test_cli_bad_input import home, one_error, prepared

__all__ = ["home"]  # (the fixture: RLCTL_HOME under tmp_path)


@pytest.fixture
def began(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The job dirs a resume went on to run (`be_launcher`, past every refusal), recorded instead of run."""
    from rlctl.commands.launching import resume

    ran: list[Path] = []
    monkeypatch.setattr(resume, "be_launcher", lambda jd, _s, _p, db, *_a, **_k: (ran.append(jd.path), db.close()))
    return ran


@pytest.mark.parametrize("name", ["run", "run-backup"])  # the same id, or another one (the same job: its secret)
def test_a_resume_of_a_copy_of_a_job_dir_whose_launcher_runs_it_names_where_it_runs(
    tmp_path: Path, began: list[Path], name: str
) -> None:
    jd = prepared(tmp_path / "run")
    jd.secret()
    with jd.launcher_lock():  # (this process holds it, as the job's running launcher would)
        copy = tmp_path / "backup" / name
        shutil.copytree(jd.path, copy)
        line = one_error(run_cli("launch", "--resume", str(copy)))
        assert line.startswith(
            f"rlctl: error: job {copy.name} runs from {jd.path} (its launcher: pid {os.getpid()} on "
            f"{socket.gethostname()}), of which {copy} is a copy; a launcher here would run the job a second time"
        ), line
        assert f"(hint: watch it with `rlctl status {jd.path}`; `rlctl stop {jd.path}` ends it;" in line
    assert began == []
    assert run_cli("launch", "--resume", str(copy)).exit_code == 0  # once it ended: the copy is the job's to resume
    assert began == [copy]


def test_a_job_dir_moved_after_its_job_ended_and_a_copy_of_another_job_resume_as_before(
    tmp_path: Path, began: list[Path]
) -> None:
    jd = prepared(tmp_path / "run")
    jd.secret()
    with jd.launcher_lock():
        pass
    moved = tmp_path / "kept" / "run"
    moved.parent.mkdir()
    os.rename(jd.path, moved)  # its lock file names the dir it left
    lines = (moved / ".launcher.lock").read_text()
    assert f"dir {jd.path}" in lines
    assert run_cli("launch", "--resume", str(moved)).exit_code == 0
    (moved / ".launcher.lock").write_text(lines)  # (as the move left it: the resume wrote its own)
    other = prepared(tmp_path / "run")  # another job launched where it was, its launcher running
    other.secret()
    with other.launcher_lock():
        assert run_cli("launch", "--resume", str(moved)).exit_code == 0  # not this job: its secret is another
    assert began == [moved, moved]


def test_a_resume_of_a_copy_whose_controller_answers_names_its_address_not_attach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # rsync'd from another machine, whose launcher runs the job (no lock of this machine held): it said 'no launcher
    # watches it' and named `rlctl attach DIR`, which refuses a job this machine's index lacks
    from rlctl.ops import refusals

    copy = prepared(tmp_path / "copy")
    copy.write_json(copy.controller_json, {"address": "tcp://10.0.0.7:4242", "pid": 7})

    class Answers:
        def close(self) -> None:
            pass

    monkeypatch.setattr(refusals, "connect_client", lambda jobdir, *, timeout_s, name: Answers())
    line = one_error(run_cli("launch", "--resume", str(copy.path)))
    assert line == (
        "rlctl: error: job copy is running: its controller answers at tcp://10.0.0.7:4242, and this machine's job "
        "index does not hold it (a copy of its job dir? launched from another machine?) (hint: `rlctl status "
        f"{copy.path}` shows it; `rlctl stop {copy.path}` ends it; resume it once it ended)"
    )


def test_status_of_a_copy_of_a_job_dir_whose_launcher_runs_it_names_the_dir_it_copies(tmp_path: Path) -> None:
    # it showed the copy as the job's dir (its controller.json names the running job's controller: the live figures
    # were that run's), with no word of the dir the job runs from
    jd = prepared(tmp_path / "run")
    jd.secret()
    copy = tmp_path / "backup" / "run"
    with jd.launcher_lock():
        shutil.copytree(jd.path, copy)
        r = run_cli("status", str(copy))
        plain = run_cli("status", str(jd.path))
    assert r.exit_code == 0, r.stderr
    assert (
        f"copy of     {jd.path}, where the job runs (its launcher: pid {os.getpid()} on {socket.gethostname()}): "
        "shown here, and what stop or scale acts on"
    ) in r.stdout
    assert "copy of" not in plain.stdout  # (the dir itself, its launcher preparing the job: exit 3)
    assert "copy of" not in run_cli("status", str(copy)).stdout  # once it ended there


def test_stop_and_scale_named_by_a_copy_of_a_running_jobs_dir_act_on_the_dir_it_runs_from(
    tmp_path: Path, home: Path
) -> None:
    # they wrote their request into the copy (a stop's `stop_requested`, which the launcher reads in its own dir: the
    # job its stop killed without a summary resumed by `checkpoint.auto_resume`), never waited for that launcher nor
    # wrote the job's index row, and said the copy as the job
    from rlctl.commands import scale as scale_cli
    from rlctl.commands import stop as stop_cli
    from rlctl.ops.jobdb import JobDB
    from rlctl.ops.jobref import resolve

    jd = prepared(tmp_path / "run")
    jd.secret()
    db = JobDB()
    db.put("run", job_dir=str(jd.path), spec={"name": "demo"}, state="running")
    copy = tmp_path / "backup" / "run"
    with jd.launcher_lock():
        shutil.copytree(jd.path, copy)
        for command in ("stop", "scale"):
            ref = resolve(str(copy), db=db, changes=command)
            assert (ref.jobdir.path, ref.copy, ref.row is not None and ref.row.name) == (jd.path, copy, "run")
        assert resolve(str(copy), db=db).jobdir.path == copy  # status, logs: the dir named (status says whose copy)
    assert resolve(str(copy), db=db, changes="stop").jobdir.path == copy  # once it ended there: the copy is a job dir
    said = f"{jd.path}, where the job runs ({copy}, named, is a copy of it)"
    stopped = {"id": "run", "graceful": "requested", "agents": ["controller-0"], "problems": []}
    assert f"job dir         {said}\n" in stop_cli._table(stopped | {"job_dir": str(jd.path), "copy": str(copy)})
    scaled = {"id": "run", "job_dir": str(jd.path), "copy": str(copy), "adding": ["rollout-1"]}
    assert f"job dir  {said}\n" in scale_cli._table(scaled)
    db.close()
