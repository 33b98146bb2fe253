"""`rlctl launch`'s summary table: the ledger and partial rollouts lines; the check a detached launcher does not
repeat."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import pytest
import typer

from rlctl.commands import launch
from rlctl.commands.launching import detached, interrupts
from rlctl.commands.launching import launcher as launcher_cmd
from rlctl.commands.launching.launcher import be_launcher
from rlctl.commands.launching.views import partials_line, summary_table
from rlctl.errors import LaunchError, RlctlError
from rlctl.launch.jobdir import JobDir
from rlctl.ops import autoresume, detach, jobprep, jobref, launchdir, preflight
from rlctl.ops.jobdb import JobDB
from rlctl.render import OutputFormat
from tests.conftest import ROOT, run_cli


def _ledger(**partials: int) -> dict[str, object]:
    base = {"resumed": 3, "resumed_tokens": 40, "interrupted": 0, "lost_units_measured": 0}
    return {"migrated": 2, "partials": base | partials}


def test_no_unit_lost_shows_moved_and_resumed_work_only() -> None:
    assert partials_line(_ledger()) == "migrated 2 resumed 3 (40 tokens not generated again)"


def test_lost_units_show_the_bound_and_what_their_flight_records_measured() -> None:
    cut = {"interrupted": 5, "interrupted_kept_tokens": 90, "interrupted_lost_tokens_max": 5}
    line = partials_line(_ledger(**cut))
    assert line.endswith("; 5 cut by a lost unit: 90 tokens kept, ≤ 5 generated again")
    one = partials_line(_ledger(**cut, lost_units_measured=1, interrupted_lost_tokens_measured=2))
    assert one.endswith("≤ 5 generated again (2 by the flight records of 1 lost unit)")
    two = partials_line(_ledger(**cut, lost_units_measured=2, interrupted_lost_tokens_measured=0))
    assert two.endswith("(0 by the flight records of 2 lost units)")


def summary(**ledger: int) -> dict[str, object]:
    """A run's summary.json as the launcher prints it (80 prompts of 8 samples, one step stale at most)."""
    led = {"prompts": 80, "trained": 80, "requeued": 0, "lost": 0, "duplicated": 0, "filtered": 0}
    led |= {"trained_samples": 640, **_ledger(), **ledger}
    return {
        "job": "demo",
        "state": "done",
        "mode": "async",
        "eta": 1,
        "iterations": 5,
        "iterations_planned": 5,
        "reward_first": 0.1,
        "reward_last": 0.2,
        "reward_window": 1,
        "samples_per_s": 10.0,
        "tokens_per_s": 100.0,
        "t_gen_s": 1.0,
        "t_train_s": 0.5,
        "delta_s": 0.5,
        "bubble_fraction": {"rollout": 0.1, "trainer": 0.2},
        "staleness": {"0": 128, "1": led["trained_samples"] - 128},
        "staleness_violations": 0,
        "ledger": led,
        "wall_s": 9.0,
        "job_dir": "/runs/demo-1",
    }


def ledger_row(s: dict[str, object]) -> str:
    return next(line for line in summary_table(s).splitlines() if line.startswith("ledger"))


def test_the_ledger_line_says_the_samples_filtered_out_when_there_were_any() -> None:
    # 11 samples filtered: the line said `prompts 80 trained 80` while the staleness row summed to 629 (80 × 8 - 11)
    line = ledger_row(summary(filtered=11, trained_samples=629))
    assert line.endswith(
        "prompts 80 trained 80 requeued 0 lost 0 duplicated 0; samples: 11 filtered (their reward held the "
        "trainer), 629 trained"
    )
    assert ledger_row(summary()).endswith("prompts 80 trained 80 requeued 0 lost 0 duplicated 0")  # none: as before


def test_the_summary_says_how_many_reward_calls_failed_and_how() -> None:
    # a job whose every reward call returned None or timed out ended `done`, reward 0.000 → 0.000, and the table
    # said nothing of it: the counts were in summary.json alone
    rewards = {"calls": 24, "errors": 1, "timeouts": 8, "bad_type": 15}
    rows = [line for line in summary_table(summary() | {"rewards": rewards}).splitlines() if "reward failures" in line]
    assert rows == [
        "reward failures           24 of 24 calls scored task.reward_on_error (1 raised, 8 timed out, 15 wrong "
        "type); each in the controller's log"
    ]
    first = "error: sample p1/0 (data.jsonl line 2): KeyError: 'boom' (r.py:3)"
    assert "15 wrong type); the first: error: sample p1/0 (data.jsonl line 2): KeyError: 'boom' (r.py:3); each" in (
        summary_table(summary() | {"rewards": rewards | {"first_failure": first}})
    )
    died = {"calls": 24, "errors": 0, "timeouts": 0, "bad_type": 0, "died": 2}  # (once counted as "raised")
    assert "2 of 24 calls scored task.reward_on_error (2 died with their worker); each" in summary_table(
        summary() | {"rewards": died}
    )
    quiet = summary() | {"rewards": {"calls": 24, "errors": 0, "timeouts": 0, "bad_type": 0, "died": 0}}
    assert "reward failures" not in summary_table(quiet)  # none failed: no row


