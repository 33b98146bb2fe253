"""`rlctl status` when the controller does not answer (rlctl.ops.operate.job_status → site_view): each recorded
agent's state as its backend sees it from this terminal, which did not start it, and the job index's state."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlctl.commands.status import _fallback_table
from rlctl.config import load_job
from rlctl.config.inventory import Site
from rlctl.errors import LaunchError, RlctlError
from rlctl.launch import local
from rlctl.launch.backends import write_sites
from rlctl.launch.base import LOST, AgentHandle, AgentSpec, exit_text
from rlctl.launch.jobdir import JobDir
from rlctl.launch.ssh import SshBackend
from rlctl.ops import operate
from rlctl.ops.jobdb import JobRow
from rlctl.ops.jobref import JobRef
from tests.conftest import ROOT
from tests.unit.job_rows import indexed_row

# job_status's bound on its answers (each site's poll and the controller's in a thread of their own): no test here
# waits it out (every answer is there at once), so it is a bound, not a timing assertion; 2 s was one for a loaded
# 2-core CI machine, where a thread can wait that long to run and an answer late by then reads as `unknown`
BOUND_S = 30.0


def _killed_agent() -> dict[str, int]:
    """A local agent's record (pid, pgid, start time) whose process was SIGKILLed (an OOM kill) and reaped by its own
    parent: no exit status is left for anyone else to read."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    ticks = local.start_ticks(proc.pid)
    assert ticks is not None
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    return {"pid": proc.pid, "pgid": proc.pid, "start_ticks": ticks}


def _job_with_controller(
    tmp_path: Path,
    name: str,
    site: dict[str, Any],
    ident: dict[str, Any],
    *,
    host: str | None = None,
    cut: bool = False,
) -> JobDir:
    """A job dir whose sites.json holds `site` (as "s") and whose agents.jsonl records its controller there with
    `ident` (`cut`: after a record cut short by a full disk)."""
    jd = JobDir.create(name, explicit=tmp_path / name)
    write_sites(jd.path, {"s": Site.model_validate(site)})
    backend = site["scheduler"]["kind"]
    row = {"name": "controller-0", "role": "controller", "replica": 0, "site": "s", "backend": backend}
    rec = json.dumps(row | {"ident": ident, "host": host, "gpus": None, "log": None})
    (jd.path / "agents.jsonl").write_text(('{"name": "rollout-0", "role": "roll\n' if cut else "") + rec + "\n")
    return jd


def _running_row(name: str, jd: JobDir) -> Any:
    """The job's index row, put as running (its launcher gone with nothing written of how it ended)."""
    return indexed_row(name, jd.path, job=jd.path.name, state="running")


LOCAL = {"datacenter": "d", "scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": [{"host": "h", "gpus": 1}]}


def test_a_sigkilled_local_agent_seen_from_another_terminal_has_no_exit_status() -> None:
    # `rlctl status` read `exited 0` for it: the backend that did not start it answered 0 for any gone group
    handle = AgentHandle(AgentSpec("controller", 0, "local", []), _killed_agent(), "local")
    code = local.LocalBackend().poll(handle)
    assert code == LOST and exit_text(code) == "an unknown status"
    assert exit_text(-9) == "-9 (SIGKILL)" and exit_text(0) == "0"


def test_status_of_a_job_whose_controller_was_killed_says_so_and_shows_the_index_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_with_controller(tmp_path, "killed", LOCAL, _killed_agent())
    index_row = _running_row("killed1", jd)  # its launcher died with it: nothing wrote how it ended
    s, complete = operate.job_status(JobRef("killed1", jd, index_row), timeout_s=BOUND_S)
    assert [(a["name"], a["state"]) for a in s["agents"]] == [("controller-0", "exited (status unknown)")]
    assert s["index_state"] == "running" and "summary" not in s and not complete
    table = _fallback_table(s)
    assert "exited (status unknown)" in table and "exited 0" not in table
    index = next(line for line in table.splitlines() if line.startswith("job index"))
    assert index.split(None, 2)[2] == (
        "running, but no agent runs and no summary was written: it ended without one (`rlctl logs` says how)"
    )


