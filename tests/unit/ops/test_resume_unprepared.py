"""`launch --resume` of a job without job.json (`prepare` writes it last): one whose launch ended before it was
prepared is said to have nothing to resume; one whose launcher still prepares it (its lock held) is said to be
prepared, versus told it was stopped or failed and to launch it anew (a second job). `attach` to one whose launcher
died preparing it: nothing to watch, said the same way."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rlctl.config import load_job
from rlctl.errors import UsageError
from rlctl.launch.jobdir import JobDir
from rlctl.ops.jobdb import JobDB
from rlctl.ops.refusals import refuse_if_unprepared
from tests.conftest import ROOT, run_cli
from tests.unit.job_rows import indexed_row

# the commands that read a prepared job's job.json and plan.json, with what each says it has nothing to do
EACH_READER = (
    (["attach", "demo-1"], "watch"),
    (["launch", "--resume", "demo-1"], "resume"),
    (["pull", "demo-1"], "pull"),
)


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


def test_attach_to_a_job_whose_launcher_died_preparing_it_has_nothing_to_watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # its machine rebooted in the SFT warm-up: the row says launching, `rlctl status --all` says the launcher is gone
    # and that `rlctl attach` watches the job again, and attach failed: "job.json: cannot read the resolved job:
    # [Errno 2] No such file or directory", exit 1
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("prep", explicit=tmp_path / "prep-1")
    indexed_row(
        "prep-1",
        jd.path,
        job="prep",
        info={"launcher": {"pid": 2**22 + 1, "host": socket.gethostname()}, "source": "p.yaml"},
    )
    for args in (["attach", "prep-1"], ["attach", "prep-1", "--detach"]):
        r = run_cli(*args)
        assert r.exit_code == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr == (
            "rlctl: error: job prep-1 was never prepared (no job.json: its launch was stopped or failed before any "
            "agent started); nothing to watch (hint: launch it anew: `rlctl launch p.yaml`)\n"
        )
    assert not (jd.path / "logs" / "launcher.log").exists()  # no launcher was started in the background


@pytest.mark.parametrize(("command", "nothing"), [("attach", "nothing to watch"), ("pull", "nothing to pull")])
def test_attach_or_pull_of_a_job_never_prepared_hints_a_new_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, nothing: str
) -> None:
    # Ctrl-C in its SFT warm-up (its row `stopped`): attach said `ended (stopped): nothing to watch (hint: …; continue
    # it with rlctl launch --resume prep-1)`, which refuses a job never prepared; pull said "job.json: cannot read the
    # resolved job: [Errno 2] No such file or directory", exit 1
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("prep", explicit=tmp_path / "prep-1")
    indexed_row("prep-1", jd.path, job="prep", state="stopped", info={"source": "p.yaml"})
    r = run_cli(command, "prep-1")
    assert r.exit_code == 2 and r.stderr == (
        "rlctl: error: job prep-1 was never prepared (no job.json: its launch was stopped or failed before any agent "
        f"started); {nothing} (hint: launch it anew: `rlctl launch p.yaml`)\n"
    ), r.stderr


def test_attach_resume_pull_of_a_job_without_its_plan_name_the_missing_plan_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # job.json there, plan.json deleted by hand: attach and launch --resume were a FileNotFoundError traceback, pull
    # said "the job was never launched (no plan.json)"
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    spec = load_job(ROOT / "jobs" / "demo.yaml").spec
    jd = JobDir.create(spec.name, explicit=tmp_path / "demo-1")
    jd.write_job(spec, source="demo.yaml")
    db = JobDB()
    try:
        db.put("demo-1", job_dir=str(jd.path), spec={"name": spec.name})
        db.update("demo-1", info={"launcher": {"pid": 2**22 + 1, "host": socket.gethostname()}, "source": "p.yaml"})
    finally:
        db.close()
    for args, nothing in EACH_READER:
        r = run_cli(*args)
        assert r.exit_code == 2 and r.stderr == (
            f"rlctl: error: {jd.plan_json}: missing (the job's plan, written with its job.json); nothing to {nothing} "
            "(hint: put the job dir's plan.json back from a copy, or launch the job anew: `rlctl launch p.yaml`)\n"
        ), r.stderr


def test_attach_resume_pull_of_a_job_without_its_job_json_name_the_missing_job_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # plan.json there (`prepare` writes it first), job.json deleted by hand: each said the job "was never prepared
    # (…: its launch was stopped or failed before any agent started)" and to launch it anew, of a job that had run
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("demo", explicit=tmp_path / "demo-1")
    jd.write_json(jd.plan_json, {"controller_site": "local"})
    launcher = {"pid": 2**22 + 1, "host": socket.gethostname()}  # gone
    indexed_row("demo-1", jd.path, job="demo", state="running", info={"launcher": launcher, "source": "p.yaml"})
    for args, nothing in EACH_READER:
        r = run_cli(*args)
        assert r.exit_code == 2 and r.stderr == (
            f"rlctl: error: {jd.job_json}: missing (the resolved job, written with its plan.json); nothing to "
            f"{nothing} (hint: put the job dir's job.json back from a copy)\n"
        ), r.stderr