def test_held_out_figures_that_do_not_read_leave_the_row_out_not_the_table() -> None:
    # null or text figures (a summary.json edited, an older rlctl's): a TypeError/ValueError lost the table as the
    # launch ended; `rlctl status` leaves the row out (`outcome_rows`), and so does the launch now
    good = {"prompts": 8, "greedy_exact_first": 0.25, "greedy_exact_last": 0.5}
    good |= {"greedy_reward_first": 0.3, "greedy_reward_last": 0.6}
    assert "held-out                  exact 0.250 → 0.500, reward 0.300 → 0.600 (greedy, 8 prompts)" in (
        summary_table(summary() | {"heldout": good})
    )
    for bad in ({"greedy_exact_first": None}, {"greedy_exact_last": "0.5"}, {"greedy_reward_last": "n/a"}):
        table = summary_table(summary() | {"heldout": good | bad})
        assert "held-out" not in table and "job dir" in table, bad
    assert "held-out" not in summary_table(summary() | {"heldout": None})


def test_a_launcher_started_by_detach_does_not_check_the_job_again(tmp_path, monkeypatch) -> None:
    """`launch --detach` checks the job (preflight: a dataset's rows are read to the end), then starts the same
    launch in the background with the file's `_checked` stamp: that one skips the check, unless the file changed."""
    job = tmp_path / "job.yaml"
    job.write_text((ROOT / "jobs/demo.yaml").read_text().replace("../clusters", str(ROOT / "clusters")))
    checked: list[str] = []

    class Built(Exception):
        pass

    def launch_dir(*args: object) -> None:
        raise Built  # past the check: nothing more is needed here

    monkeypatch.setattr(preflight, "preflight", lambda job, plan=None: checked.append(str(job.path)))
    monkeypatch.setattr(launchdir, "launch_dir", launch_dir)
    stamp = launch._checked(job)
    for env, expect in ((None, 1), (stamp, 1), ("elsewhere:1:2", 2)):
        if env is not None:
            monkeypatch.setenv(launch.PREFLIGHT_PASSED_ENV, env)
        with pytest.raises(Built):
            run_cli("launch", str(job), "--job-dir", str(tmp_path / f"run{len(checked)}"))
        assert len(checked) == expect, env
        assert launch.PREFLIGHT_PASSED_ENV not in os.environ  # taken, never passed on to the agents
    job.write_text(job.read_text() + "\n")  # changed since it was checked: checked again
    assert launch._checked(job) != stamp


def test_a_launch_records_its_job_file_by_its_absolute_path(tmp_path, monkeypatch) -> None:
    """Before: `rlctl launch jobs/x.yaml` put the path as typed in the job's index row, and a launch stopped while it
    prepared was then hinted, by status, scale, attach, report and launch --resume run from another directory, to
    `rlctl launch jobs/x.yaml`, a file there is none of."""
    from rlctl.ops.jobdb import JobDB

    (tmp_path / "jobs").mkdir()
    job = tmp_path / "jobs" / "job.yaml"
    job.write_text((ROOT / "jobs/demo.yaml").read_text().replace("../clusters", str(ROOT / "clusters")))

    class Built(Exception):
        pass

    def prepare(*args: object, **kwargs: object) -> None:
        raise Built  # the row is in the index by now: nothing more is needed here

    monkeypatch.setattr(preflight, "preflight", lambda job, plan=None: None)
    monkeypatch.setattr(jobprep, "prepare", prepare)
    monkeypatch.setattr(detach, "survive_hangup", lambda log: None)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Built):
        run_cli("launch", "jobs/job.yaml", "--job-dir", str(tmp_path / "run"))
    db = JobDB()
    try:
        (row,) = db.list()
    finally:
        db.close()
    assert row.info["source"] == str(job)


def test_the_dry_run_shows_the_devices_behind_the_slots_and_where_unplaced_agents_run(tmp_path) -> None:
    # it showed the slots (0,1) where the scripts export the devices `devices` maps them to, and "(SLURM places
    # it)" for the controller of an SSH site
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        "apiVersion: rlctl/v1\nkind: Inventory\nsites:\n  a: {datacenter: d, scheduler: {kind: ssh}, gpu: H100, "
        "nodes: [{host: n1, gpus: 4, devices: [4, 5, 6, 7]}], network: {bandwidth_gbps: 100, listen_host: auto}}\n"
    )
    job = tmp_path / "job.yaml"
    job.write_text(
        "apiVersion: rlctl/v1\nkind: Job\nname: dev\ninventory: [inv.yaml]\nmodel: {kind: builtin, name: tiny-demo}\n"
        "task: {kind: digits}\nplacement: {trainer: {site: a, gpus: 1}, rollout: [{site: a, gpus: 2}]}\n"
        "warmup: {sft_steps: 0}\n"
    )
    res = run_cli("launch", "--dry-run", str(job))
    rows = {
        line.split()[0]: line.split()
        for line in res.stdout.splitlines()
        if line.startswith(("controller-", "trainer-", "rollout-"))
    }
    assert rows["controller-0"][2] == "n1" and rows["trainer-0"][4] == "4"
    assert [rows[f"rollout-{i}"][4] for i in (0, 1)] == ["5", "6"]
    assert "export CUDA_VISIBLE_DEVICES=5" in res.stdout