def test_status_of_a_job_whose_site_does_not_answer_does_not_say_it_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the controller's site did not answer (its agents' state: unknown): the index row said "running, but no agent
    # runs … it ended without one", of a job that runs on there
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    site = {"datacenter": "d", "scheduler": {"kind": "ssh"}, "gpu": "H20", "nodes": [{"host": "h1", "gpus": 8}]}
    jd = _job_with_controller(
        tmp_path, "far", site, {"host": "h1", "pid": 1, "pgid": 1, "start_ticks": 1, "exitfile": "x"}, host="h1"
    )

    def poll(self: SshBackend, handle: object) -> None:
        raise LaunchError("ssh h1: cannot connect: timed out")

    monkeypatch.setattr(SshBackend, "poll", poll)
    s, complete = operate.job_status(JobRef("far1", jd, _running_row("far1", jd)), timeout_s=BOUND_S)
    assert s["sites_down"] == ["s"] and [a["state"] for a in s["agents"]] == ["unknown"] and not complete
    index = next(line for line in _fallback_table(s).splitlines() if line.startswith("job index"))
    assert index.split(None, 2)[2] == "running"


def test_status_of_a_job_shows_the_agents_it_can_read_past_a_damaged_line_of_agents_jsonl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # a record cut short by a full disk stays in agents.jsonl once the next is appended: `rlctl status` of the job
    # (its controller gone) failed on it in one line for as long as the job dir lived
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_with_controller(tmp_path, "cut", LOCAL, _killed_agent(), cut=True)
    for _ in range(2):  # `rlctl status -w`: said once
        s, _complete = operate.job_status(JobRef("cut1", jd, None), timeout_s=BOUND_S)
        assert [(a["name"], a["state"]) for a in s["agents"]] == [("controller-0", "exited (status unknown)")]
    said = [r.getMessage() for r in caplog.records if "agents.jsonl: line 1 is not valid JSON" in r.getMessage()]
    assert len(said) == 1 and said[0].endswith("left out")


def test_status_of_an_ended_job_counts_its_iterations_as_its_summary_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # after a stop it said `last iteration 69` (the metrics row's index, from 0) beside `stopped after 70 iterations`
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_with_controller(tmp_path, "stopped", LOCAL, _killed_agent())
    rows = [{"iteration": i, "reward_mean": 0.5, "t_gen_s": 1.0, "t_train_s": 0.5, "t": 1.0} for i in range(70)]
    jd.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    jd.summary_json.write_text(json.dumps({"state": "stopped", "iterations": 70, "iterations_planned": 300}))
    s, _ = operate.job_status(JobRef("stopped", jd, None), timeout_s=BOUND_S)
    table = _fallback_table(s).splitlines()
    ended = [line.split(None, 1)[1] for line in table if line.startswith("ended ")]
    done = [line.split(None, 2)[2] for line in table if line.startswith("iterations done ")]
    assert ended == ["after 70 iterations: stopped"] and len(done) == 1, table
    assert done[0].startswith("70; the last: reward 0.500, T_gen 1.00 s, T_train 0.50 s"), done
    assert s["iterations_done"] == 70 and s["last_iteration"]["iteration"] == 69  # -o json keeps the row's index
    # the live view's count, by the same name: -o json had `iterations_done` for an ended job alone, and a running
    # one's count only as `live.iteration` (a count too, where `last_iteration.iteration` is the row's index)
    live = {"iteration": 70, "iterations": 300, "figures_age_s": 0.5}
    monkeypatch.setattr(operate, "ask_controller", lambda *a, **k: live)
    s, _ = operate.job_status(JobRef("stopped", jd, None), timeout_s=BOUND_S)
    assert s["source"] == "controller" and s["iterations_done"] == 70 and "last_iteration" not in s


