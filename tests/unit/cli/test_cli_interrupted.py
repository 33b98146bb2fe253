"""A Ctrl-C in `status -w`, `logs -f`, `check`, `plan` or `pull` says in one line what it interrupted (and what that
left), exit 130, versus exit 130 with nothing said: typer ends a command's KeyboardInterrupt so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import rlctl.config
from rlctl.launch.jobdir import JobDir
from rlctl.ops import agentlogs, operate
from rlctl.ops import pull as pull_mod
from tests.conftest import run_cli
from tests.unit.job_rows import indexed_row


def ctrl_c(*args: object, **kwargs: object) -> None:
    raise KeyboardInterrupt


def _running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JobDir:
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("demo", explicit=tmp_path / "demo-1")
    jd.job_json.write_text(json.dumps({"source": "demo.yaml", "job": {"name": "demo"}}))
    jd.log("trainer", 0).write_text("t1\n")
    indexed_row("demo-1", jd.path, job="demo", state="running")
    return jd


def test_ctrl_c_in_status_watch_says_the_job_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _running(tmp_path, monkeypatch)
    monkeypatch.setattr(operate, "job_status", ctrl_c)
    r = run_cli("status", "-w", "demo-1")
    assert (r.exit_code, r.stdout) == (130, "")
    assert r.stderr == (
        "rlctl: interrupted: stopped watching job demo-1; the job goes on (`rlctl status -w demo-1` watches it again)\n"
    )


def test_ctrl_c_in_logs_follow_says_the_job_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _running(tmp_path, monkeypatch)
    monkeypatch.setattr(agentlogs, "follow", ctrl_c)
    r = run_cli("logs", "-f", "demo-1", "trainer/0")
    assert r.exit_code == 130
    assert r.stderr == (
        "rlctl: interrupted: stopped following trainer-0's log of job demo-1; the job goes on "
        "(`rlctl logs demo-1 trainer-0 -f` follows it again)\n"
    )


@pytest.mark.parametrize("command", ["check", "plan"])
def test_ctrl_c_in_check_or_plan_says_what_did_not_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    job = tmp_path / "my job.yaml"
    job.write_text("apiVersion: rlctl/v1\nkind: Job\nname: demo\n")
    monkeypatch.setattr(rlctl.config, "load_job", ctrl_c)  # while it reads (or plans) the job
    r = run_cli(command, str(job))
    assert r.exit_code == 130
    said = {"check": "the check of {} did not finish (a check changes nothing); run it again",
            "plan": "the plan of {} was not made (planning changes nothing); run it again"}  # fmt: skip
    assert r.stderr == f"rlctl: interrupted: {said[command].format(repr(str(job)))}\n"


def test_ctrl_c_in_pull_says_how_to_pull_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _running(tmp_path, monkeypatch)
    (tmp_path / "demo-1" / "plan.json").write_text("{}")
    monkeypatch.setattr(pull_mod, "pull", ctrl_c)
    r = run_cli("pull", "demo-1", "-c", "3")
    assert r.exit_code == 130
    assert r.stderr == (
        "rlctl: interrupted: the pull of job demo-1 did not finish (the job is unchanged); `rlctl pull demo-1 "
        "--checkpoint 3` pulls the checkpoint whole\n"
    )


def test_ctrl_c_in_scale_of_a_job_named_by_its_directory_names_it_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job the index lacks (a moved job dir, another $RLCTL_HOME's), scaled by its directory: the line said
    `rlctl status demo-1`, its id, which names no job in the index."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("demo", explicit=tmp_path / "my jobs" / "demo-1")
    jd.job_json.write_text(json.dumps({"source": "demo.yaml", "job": {"name": "demo"}}))
    monkeypatch.setattr(operate, "scale", ctrl_c)
    r = run_cli("scale", str(jd.path), "--rollout", "+2")
    assert r.exit_code == 130
    assert r.stderr == (
        "rlctl: interrupted: the controller may have the request and be adding 2 unit(s); "
        f"`rlctl status '{jd.path}'` shows the job's units before you scale again\n"
    )


def test_ctrl_c_in_report_says_how_to_write_it_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # exit 130 with nothing said, as typer ends a KeyboardInterrupt, while a report file may be cut short
    import rlctl.report

    _running(tmp_path, monkeypatch)
    monkeypatch.setattr(rlctl.report, "build_report", ctrl_c)
    r = run_cli("report", "demo-1", "--out", str(tmp_path / "my r.png"))
    assert r.exit_code == 130
    assert r.stderr == (
        "rlctl: interrupted: the report of job demo-1 did not finish (the job is unchanged; a report file may be cut "
        f"short); `rlctl report demo-1 --out '{tmp_path / 'my r.png'}'` writes it again\n"
    )