class _InterruptedRuns:
    """A launcher's runs whose watch Ctrl-C interrupts; `events` records what the launcher did."""

    def __init__(self, jd: JobDir, *_: object, **__: object) -> None:
        self.events: list[str] = []
        self.run: SimpleNamespace | None = None
        self.source: str | None = None
        self.jd = jd
        _InterruptedRuns.last = self

    last: _InterruptedRuns

    def start(self) -> SimpleNamespace:
        self.run = SimpleNamespace(
            id=self.jd.path.name,
            jobdir=self.jd,
            resume_command=lambda: f"rlctl launch --resume {self.jd.path.name}",
            unstarted=False,
        )
        return self.run

    def wait(self, **_: object) -> None:
        raise KeyboardInterrupt

    def stop(self) -> None:
        self.events.append("stop")


def _be_launcher(jd: JobDir, *, spec: object = None, begin: Any = None) -> None:
    """`be_launcher` of `jd` (table output) with the runs the test patched in (`autoresume.Runs`), `begin` starting
    them (default: `runs.start()`); the process's SIGTERM handler, which the launcher replaces, put back after."""
    term = signal.getsignal(signal.SIGTERM)
    try:
        start = begin if begin is not None else (lambda runs, say: runs.start())
        be_launcher(jd, object() if spec is None else spec, {}, SimpleNamespace(close=lambda: None), start, "table")
    finally:
        signal.signal(signal.SIGTERM, term)


def test_a_launch_ctrl_c_stops_says_it_stopped_the_job_and_how_to_resume_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Ctrl-C stopped every agent and exited 130 with nothing said: no word that the job stopped, nor how to go on
    monkeypatch.setattr(autoresume, "Runs", _InterruptedRuns)
    monkeypatch.setattr(detach, "survive_hangup", lambda log: None)
    jd = JobDir.create("demo", explicit=tmp_path / "demo-1")
    with pytest.raises(KeyboardInterrupt):
        _be_launcher(jd)
    assert _InterruptedRuns.last.events == ["stop"]
    assert capsys.readouterr().err.splitlines()[-1] == (
        "rlctl: interrupted: job demo-1 stopped (every agent); continue it with `rlctl launch --resume demo-1`"
    )


def _demo_job(tmp_path: Path) -> Path:
    job = tmp_path / "job.yaml"
    job.write_text((ROOT / "jobs/demo.yaml").read_text().replace("../clusters", str(ROOT / "clusters")))
    return job