def test_status_of_an_ended_job_names_its_checkpoints_and_how_to_go_on_from_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `launch --resume --checkpoint V` and `--iterations N` were nowhere to be seen where an ended job is looked at,
    # nor its reward and held-out outcome
    from rlctl.config import load_job
    from tests.conftest import ROOT

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_with_controller(tmp_path, "ended", LOCAL, _killed_agent())
    jd.write_job(load_job(ROOT / "jobs" / "demo.yaml").spec, source="x")
    heldout = {"prompts": 512, "greedy_reward_first": 0.25, "greedy_reward_last": 0.5}
    summary = {"state": "done", "iterations": 30, "iterations_planned": 30, "heldout": heldout}
    rewards = {"calls": 8, "errors": 8, "first_failure": "error: sample p0/0 (data.jsonl line 1): KeyError: 'x'"}
    summary |= {"reward_first": 0.1, "reward_last": 0.4, "reward_window": 5, "rewards": rewards}
    jd.summary_json.write_text(json.dumps(summary))
    for v in (10, 20, 30):
        jd.event("checkpoint", version=v)
    s, _ = operate.job_status(JobRef("ended", jd, None), timeout_s=BOUND_S)
    assert s["checkpoints"] == {
        "versions": [10, 20, 30],
        "resume": f"rlctl launch --resume {jd.path}",
        "list": f"rlctl status {jd.path} --checkpoints",
    }
    table = _fallback_table(s).splitlines()
    # the outcome `launch` printed, which status of the ended job left out
    assert [line.split(None, 1) for line in table if line.startswith("reward ") and "failures" not in line] == [
        ["reward", "0.100 → 0.400 (mean of first/last 5)"]
    ]
    # before: the launch's `reward failures` row was left out, so a job whose every reward call raised read as trained
    assert [line.split("  ", 1)[1].strip() for line in table if line.startswith("reward failures ")] == [
        "8 of 8 calls scored task.reward_on_error (8 raised); the first: error: sample p0/0 (data.jsonl line 1): "
        "KeyError: 'x'; each in the controller's log"
    ]
    assert [line.split("  ", 1)[1].strip() for line in table if line.startswith("held-out (end) ")] == [
        "reward 0.250 → 0.500 (greedy, 512 prompts)"
    ]
    [line] = [line.split(None, 1)[1] for line in table if line.startswith("checkpoints ")]
    assert line == (
        f"v10, v20, v30 (`rlctl launch --resume {jd.path} --checkpoint V` continues from V; `--iterations N` trains "
        f"on to N; `rlctl status {jd.path} --checkpoints` shows each one's reward and held-out figures)"
    )


def _failed_row(name: str, jd: JobDir, **update: Any) -> JobRow:
    """The job's index row, which its launcher set failed (`update`: more of the row)."""
    return indexed_row(name, jd.path, job=jd.path.name, state="failed", **update)


def test_status_of_a_job_whose_controller_exited_without_a_summary_is_complete_and_names_the_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the controller SIGKILLed, its launcher wrote `failed` and ended: `rlctl status` said `partial status` (exit 3)
    # for good, with no ended row and no resume hint
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_with_controller(tmp_path, "killed", LOCAL, _killed_agent())
    row = _failed_row("killed1", jd, info={"controller_exit": -9})
    s, complete = operate.job_status(JobRef("killed1", jd, row), timeout_s=BOUND_S)
    assert complete and s["ended_without_summary"] == {
        "controller_exit": -9,
        "resume": "rlctl launch --resume killed1",
    }
    assert s["controller"] == "exited: the job ended (without a summary)"
    ended = [line.split(None, 1)[1] for line in _fallback_table(s).splitlines() if line.startswith("ended ")]
    assert ended == [
        "the controller exited without a summary (exit -9 (SIGKILL)); continue the job from its latest complete "
        "checkpoint: `rlctl launch --resume killed1`"
    ]


@pytest.mark.parametrize("completed", [[], [10]])
def test_status_of_a_job_whose_controller_exited_without_a_summary_names_where_a_resume_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, completed: list[int]
) -> None:
    # killed before its first checkpoint: it said "continue the job from its latest complete checkpoint", of a job
    # that had none (the resume says "resumed from the start (no checkpoint was completed)")
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_with_controller(tmp_path, "early", LOCAL, _killed_agent())
    jd.write_job(load_job(ROOT / "jobs" / "demo.yaml").spec, source="jobs/demo.yaml")
    for version in completed:
        jd.event("checkpoint", version=version)
    row = _failed_row("early1", jd, info={"controller_exit": -9})
    s, complete = operate.job_status(JobRef("early1", jd, row), timeout_s=BOUND_S)
    ended = [line.split(None, 1)[1] for line in _fallback_table(s).splitlines() if line.startswith("ended ")]
    start = "its latest complete checkpoint" if completed else "its start (it completed no checkpoint)"
    assert complete and ended == [
        f"the controller exited without a summary (exit -9 (SIGKILL)); continue the job from {start}: "
        "`rlctl launch --resume early1`"
    ]


