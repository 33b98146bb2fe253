"""Job directory layout and the launch-time job resolution (overrides, plan from explicit counts)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rlctl.config import load_job
from rlctl.config.task import DatasetTask
from rlctl.errors import ConfigError, LaunchError, UsageError
from rlctl.launch.jobdir import JobDir
from rlctl.ops.counts import resolve_job

REPO = Path(__file__).resolve().parents[3]


def test_default_dir_is_under_rlctl_home(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path))
    a = JobDir.create("demo")
    b = JobDir.create("demo")
    assert a.path.parent == b.path.parent == tmp_path / "runs"
    assert a.path != b.path and a.path.name.startswith("demo-")
    assert (a.path / "logs").is_dir() and (a.path / "checkpoints").is_dir()


def test_explicit_dir_wins_and_secret_is_private(tmp_path):
    jd = JobDir.create("demo", explicit=tmp_path / "here")
    assert jd.path == tmp_path / "here"
    s1, s2 = jd.secret(), jd.secret()
    assert s1 == s2 and len(s1) == 32
    assert stat.S_IMODE(os.stat(jd.path / "secret").st_mode) == 0o600
    assert jd.log("rollout", 1) == tmp_path / "here" / "logs" / "rollout-1.log"
    assert jd.checkpoint(20) == tmp_path / "here" / "checkpoints" / "iter-20"


def test_job_round_trips_through_job_json(tmp_path):
    job = load_job(REPO / "jobs" / "demo.yaml")
    jd = JobDir.create("demo", explicit=tmp_path / "j")
    jd.write_job(job.spec, source="jobs/demo.yaml")
    assert jd.read_job() == job.spec
    jd.event("x", a=1)
    jd.event("y")
    assert [e["event"] for e in jd.read_lines(jd.events)] == ["x", "y"]


def test_a_recorded_job_an_older_rlctl_launched_reads_back(tmp_path):
    """A dataset task with a built-in reward and answer_key: null, which b5eb6ff refuses in a new job, launched by an
    rlctl before it: status, pull and launch --resume read its job.json back, versus 'job.task: ... was it edited?'."""
    job = load_job(REPO / "jobs" / "demo.yaml")
    jd = JobDir.create("demo", explicit=tmp_path / "j")
    jd.write_job(job.spec, source="jobs/demo.yaml")
    record = json.loads(jd.job_json.read_text())
    record["job"]["task"] = task = {"kind": "dataset", "path": "train.jsonl", "answer_key": None}
    jd.job_json.write_text(json.dumps(record))
    with pytest.raises(ValidationError, match="reward 'exact_match' compares each output"):  # a new job: refused
        DatasetTask.model_validate(task)
    read = jd.read_job().task
    assert isinstance(read, DatasetTask) and read.answer_key is None and read.reward == "exact_match"


def test_an_edited_job_json_is_one_line_naming_the_field(tmp_path):
    # a pydantic ValidationError (or KeyError) traceback from `pull` / `report` before; a field edited into a value a
    # job file would refuse is a bad job file (exit 2, how to fix it), versus a runtime failure (exit 1, "was it
    # edited?"): job.json is where a resumed job's settings are edited
    jd = JobDir.create("demo", explicit=tmp_path / "j")
    jd.job_json.write_text('{"job": {"name": "x"}}')
    with pytest.raises(ConfigError, match=re.escape(f"{jd.job_json}: job.apiVersion: required field is missing")) as e:
        jd.read_job()
    assert e.value.exit_code == 2
    assert e.value.hint == "edit job.apiVersion in job.json to a valid value (the resume runs the job as edited there)"
    jd.job_json.write_text("[]")
    with pytest.raises(LaunchError, match=re.escape(f"{jd.job_json}: no 'job'")) as e:
        jd.read_job()
    assert e.value.hint == "was it edited?"


def test_mode_override_takes_that_modes_bound():
    job = load_job(REPO / "jobs" / "demo.yaml")
    assert job.spec.pipeline.mode == "async" and job.spec.pipeline.eta == 1
    sync = resolve_job(job, mode="sync", iterations=3)
    assert (sync.pipeline.mode, sync.pipeline.eta, sync.iterations) == ("sync", 0, 3)
    assert resolve_job(job) is job.spec


def test_one_launcher_per_job(tmp_path):
    # a manual `launch --resume` while the launcher was auto-resuming started a second controller over the same
    # checkpoints: both passed `refuse_if_running` (no controller answered yet)
    jd = JobDir.create("demo", explicit=tmp_path / "j")
    with jd.launcher_lock():
        with (
            pytest.raises(UsageError, match=rf"job j has a launcher already \(pid {os.getpid()} on ") as e,
            jd.launcher_lock(),
        ):
            pass
        assert e.value.hint is not None and "rlctl stop j" in e.value.hint
    with jd.launcher_lock():  # released with its holder
        pass


def test_a_launcher_lock_taken_as_status_probes_it_is_taken_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`status -w`, `logs -f` and `stop` probe the launcher lock (`launcher_holder`: a shared flock, let go at once);
    a resume taking it in that instant was refused, naming the job's gone launcher (its pid, in the file) as one
    that has the job. A live launcher here is refused at once, as before."""
    jd = JobDir.create("demo", explicit=tmp_path / "j")
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    lock = jd.path / ".launcher.lock"
    lock.write_text(f"pid {gone.stdout.strip()} on {socket.gethostname()}\n")  # the launcher before, ended
    probe = lock.open("r")
    fcntl.flock(probe.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)  # the probe's instant, as it is
    slept: list[float] = []

    def sleep(s: float) -> None:  # the probe lets go as the launcher waits to try again
        slept.append(s)
        probe.close()

    monkeypatch.setattr(time, "sleep", sleep)
    with jd.launcher_lock():  # was: job j has a launcher already (pid <the gone one> on ...)
        assert jd.launcher_holder() == f"pid {os.getpid()} on {socket.gethostname()}"
    assert len(slept) == 1 and probe.closed
    monkeypatch.setattr(time, "sleep", lambda s: pytest.fail("waited on a launcher that runs"))
    refused = rf"has a launcher already \(pid {os.getpid()} "
    with jd.launcher_lock(), pytest.raises(UsageError, match=refused), jd.launcher_lock():
        pass