def test_a_launch_ctrl_c_before_its_launcher_takes_over_says_nothing_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # its first ~1.5 s (modules loaded, the job read, planned and checked): exit 130 with nothing said, as typer ends
    # a KeyboardInterrupt, where a Ctrl-C a moment later says what became of the job
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    job = _demo_job(tmp_path)

    def checking(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(preflight, "preflight", checking)
    r = run_cli("launch", str(job), "--job-dir", str(tmp_path / "run"))
    assert (r.exit_code, r.stderr) == (
        130,
        f"rlctl: interrupted: the launch of {job} stopped before it started anything: nothing to stop\n",
    )
    assert not (tmp_path / "run").exists()


def test_a_launch_detach_ctrl_c_before_its_launcher_took_the_job_on_leaves_it_in_the_index_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C as the launcher in the background began (importing, before its index row): the new timestamped job dir
    # this launch made, its launcher.log in it, was left outside the index: `rlctl status` and `stop` did not find it
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    job = _demo_job(tmp_path)
    monkeypatch.setattr(preflight, "preflight", lambda job, plan=None: None)

    def cancelled(
        args: list[str], path: Path, output: object, *, env: object = None, cancelled: Callable[[], object], **_: object
    ) -> None:
        detach.log_header(detach.log_path(path), pid=2**22 + 1, args=args, detached=True)  # as `spawn` writes it
        cancelled()  # (`run_detached` cancelled the launcher before it indexed, and said its line)
        raise interrupts.InterruptSaid

    monkeypatch.setattr(launch, "run_detached", cancelled)
    assert run_cli("launch", str(job), "--detach").exit_code == 130
    db = JobDB()
    try:
        (row,) = db.list()
    finally:
        db.close()
    assert (row.state, Path(row.job_dir).parent, row.info["source"]) == ("stopped", tmp_path / "home/runs", str(job))
    assert f"launch it anew with `rlctl launch {job}`" in run_cli("status", row.name).stdout


def test_a_launch_ctrl_c_once_its_job_dir_is_made_stops_the_job_and_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # made and indexed `launching`, the launcher not set up yet: nothing said, the row left `launching`
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    job = _demo_job(tmp_path)

    def progress() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher_cmd, "Progress", progress)
    r = run_cli("launch", str(job), "--job-dir", str(tmp_path / "run"))
    assert (r.exit_code, r.stderr) == (
        130,
        "rlctl: interrupted: job run stopped while its launch prepared it (nothing started); launch it again with "
        f"`rlctl launch {job}`\n",
    )
    assert JobDB().get("run").state == "stopped"
    # its job file, as the line names it (status said `rlctl launch JOB.yaml`)
    assert f"launch it anew with `rlctl launch {job}`" in run_cli("status", "run").stdout
    # a Ctrl-C the launcher said (its runs' watch interrupted) is said once
    monkeypatch.undo()
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))

    class Preparing(_InterruptedRuns):
        def preparing(self, *, source: str) -> None:
            self.source = source
            raise KeyboardInterrupt  # in the SFT warm-up

    monkeypatch.setattr(autoresume, "Runs", Preparing)
    monkeypatch.setattr(detach, "survive_hangup", lambda log: None)
    term = signal.getsignal(signal.SIGTERM)
    try:
        r = run_cli("launch", str(job), "--job-dir", str(tmp_path / "run2"))
    finally:
        signal.signal(signal.SIGTERM, term)
    assert (r.exit_code, r.stderr.splitlines()[1:]) == (
        130,
        [f"rlctl: interrupted: job run2 stopped while its launch prepared it (nothing started); launch it again with "
         f"`rlctl launch {job}`"],
    )  # fmt: skip


def test_a_resume_ctrl_c_before_its_launcher_takes_over_says_the_job_is_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))

    def resolving(*_: object, **__: object) -> None:
        raise KeyboardInterrupt  # (an SSH fetch of its record that blocks)

    monkeypatch.setattr(jobref, "resolve", resolving)
    r = run_cli("launch", "--resume", "demo-1")
    assert (r.exit_code, r.stderr) == (
        130,
        "rlctl: interrupted: the resume of job demo-1 stopped before it started anything; the job is as it was\n",
    )


class _TerminatedRuns(_InterruptedRuns):
    """A launcher's runs whose watch a SIGTERM ends (the launcher's handler: `sys.exit(143)`)."""

    def wait(self, **_: object) -> None:
        sys.exit(143)


def test_a_launch_sigterm_says_it_stopped_the_job_and_how_to_resume_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `kill PID` of a launcher stopped every agent and exited 143 with nothing said (Ctrl-C says it)
    monkeypatch.setattr(autoresume, "Runs", _TerminatedRuns)
    monkeypatch.setattr(detach, "survive_hangup", lambda log: None)
    jd = JobDir.create("demo", explicit=tmp_path / "demo-1")
    with pytest.raises(SystemExit) as e:
        _be_launcher(jd)
    assert e.value.code == 143 and _TerminatedRuns.last.events == ["stop"]
    assert capsys.readouterr().err.splitlines()[-1] == (
        "rlctl: SIGTERM: job demo-1 stopped (every agent); continue it with `rlctl launch --resume demo-1`"
    )


class _UnreachableRuns(_InterruptedRuns):
    """A launcher's runs whose stop cannot reach the controller's site (its record not fetched)."""

    def stop(self) -> None:
        super().stop()
        raise LaunchError("cannot fetch the job's record from site c: ssh c-1: connection refused")


@pytest.mark.parametrize("ended_by", ["start", "ctrl-c"])
def test_a_stop_that_fails_after_an_error_leaves_that_error_said(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    ended_by: str,
) -> None:
    """The launcher's `finally` stops the run; its stop, failing too (the controller's site unreachable), raised its
    own error in place of the one that ended the launch (the start's, Ctrl-C's line unsaid): that one stays, the
    stop's is a warning line."""
    monkeypatch.setattr(autoresume, "Runs", _UnreachableRuns)
    monkeypatch.setattr(detach, "survive_hangup", lambda log: None)
    jd = JobDir.create("demo", explicit=tmp_path / "demo-1")

    def begin(runs: Any, say: object) -> Any:
        if ended_by == "start":
            runs.start()
            raise LaunchError("site c: the controller did not start: exited 1")
        return runs.start()

    with pytest.raises(KeyboardInterrupt if ended_by == "ctrl-c" else LaunchError) as e:
        _be_launcher(jd, begin=begin)
    assert _UnreachableRuns.last.events == ["stop"]
    if ended_by == "start":
        assert str(e.value) == "site c: the controller did not start: exited 1"
    else:
        # not `stopped (every agent)`: the stop failed, and an agent its site's stop did not reach may run on
        assert capsys.readouterr().err.splitlines()[-1] == (
            "rlctl: interrupted: job demo-1: its stop failed (the warning above); continue it with "
            "`rlctl launch --resume demo-1`"
        )
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == [
        "stopping the job's agents: cannot fetch the job's record from site c: ssh c-1: connection refused"
    ]