def test_status_of_a_job_whose_launcher_holds_it_is_not_said_to_have_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # its launcher is between two runs (an automatic resume): nothing runs for a moment, and it has not ended
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_with_controller(tmp_path, "between", LOCAL, _killed_agent())
    row = _failed_row("between1", jd)
    with jd.launcher_lock():
        s, complete = operate.job_status(JobRef("between1", jd, row), timeout_s=BOUND_S)
    assert not complete and "ended_without_summary" not in s


def test_an_exit_of_128_plus_a_signal_is_named_as_a_signal_is() -> None:
    # a trainer's exit 143 was shown bare, beside `-9 (SIGKILL)`
    assert exit_text(143) == "143 (SIGTERM)" and exit_text(137) == "137 (SIGKILL)"
    assert exit_text(1) == "1" and exit_text(128) == "128" and exit_text(250) == "250"


def test_status_of_a_job_whose_directory_is_gone_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # it said `the controller has not written controller.json (not started?)`, and `partial status` (exit 3)
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir(tmp_path / "removed" / "kt-1")
    row = indexed_row("kt-1", jd.path, job="kt", state="failed")
    with pytest.raises(RlctlError) as e:
        operate.job_status(JobRef("kt-1", jd, row), timeout_s=1.0)
    assert str(e.value) == (
        f"job kt-1: its job directory {jd.path} is gone (removed, or not mounted on this machine); the job index "
        "says failed"
    )


def test_status_names_the_exit_the_launcher_saw_of_an_agent_its_site_cannot_tell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a local agent SIGKILLed showed `exited (status unknown)` though the summary / index named -9 (SIGKILL)
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_with_controller(tmp_path, "seen", LOCAL, _killed_agent())
    jd.summary_json.write_text(json.dumps({"state": "failed: x", "iterations": 3, "controller_exit": -9}))
    s, _ = operate.job_status(JobRef("seen", jd, None), timeout_s=BOUND_S)
    assert [(a["name"], a["state"], a["source"]) for a in s["agents"]] == [
        ("controller-0", "exited -9 (SIGKILL)", "local (the launcher saw the exit)")
    ]


def test_status_names_the_controller_exit_the_launcher_recorded_in_its_agent_exits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a finished demo's job dir read where the index has no row for it (another RLCTL_HOME): summary.json holds the
    # launcher's `agent_exits` but not `controller_exit`, and the controller read `exited (status unknown)` while
    # its trainer and rollout units read `exited 0`
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_with_controller(tmp_path, "ended", LOCAL, _killed_agent())
    jd.summary_json.write_text(json.dumps({"state": "done", "iterations": 3, "agent_exits": {"controller-0": 0}}))
    s, _ = operate.job_status(JobRef("ended", jd, None), timeout_s=BOUND_S)
    assert [(a["name"], a["state"]) for a in s["agents"]] == [("controller-0", "exited 0")]


def test_status_of_a_job_its_launcher_prepares_is_complete_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a launch in its prepare (SFT warm-up, tokenizing): its row says launching, no controller, no agent yet;
    # `rlctl status` said `partial status: controller error: … controller.json (not started?)` (exit 3)
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("prep", explicit=tmp_path / "prep")
    row = indexed_row("prep1", jd.path, job="prep")
    assert row.state == "launching"
    with jd.launcher_lock():
        s, complete = operate.job_status(JobRef("prep1", jd, row), timeout_s=BOUND_S)
        assert complete and s["agents"] == [] and s["controller"] == operate.PREPARING
        assert f"controller  {operate.PREPARING}" in _fallback_table(s)
    s, complete = operate.job_status(JobRef("prep1", jd, row), timeout_s=BOUND_S)  # no launcher holds it: not so
    assert not complete and s["controller"] != operate.PREPARING