@pytest.mark.parametrize(
    ("algorithm", "refused"),
    [
        ({"kind": "ppo", "clip_eps": 1.5}, "1.5: the ratio's lower clip 1 − clip_eps"),  # refused since 9feab5b
        ({"kind": "grpo", "off_policy": "decoupled", "is_cap": 1.0}, "is_cap 1: off_policy 'decoupled'"),  # 8d7ca57
    ],
    ids=["clip_eps", "decoupled_is_cap"],
)
def test_a_recorded_algorithm_an_older_rlctl_launched_reads_back(
    tmp_path: Path, algorithm: dict[str, Any], refused: str
) -> None:
    """A clip_eps ≥ 1, or a decoupled is_cap ≤ 1, which a new job is refused, launched by an rlctl before that:
    status, pull, attach and launch --resume read its job.json back (the record's rule, `RECORDED`), versus
    'job.algorithm: ... (hint: was it edited?)' of a file nobody edited. The decoupled cap reads as `tis` at that
    cap, the loss that rlctl computed (it truncated the weight), versus leaving out every token π_prox favours."""
    from rlctl.config.job import JobFile

    job = load_job(REPO / "jobs" / "demo.yaml")
    jd = JobDir.create("demo", explicit=tmp_path / "j")
    jd.write_job(job.spec, source="jobs/demo.yaml")
    record = json.loads(jd.job_json.read_text())
    record["job"]["algorithm"] = algorithm
    jd.job_json.write_text(json.dumps(record))
    with pytest.raises(ValidationError, match=re.escape(refused)):  # a new job: refused
        JobFile.model_validate(record["job"])
    read = jd.read_job().algorithm
    if algorithm.get("off_policy") == "decoupled":  # what that rlctl computed: the weight truncated at the cap
        algorithm = {**algorithm, "off_policy": "tis"}
    assert read.model_dump(include=set(algorithm)) == algorithm


def test_an_agents_job_dir_under_a_home_that_is_not_there_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`python -m rlctl.agents controller --job-dir '~nosuchuser/j'` ended in a RuntimeError traceback
    (Path.expanduser's 'Could not determine home directory'); the one rule of rlctl's paths now (`home_expanded`)."""
    from rlctl.agents.__main__ import main

    assert main(["controller", "--job-dir", "~rlctl-no-such-user/j"]) == 2
    assert capsys.readouterr().err == (
        "python -m rlctl.agents: error: --job-dir ~rlctl-no-such-user/j: ~rlctl-no-such-user is no home directory here "
        "(no such user)\n"
    )