def test_a_launch_ctrl_c_during_its_prepare_says_to_launch_it_again(tmp_path: Path) -> None:
    # Ctrl-C in the SFT warm-up (no run yet, no job.json): it said `continue it with rlctl launch --resume DIR`,
    # which then refused the job as never prepared
    from rlctl.commands.launching.interrupts import interrupted_line

    jd = JobDir.create("demo", explicit=tmp_path / "demo-2")
    assert interrupted_line(jd, None, source="jobs/my job.yaml") == (
        "rlctl: interrupted: job demo-2 stopped while its launch prepared it (nothing started); launch it again "
        "with `rlctl launch 'jobs/my job.yaml'`"
    )
    jd.job_json.write_text("{}")  # prepared, its launcher gone before a run: a resume continues it
    assert interrupted_line(jd, None).endswith(f"continue it with `rlctl launch --resume {jd.path}`")


class _FailedRuns(_InterruptedRuns):
    """A launcher's runs whose job ends failed, with the state the controller writes (naming the resume)."""

    def wait(self, **_: object) -> dict[str, str]:
        return {"state": "failed: trainer trainer-0 was lost; continue the job with `rlctl launch --resume demo-1`"}


@pytest.mark.parametrize("names_it", [True, False])
def test_a_failed_launch_names_the_resume_command_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, names_it: bool
) -> None:
    """The controller's failure line names `rlctl launch --resume JOB`; the launcher's hint said it a second time."""
    import rlctl.ops.evaluation

    monkeypatch.setattr(autoresume, "Runs", _FailedRuns)
    monkeypatch.setattr(detach, "survive_hangup", lambda log: None)
    monkeypatch.setattr(rlctl.ops.evaluation, "add_heldout", lambda jd, spec, summary, say: summary)
    monkeypatch.setattr(launcher_cmd, "emit", lambda *_: None)
    if not names_it:  # a state without it (a stop): the hint names it
        monkeypatch.setattr(_FailedRuns, "wait", lambda self, **_: {"state": "stopped"})
    jd = JobDir.create("demo", explicit=tmp_path / "demo-1")
    with pytest.raises(RlctlError) as e:
        _be_launcher(jd, spec=SimpleNamespace(name="demo"))
    text = f"{e.value} (hint: {e.value.hint})"
    assert text.count("rlctl launch --resume demo-1") == 1, text
    assert e.value.hint is not None and e.value.hint.startswith(f"see {jd.path}/logs")


def test_a_finished_launch_stays_the_jobs_launcher_while_it_evaluates_the_final_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the held-out evaluation ran after the launcher lock was let go: a `rlctl stop` then said `launcher …: ended
    # 0.1 s after the agents` while it went on evaluating, and a `launch --resume` was not refused meanwhile
    import rlctl.ops.evaluation

    jd = JobDir.create("demo", explicit=tmp_path / "demo-1")
    holders: list[str | None] = []

    def evaluate(jd_: JobDir, spec: object, summary: dict[str, str], say: object) -> dict[str, str]:
        holders.append(jd_.launcher_holder())
        return summary

    monkeypatch.setattr(autoresume, "Runs", _FailedRuns)
    monkeypatch.setattr(_FailedRuns, "wait", lambda self, **_: {"state": "done"})
    monkeypatch.setattr(detach, "survive_hangup", lambda log: None)
    monkeypatch.setattr(rlctl.ops.evaluation, "add_heldout", evaluate)
    monkeypatch.setattr(launcher_cmd, "emit", lambda *_: None)
    _be_launcher(jd, spec=SimpleNamespace(name="demo"))
    assert holders == [f"pid {os.getpid()} on {socket.gethostname()}"]
    assert jd.launcher_holder() is None


@pytest.mark.parametrize("ended_by", ["interrupted", "SIGTERM"])
def test_a_ctrl_c_in_a_finished_jobs_held_out_evaluation_says_the_job_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], ended_by: str
) -> None:
    # Ctrl-C while the launcher evaluated a done job's final checkpoint: exit 130 with nothing said, not even that
    # the job had finished; a SIGTERM there (the launcher holds the job meanwhile) an exit 143 that said nothing
    import rlctl.ops.evaluation

    def evaluate(*_: object, **__: object) -> None:
        if ended_by == "SIGTERM":
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # the launcher's handler: sys.exit(143)
        raise KeyboardInterrupt

    monkeypatch.setattr(autoresume, "Runs", _FailedRuns)
    monkeypatch.setattr(_FailedRuns, "wait", lambda self, **_: {"state": "done", "iterations": 30})
    monkeypatch.setattr(detach, "survive_hangup", lambda log: None)
    monkeypatch.setattr(rlctl.ops.evaluation, "add_heldout", evaluate)
    jd = JobDir.create("demo", explicit=tmp_path / "demo-1")
    with pytest.raises(KeyboardInterrupt if ended_by == "interrupted" else SystemExit):
        _be_launcher(jd, spec=SimpleNamespace(name="demo"))
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"rlctl: {ended_by}: job demo-1 done (30 iterations); its held-out evaluation was cut, so its summary has "
        "none (`rlctl status demo-1` shows it)"
    )