def test_status_of_a_job_its_launcher_resumes_is_complete_and_says_it_is_not_started_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a resume staging (minutes, for a large model): the run before's agents all exited, its summary set aside, the
    # row launching; it said `launching, but no agent runs and no summary was written: it ended without one`, a
    # controller error (controller.json: not started?) and `partial status`, exit 3
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_with_controller(tmp_path, "res", LOCAL, _killed_agent())
    jd.metrics.write_text(json.dumps({"iteration": 3, "reward_mean": 0.5, "t": 1.0}) + "\n")
    (jd.path / "summary.1.json").write_text(json.dumps({"state": "failed: trainer trainer-0 was lost"}))
    row = indexed_row("res", jd.path, job="res", state="launching")
    with jd.launcher_lock():
        s, complete = operate.job_status(JobRef("res", jd, row), timeout_s=BOUND_S)
        assert complete and s["agents"] == [] and s["controller"] == operate.PREPARING
        r = run_cli("status", "res")
        assert r.exit_code == 0 and "ended without" not in r.stdout, (r.stdout, r.stderr)
        assert f"controller       {operate.PREPARING}" in r.stdout, r.stdout
    s, complete = operate.job_status(JobRef("res", jd, row), timeout_s=BOUND_S)  # no launcher holds it: not so
    assert not complete and s["controller"] != operate.PREPARING


@pytest.mark.parametrize("aside_run", ["r1", "r0"])
def test_status_of_a_job_whose_resume_died_staging_says_how_its_run_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, aside_run: str
) -> None:
    # the resume's launcher gone (a reboot) while it staged, no agent of its run started: the latest run's summary is
    # where the resume set it aside (summary.1.json), and status said `the controller exited without a summary`
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_with_controller(tmp_path, "res", LOCAL, _killed_agent())
    jd.event("agent_started", agent="controller-0", run="r1")  # the latest run's controller
    jd.metrics.write_text(json.dumps({"iteration": 3, "reward_mean": 0.5, "t": 1.0}) + "\n")
    ended = "failed: trainer trainer-0 was lost"
    (jd.path / "summary.1.json").write_text(json.dumps({"state": ended, "iterations": 4, "run": aside_run}))
    gone = {"launcher": {"pid": 2**22 + 1, "host": socket.gethostname()}}
    row = indexed_row("res", jd.path, job="res", state="launching", info=gone)
    s, complete = operate.job_status(JobRef("res", jd, row), timeout_s=BOUND_S)
    assert complete
    if aside_run == "r1":  # the latest run's: how it ended
        assert s["summary"]["state"] == ended and "ended_without_summary" not in s
        assert s["controller"] == f"exited: the job ended ({ended})"
        assert operate.job_end(JobRef("res", jd, row)) == ended
    else:  # an earlier run's (this run's controller ended without one): not taken for this run's
        assert "summary" not in s and s["ended_without_summary"]["resume"] == "rlctl launch --resume res"


def test_status_of_a_launch_stopped_before_it_wrote_job_json_is_complete_and_says_how_to_launch_it_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C on `rlctl launch job.yaml --job-dir D` while it prepared the job: D holds only secret, logs/ and
    # checkpoints/, its row says stopped; `rlctl status` said `partial status: controller error: … has not written
    # controller.json (not started?); sites not answering: none`, exit 3, and `status -w` never ended
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("cut", explicit=tmp_path / "cut")
    row = indexed_row("cut", jd.path, job="cut", state="stopped", info={"source": "jobs/cut.yaml"})
    s, complete = operate.job_status(JobRef("cut", jd, row), timeout_s=BOUND_S)
    again = "rlctl launch jobs/cut.yaml"
    assert complete and s["agents"] == [] and s["never_started"] == {"start": again}
    assert s["controller"] == f"{operate.NEVER_PREPARED}; launch it anew with `{again}`"
    r = run_cli("status", "cut", "--watch", "--interval", "0.2")
    assert r.exit_code == 0 and r.stderr == "", r.stderr
    assert "controller  never prepared: its launch was stopped or failed before it wrote" in r.stdout
    jd.write_json(jd.plan_json, {"trainer": {"site": "s", "ranks": 1}, "controller_site": "s", "rollout": []})
    assert not operate.job_status(JobRef("cut", jd, row), timeout_s=BOUND_S)[1]  # prepared, its job.json lost: not so


def test_status_of_a_launch_whose_launcher_died_before_it_wrote_job_json_is_complete_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # its machine rebooted in the SFT warm-up (its row left launching, its launcher gone): `partial status`, exit 3,
    # for as long as the job dir lives; one whose launcher this machine cannot check stays partial
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("cut", explicit=tmp_path / "cut")
    gone = {"launcher": {"pid": 2**22 + 1, "host": socket.gethostname()}, "source": "jobs/cut.yaml"}
    row = indexed_row("cut", jd.path, job="cut", info=gone)
    assert row.state == "launching"
    s, complete = operate.job_status(JobRef("cut", jd, row), timeout_s=BOUND_S)
    assert complete and s["controller"] == f"{operate.NEVER_PREPARED}; launch it anew with `rlctl launch jobs/cut.yaml`"
    far = indexed_row("cut", jd.path, job="cut", info={"launcher": {"pid": 1, "host": "elsewhere"}})
    assert not operate.job_status(JobRef("cut", jd, far), timeout_s=BOUND_S)[1]


def test_status_of_a_prepared_job_dir_that_never_started_is_complete_and_says_how_to_start_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # job.json and plan.json, no agent, no launcher, not in the index (a copied job dir, a launcher killed as it
    # staged): `partial status: controller error: … has not written controller.json (not started?)`, exit 3
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("prepared", explicit=tmp_path / "prepared")
    jd.job_json.write_text(json.dumps({"source": "job.yaml", "job": {"name": "prepared"}}))
    jd.write_json(jd.plan_json, {"trainer": {"site": "s", "ranks": 1}, "controller_site": "s", "rollout": []})
    write_sites(jd.path, {"s": Site.model_validate(LOCAL)})
    s, complete = operate.job_status(JobRef("prepared", jd, None), timeout_s=BOUND_S)
    start = f"rlctl launch --resume {jd.path}"
    assert complete and s["agents"] == [] and s["never_started"] == {"start": start}
    assert s["controller"] == f"{operate.NEVER_STARTED}; start it with `{start}`"
    r = run_cli("status", str(jd.path))
    assert r.exit_code == 0 and r.stderr == "", r.stderr
    assert (
        "controller  never started: the job is prepared (its job.json and plan.json) but no agent of it ever "
        in r.stdout
    )
    (jd.path / "agents.jsonl").write_text("")  # an empty record: the same
    assert operate.job_status(JobRef("prepared", jd, None), timeout_s=BOUND_S)[1]
    jd.metrics.write_text('{"iteration": 0, "reward_mean": 0.5, "t": 1}\n')  # it trained: its agents.jsonl is lost
    assert not operate.job_status(JobRef("prepared", jd, None), timeout_s=BOUND_S)[1]


def test_status_of_an_ended_job_lists_its_last_runs_agents_and_an_earlier_runs_that_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a unit a scale-in removed (or one a resume started under a new name) was listed `exited (status unknown)` in
    # the status of every run after, for the life of the job; `stop` lists this run's agents and an orphan alone
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_with_controller(tmp_path, "resumed", LOCAL, _killed_agent())
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        live = {"pid": orphan.pid, "pgid": orphan.pid, "start_ticks": local.start_ticks(orphan.pid)}
        first_run = (jd.path / "agents.jsonl").read_text()
        unit = json.loads(first_run) | {"role": "rollout"}
        records = [unit | {"name": f"rollout-{n}", "replica": n} for n in (2, 3)]
        records[1]["ident"] = live  # rollout-3 of the first run still runs
        with (jd.path / "agents.jsonl").open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
            f.write(first_run)  # the resumed run: its controller and rollout-0
            f.write(json.dumps(unit | {"name": "rollout-0"}) + "\n")
        jd.summary_json.write_text(json.dumps({"state": "stopped", "iterations": 3}))
        s, _ = operate.job_status(JobRef("resumed", jd, None), timeout_s=BOUND_S)
    finally:
        orphan.kill()
        orphan.wait()
    assert sorted((a["name"], a["state"]) for a in s["agents"]) == [
        ("controller-0", "exited (status unknown)"),
        ("rollout-0", "exited (status unknown)"),
        ("rollout-3", "running"),
    ]