def test_a_finished_launch_says_what_to_do_next_by_the_jobs_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A finished job's table ended at its job dir: the report, the checkpoints and the final model's pull were the
    operator's to find."""
    import rlctl.ops.evaluation

    monkeypatch.setattr(autoresume, "Runs", _FailedRuns)
    monkeypatch.setattr(_FailedRuns, "wait", lambda self, **_: {"state": "done"})
    monkeypatch.setattr(detach, "survive_hangup", lambda log: None)
    monkeypatch.setattr(rlctl.ops.evaluation, "add_heldout", lambda jd, spec, summary, say: summary)
    shown: list[dict[str, object]] = []
    monkeypatch.setattr(launcher_cmd, "emit", lambda s, *_: shown.append(s))
    jd = JobDir.create("demo", explicit=tmp_path / "demo 1")
    _be_launcher(jd, spec=SimpleNamespace(name="demo"))
    assert shown[0]["next"] == {
        "report": "rlctl report 'demo 1'",
        "checkpoints": "rlctl status 'demo 1' --checkpoints",
        "pull": "rlctl pull 'demo 1'",
    }
    [row] = [
        line for line in summary_table(summary() | {"next": shown[0]["next"]}).splitlines() if line.startswith("next")
    ]
    assert row.split(None, 1)[1] == (
        "`rlctl report 'demo 1'` (curves), `rlctl status 'demo 1' --checkpoints`, `rlctl pull 'demo 1'` (its final "
        "model)"
    )


def time_rows_of(s: dict[str, object]) -> list[str]:
    return [line for line in summary_table(s).splitlines() if line.split()[:1] in (["wall"], ["training"], ["resumed"])]


def test_the_table_says_what_each_time_covers_and_that_the_job_resumed() -> None:
    # after one automatic resume the table said `wall 59.1 s` (the last run's alone) of a job that ran 81 s, beside
    # summary.json's run_s 45.2 and `report`'s wall s 54.3, and nothing of the resume (only `--output json` had it)
    resumed = summary() | {
        "wall_s": 81.0,
        "run_wall_s": 59.1,
        "auto_resumes": 1,
        "run_s": 45.2,
        "job_wall_s": 54.3,
        "resilience": {"resumes": 1},
    }
    rows = [" ".join(line.split()) for line in time_rows_of(resumed)]
    assert rows == [
        "wall 81.0 s, this launcher's (its last run: 59.1 s)",
        "training 45.2 s this run (first sample → last iteration); 54.3 s since the job's first start",
        "resumed 1 time, 1 by this launcher (checkpoint.auto_resume)",
    ]
    plain = summary() | {"run_s": 7.5, "job_wall_s": 8.0, "resilience": {"resumes": 0}, "auto_resumes": 0}
    rows = [" ".join(line.split()) for line in time_rows_of(plain)]
    assert rows == ["wall 9.0 s, this launcher's", "training 7.5 s this run (first sample → last iteration)"]


def test_a_resume_ctrl_c_before_any_agent_started_says_the_job_is_as_it_was(tmp_path: Path) -> None:
    # Ctrl-C while a `--resume --iterations 200` of a finished job staged: its start put the job back as it was
    # (finished), and the line said it `stopped (every agent)`, to be continued with a plain resume, which refuses it.
    # A --trainer-split is named too: its plan.json was put back, and a plain resume runs the plan's split
    from rlctl.commands.launching.interrupts import interrupted_line

    jd = JobDir.create("demo", explicit=tmp_path / "demo-3")
    run = SimpleNamespace(unstarted=True, resume_command=lambda: "rlctl launch --resume demo-3")
    line = interrupted_line(jd, run)  # type: ignore[arg-type]
    assert line == (
        "rlctl: interrupted: the resume of job demo-3 stopped before any agent of it started; the job is as it was "
        "before it: continue it with `rlctl launch --resume demo-3` (and the resume's --iterations / --checkpoint / "
        "--trainer-split, where it had them)"
    )


def test_a_foreground_launcher_heads_the_launcher_log_and_logs_says_the_rest_is_an_earlier_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # launcher.log is every launcher's, appended with no header, and a foreground launcher wrote nothing there: after
    # a foreground resume, `rlctl logs JOB launcher` showed an earlier detached launcher's ending as the job's last word
    from rlctl.config import load_job

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(autoresume, "Runs", _InterruptedRuns)
    monkeypatch.setattr(detach, "survive_hangup", lambda log: None)
    monkeypatch.delenv(detach.READY_FD_ENV, raising=False)
    jd = JobDir.create("demo", explicit=tmp_path / "demo-1")
    jd.write_job(load_job(ROOT / "jobs/demo.yaml").spec, source="jobs/demo.yaml")
    log = detach.log_path(jd.path)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("job demo-1: failed after 3 iterations\n")  # an earlier detached launcher's end
    with pytest.raises(KeyboardInterrupt):
        _be_launcher(jd)
    capsys.readouterr()
    lines = log.read_text().splitlines()
    assert len(lines) == 2, lines  # its header after the earlier launcher's line
    head = lines[-1]
    assert (
        detach.HEADER.match(head) and f" launcher pid {os.getpid()} on {socket.gethostname()} (in a terminal)" in head
    )
    r = run_cli("logs", str(jd.path), "launcher")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines() == ["job demo-1: failed after 3 iterations", head]
    assert r.stderr == (
        f"rlctl: the job's latest launcher (pid {os.getpid()} on {socket.gethostname()}, began {head[:19]}) runs in a "
        "terminal and writes its output there: the lines before its header are an earlier launcher's\n"
    )


def test_the_launch_checks_the_job_as_its_mode_and_iterations_overrides_make_it(tmp_path) -> None:
    """`launch --mode sync` runs the job in sync mode: a field read in async mode only is refused as `rlctl check`
    refuses it in a sync job file, versus checked against the file's mode (async) and accepted, then ignored."""
    job = tmp_path / "job.yaml"
    job.write_text(
        f"apiVersion: rlctl/v1\nkind: Job\nname: over\ninventory: [{ROOT / 'clusters/local.yaml'}]\n"
        "model: {kind: builtin, name: tiny-demo}\ntask: {kind: digits}\nwarmup: {sft_steps: 0}\n"
        "placement: {trainer: {site: local, gpus: 1}, rollout: [{site: local, gpus: 2}]}\n"
        "rollout: {group_barrier: always}\n"
    )
    res = run_cli("launch", "--dry-run", "-o", "json", str(job), "--job-dir", str(tmp_path / "run"))
    assert res.exit_code == 0 and "rollout.group_barrier" not in res.stderr  # async: read
    res = run_cli("launch", "--dry-run", "-o", "json", str(job), "--mode", "sync", "--job-dir", str(tmp_path / "run"))
    assert res.exit_code == 0
    assert "rollout.group_barrier: 'always': read in pipeline.mode 'async' only" in res.stderr, res.stderr


class _CtrlCChild:
    """A launcher in the background whose start is Ctrl-C'd while this process shows its lines."""

    def follow(self, write: Callable[[bytes], None]) -> None:
        raise KeyboardInterrupt

    def cancel(self) -> int:
        return 143


def test_a_ctrl_c_of_a_launch_in_the_background_says_in_one_line_what_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # it said 'stopping the launch in the background' and no more: not the job it left, nor where to look at it
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(detach, "spawn", lambda *_, **__: _CtrlCChild())
    from tests.unit.job_rows import indexed_row

    jd = JobDir.create("demo", explicit=tmp_path / "demo-1")
    indexed_row("demo-1", jd.path, job="demo", state="stopped")
    moved = JobDir.create("demo", explicit=tmp_path / "my run")  # a job dir the index lacks (moved)
    for path, said in [
        (
            jd.path,
            f"job demo-1 is left in the index, stopped, its job dir {jd.path} (`rlctl status demo-1`; its "
            "launcher's lines: `rlctl logs demo-1 launcher`); launch it anew with `rlctl launch JOB.yaml`",
        ),
        (
            moved.path,
            f"its job dir {moved.path} is left, outside the index (`rlctl status '{moved.path}'`; its "
            f"launcher's lines: `rlctl logs '{moved.path}' launcher`); launch it anew with `rlctl launch JOB.yaml`",
        ),
        (tmp_path / "none", "nothing is left (no job dir)"),
    ]:
        with pytest.raises(interrupts.InterruptSaid):
            detached.run_detached(["attach", str(path)], path, OutputFormat.table)
        assert capsys.readouterr().err == (
            f"rlctl: interrupted: stopping the launch in the background... it stopped; {said}\n"
        )