def test_status_watch_follows_a_done_job_until_its_launcher_lets_go_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `status -w` stopped at the controller's `done`, while its launcher still evaluated the final checkpoint: its
    # last frame had no held-out figures of the end (and `launcher … watching`)
    from rlctl.commands import status as status_cmd
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_with_controller(tmp_path, "evaluating", LOCAL, _killed_agent())
    jd.summary_json.write_text(json.dumps({"state": "done", "iterations": 4, "iterations_planned": 4}))
    indexed_row("evaluating", jd.path, job="evaluating", state="running")
    lock = jd.launcher_lock()
    lock.__enter__()
    slept: list[float] = []

    def evaluated(seconds: float) -> None:  # the launcher's held-out evaluation ends, and it lets go of the job
        slept.append(seconds)
        held = {"prompts": 8, "greedy_reward_first": 0.25, "greedy_reward_last": 0.75, "seconds": 1.0}
        jd.summary_json.write_text(json.dumps({"state": "done", "iterations": 4, "heldout": held}))
        indexed_row("evaluating", jd.path, job="evaluating", state="finished")
        lock.__exit__(None, None, None)

    monkeypatch.setattr(status_cmd.time, "sleep", evaluated)
    r = run_cli("status", "evaluating", "--watch", "--interval", "0.2")
    assert r.exit_code == 0, r.stderr
    assert slept == [0.2] and r.stdout.count("held-out (end)") == 1, r.stdout
    last = r.stdout.rpartition("held-out (end)")[2]  # the last frame: the index's end, read after the launcher's
    assert [line.split(None, 2)[2] for line in last.splitlines() if line.startswith("job index ")] == ["finished"]


def test_status_all_of_an_empty_index_says_no_jobs_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # it printed a table's header and rule with no row under them
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    r = run_cli("status", "--all")
    assert (r.exit_code, r.stdout) == (0, f"no jobs (the job index in {tmp_path / 'home'} lists none)\n"), r.stderr
    r = run_cli("status", "--all", "-o", "json")
    assert (r.exit_code, r.stdout.strip()) == (0, "[]")


def test_the_live_status_of_a_run_shows_the_warning_its_launcher_recorded_for_it_and_not_a_run_befores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running job's live view (the controller answers) shows, one row each, the warnings its launcher recorded
    for the latest run (`runstate.WARNING` events naming its id: a trainer rank this rlctl prices past its GPU, as
    the resume said it); a warning of the run before is not this run's. Before, the live view showed none."""
    from rlctl.commands.status import _live_table
    from rlctl.ops.runstate import WARNING
    from tests.unit.agents.test_agents_views import _one_iteration, _snapshot
    from tests.unit.agents.test_agents_views import status as live_status

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("warned", explicit=tmp_path / "warned")
    core, _, _ = _one_iteration()
    live = live_status(_snapshot(core, []), now=110.0)
    monkeypatch.setattr(operate, "ask_controller", lambda *a, **k: live)
    jd.event("agent_started", agent="controller-0", run="before")
    jd.event(WARNING, run="before", line="warning: the run before's")
    jd.event("agent_started", agent="controller-0", run="now")
    s, complete = operate.job_status(JobRef("warned", jd, None), timeout_s=BOUND_S)
    assert s["source"] == "controller" and complete and "warnings" not in s
    jd.event(WARNING, run="now", line="warning: on site 't' a rank needs 188.3 GB, and a H100 holds 80 GB")
    s, _ = operate.job_status(JobRef("warned", jd, None), timeout_s=BOUND_S)
    assert s["warnings"] == ["warning: on site 't' a rank needs 188.3 GB, and a H100 holds 80 GB"]
    rows = [line for line in _live_table(s).splitlines() if line.startswith("warning ")]
    assert [r.split(None, 1)[1] for r in rows] == ["on site 't' a rank needs 188.3 GB, and a H100 holds 80 GB"]