def test_a_ctrl_c_of_a_launch_in_the_background_says_how_the_job_left_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The line said the job's state and `rlctl status` alone, not how to go on from it, as an attached launch's
    Ctrl-C line does: a job stopped before it was prepared is launched anew from its job file, a prepared one
    continued (a finished one trained on); one still live (its launcher not waited for) has `status` alone."""
    from tests.unit.job_rows import indexed_row

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(detach, "spawn", lambda *_, **__: _CtrlCChild())
    for name, state, prepared, said in [
        ("fresh-1", "stopped", False, "; launch it anew with `rlctl launch /jobs/fresh.yaml`"),
        ("demo-1", "stopped", True, "; continue it with `rlctl launch --resume demo-1`"),
        ("done-1", "finished", True, "; train it on with `rlctl launch --resume done-1 --iterations N`"),
        ("live-1", "launching", True, ""),
    ]:
        jd = JobDir.create(name, explicit=tmp_path / name)
        if prepared:
            jd.job_json.write_text("{}")
        indexed_row(name, jd.path, job=name, state=state, info={"source": f"/jobs/{name.split('-')[0]}.yaml"})
        with pytest.raises(interrupts.InterruptSaid):
            detached.run_detached(["launch", "--resume", str(jd.path)], jd.path, OutputFormat.table)
        err = capsys.readouterr().err
        assert err.startswith(f"rlctl: interrupted: stopping the launch in the background... it stopped; job {name} ")
        assert err.endswith(f"launcher's lines: `rlctl logs {name} launcher`){said}\n"), err


class _CtrlCTwiceChild(_CtrlCChild):
    """… and Ctrl-C'd again while this process waits (up to a minute) for it to stop."""

    def cancel(self) -> int:
        raise KeyboardInterrupt


def test_a_second_ctrl_c_as_a_launch_in_the_background_stops_still_says_what_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the second Ctrl-C went on as a plain KeyboardInterrupt: `cancelled` (a fresh launch's job dir put in the index)
    # never ran, and `rlctl launch` then said the launch 'stopped before it started anything: nothing to stop'
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(detach, "spawn", lambda *_, **__: _CtrlCTwiceChild())
    jd = JobDir.create("demo", explicit=tmp_path / "demo-1")
    put: list[Path] = []
    with pytest.raises(interrupts.InterruptSaid):
        detached.run_detached(
            ["attach", str(jd.path)], jd.path, OutputFormat.table, cancelled=lambda: put.append(jd.path)
        )
    assert put == [jd.path]
    assert capsys.readouterr().err.startswith(
        "rlctl: interrupted: stopping the launch in the background... not waited for (told to stop, it may still be "
        f"stopping); its job dir {jd.path} is left, outside the index"
    )


def _interrupted_in(hook: Literal["cancelled", "unstarted"], path: Path) -> None:
    """A background launch of `path` Ctrl-C'd as its `hook` (`cancelled` or `unstarted`) puts right what it left: it
    ends with the one line's InterruptSaid, not a plain KeyboardInterrupt."""

    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as e:  # (a plain one, not caught here, would end the test session)
        if hook == "cancelled":
            detached.run_detached(["attach", str(path)], path, OutputFormat.table, cancelled=interrupted)
        else:
            detached.run_detached(["attach", str(path)], path, OutputFormat.table, unstarted=interrupted)
    assert isinstance(e.value, interrupts.InterruptSaid)


def test_a_third_ctrl_c_as_a_launch_in_the_background_stops_still_ends_with_the_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A third Ctrl-C while `cancelled` put right what the launcher left went on as a plain KeyboardInterrupt, the
    line unsaid (`rlctl launch` then said the launch 'stopped before it started anything: nothing to stop')."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(detach, "spawn", lambda *_, **__: _CtrlCTwiceChild())
    path = tmp_path / "my run"
    _interrupted_in("cancelled", path)
    assert capsys.readouterr().err == (
        "rlctl: interrupted: stopping the launch in the background... not waited for (told to stop, it may still be "
        f"stopping); what it left not looked at (interrupted again): `rlctl status '{path}'`\n"
    )


class _EndedChild:
    """A launcher in the background that ended before the job ran (refused as it prepared: its error among its
    lines)."""

    proc = SimpleNamespace(returncode=2)

    def follow(self, write: Callable[[bytes], None]) -> None:
        write(b"rlctl: error: task.path: no such file\n")


def test_a_ctrl_c_as_an_ended_background_launchers_leftovers_are_removed_ends_with_the_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Ctrl-C while `unstarted` removed what a launcher that ended before the job ran made went on as a plain
    KeyboardInterrupt (`rlctl launch` then said the launch 'stopped before it started anything: nothing to stop')."""
    monkeypatch.setattr(detach, "spawn", lambda *_, **__: _EndedChild())
    path = tmp_path / "my run"
    _interrupted_in("unstarted", path)
    assert capsys.readouterr().err == (
        "rlctl: error: task.path: no such file\n"
        "rlctl: interrupted: the launch in the background ended before the job ran (its lines above say why); what "
        f"it made in '{path}' may be left (interrupted as it was removed)\n"
    )
    with pytest.raises(typer.Exit) as ended:  # not interrupted: the launcher's exit status
        detached.run_detached(["attach", str(path)], path, OutputFormat.table)
    assert ended.value.exit_code == 2
