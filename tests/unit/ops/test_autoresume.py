"""When a launcher resumes its failed job by itself (`checkpoint.auto_resume`), with scripted runs in place of
`JobRun`: a failed run that completed a newer checkpoint is resumed from it while resumes are left; one that
completed none (a crash loop), a stopped or finished run, and a job without resumes are not. The end to end
case (a trainer SIGKILLed, resumed, every prompt once) is
`tests/integration/ops/test_ops_resume.py::test_a_failed_run_resumes_by_itself_with_auto_resume`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from rlctl.checkpoint.choose import ResumePoint
from rlctl.config import load_job
from rlctl.errors import LaunchError
from rlctl.launch.jobdir import JobDir
from rlctl.ops import autoresume, refusals
from rlctl.ops.runstate import STOP_REQUESTED, WARNING
from tests.conftest import ROOT


class ScriptedRun:
    """Stands in for JobRun: each run takes the next outcome of `script` — a summary state, or an exception — and
    writes the `checkpoint` events the script gives it (as the controller does)."""

    script: ClassVar[list[tuple[Any, list[int]]]] = []
    started: ClassVar[list[bool]] = []  # each start's `resume`
    stopped: ClassVar[int] = 0
    limits: ClassVar[list[str | None]] = []  # each run's end at a time limit (`JobRun.time_limit`); none: None

    def __init__(self, jobdir: JobDir, spec: Any, plan: Any, **_: Any) -> None:
        self.jobdir = jobdir
        self.address: str | None = "tcp://127.0.0.1:1"  # its controller's (none of them listens)
        self.resumed: ResumePoint | None = None
        self.limit: str | None = None
        self.run_id: str | None = None

    def time_limit(self) -> str | None:
        return self.limit

    def resume_command(self) -> str:
        return "rlctl launch --resume j"

    def start(self, *, resume: bool = False, checkpoint: int | None = None) -> None:
        ScriptedRun.started.append(resume)
        self.run_id = f"run-{len(ScriptedRun.started)}"  # (its id, given as it starts)
        if resume:
            done = [e["version"] for e in self.jobdir.read_lines(self.jobdir.events) if e["event"] == "checkpoint"]
            self.resumed = ResumePoint(version=max(done, default=0), pointer="")

    def wait(self, **_: Any) -> dict[str, Any]:
        outcome, checkpoints = ScriptedRun.script.pop(0)
        self.limit = ScriptedRun.limits.pop(0) if ScriptedRun.limits else None
        for v in checkpoints:
            self.jobdir.event("checkpoint", version=v)
        if isinstance(outcome, Exception):
            raise outcome
        return {"state": outcome}

    def attach(self) -> None:  # (a run started by a launcher that is gone)
        self.run_id = "run-0"

    def stop(self) -> None:
        ScriptedRun.stopped += 1


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(autoresume, "JobRun", ScriptedRun)
    ScriptedRun.started, ScriptedRun.stopped, ScriptedRun.limits = [], 0, []
    said: list[str] = []

    def make(
        script: list[tuple[Any, list[int]]], auto_resume: int, *, warnings: list[str] | None = None
    ) -> tuple[autoresume.Runs, list[str]]:
        ScriptedRun.script = script
        spec = load_job(ROOT / "jobs" / "demo.yaml").spec
        spec = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"auto_resume": auto_resume})})
        r = autoresume.Runs(JobDir.create("j", explicit=tmp_path / "job"), spec, {}, db=None, say=said.append)
        r.start(warnings=warnings)
        return r, said

    return make


FAILED = "failed: trainer-0 lost (connection reset)"


def test_a_failed_run_past_a_new_checkpoint_is_resumed_from_it(runs):
    r, said = runs([(FAILED, [10, 20]), ("done", [30])], auto_resume=2)
    assert r.wait()["state"] == "done"
    assert ScriptedRun.started == [False, True] and ScriptedRun.stopped == 1  # the failed run's leftovers stopped
    assert said[0] == f"job demo {FAILED}; resuming it from checkpoint v20 (checkpoint.auto_resume: 1 more left)"
    assert said[1] == "job demo: resumed from checkpoint v20"
    auto = [e for e in r.jobdir.read_lines(r.jobdir.events) if e["event"] == "auto_resume"]
    assert [(e["version"], e["left"], e["after"]) for e in auto] == [(20, 1, FAILED)]


def priced_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: list[tuple[Any, list[int]]], *, cut_tokens: int
) -> tuple[autoresume.Runs, list[str], str | None]:
    """The launcher's `Runs` (one automatic resume) of a megatron 7B job launched at tp 2 on H100s with a rank's cut
    of `cut_tokens` (job.json unedited: its launch's), `script` its runs; what it says; and the warning `launch
    --resume` says of it as it is (`judge_memory`: 32,768 tokens, 188 GB a rank; 512: None), its first run's."""
    from rlctl.ops.resumememory import judge_memory
    from tests.unit.ops.test_resume_edit_memory import launched_as_is
    from tests.unit.ops.test_resume_point import split_job

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(autoresume, "JobRun", ScriptedRun)
    ScriptedRun.started, ScriptedRun.stopped, ScriptedRun.limits, ScriptedRun.script = [], 0, [], script
    jd = split_job(tmp_path, gpus=4, model={"kind": "builtin", "name": "qwen2.5-7b"}, gpu="H100")
    launched_as_is(jd, train_micro_batch_tokens=cut_tokens, train_micro_batch_samples=max(cut_tokens // 512, 1))
    spec = jd.read_job()
    spec = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"auto_resume": 1})})
    said: list[str] = []
    r = autoresume.Runs(jd, spec, jd.read_plan(), db=None, say=said.append)
    return r, said, judge_memory(jd, jd.read_plan(), edited=[])


def warned(r: autoresume.Runs) -> list[tuple[str, str]]:
    return [(e["run"], e["line"]) for e in r.jobdir.read_lines(r.jobdir.events) if e["event"] == WARNING]


def test_a_warning_said_as_the_first_run_started_is_judged_again_and_recorded_for_each_run_resumed_automatically(
    tmp_path, monkeypatch
):
    """`launch --resume`'s warning of a trainer rank this rlctl prices past its GPU, judged again before the
    automatic resume with the job as it is then (unchanged: the same line), said and recorded for that run too: a
    `warning` event naming each run's id (`rlctl status` shows the latest run's), versus the resumed run's status
    without it (the first run's alone)."""
    r, said, line = priced_runs(tmp_path, monkeypatch, [(FAILED, [10]), ("done", [])], cut_tokens=32768)
    assert line is not None and " need " in line
    r.start(warnings=[line])
    assert r.wait()["state"] == "done" and ScriptedRun.started == [False, True]
    assert warned(r) == [("run-1", line), ("run-2", line)]
    assert f"job resume: {line}" in said


def test_an_automatic_resume_after_the_cut_was_lowered_records_no_stale_warning(tmp_path, monkeypatch):
    """batch.train_micro_batch_tokens lowered in job.json during a run resumed with the warning (not a field its
    checkpoints depend on: the resumed run takes it up): the automatic resume judges the job as it is then, which
    fits, and records and says no warning; versus the first resume's "need 188 GB" line replayed for it."""
    from tests.unit.ops.test_resume_edit_memory import edit_batch

    r, said, line = priced_runs(tmp_path, monkeypatch, [(FAILED, [10]), ("done", [])], cut_tokens=32768)
    assert line is not None
    r.start(warnings=[line])
    edit_batch(r.jobdir, train_micro_batch_tokens=1024, train_micro_batch_samples=2)
    assert r.wait()["state"] == "done" and ScriptedRun.started == [False, True]
    assert warned(r) == [("run-1", line)]
    assert not [s for s in said if "warning" in s], said


def test_an_automatic_resume_after_an_edit_that_no_longer_fits_is_refused_as_launch_resume_refuses_it(
    tmp_path, monkeypatch
):
    """job.json's cut raised during the run past what a rank's GPU holds (32,768 tokens a rank of a 7B at tp 2:
    188 GB; 64.9 GB as launched): not resumed automatically, in one line naming job.json, the edited field and the
    figures, before and after the edit (as `launch --resume` refuses it, exit 2), with an `auto_resume_refused`
    event; the failure is the job's. Versus resumed on the edit with no word (the first run's warnings, none,
    replayed)."""
    from tests.unit.ops.test_resume_edit_memory import edit_batch

    r, said, line = priced_runs(tmp_path, monkeypatch, [(FAILED, [10]), ("done", [])], cut_tokens=512)
    assert line is None
    r.start()
    edit_batch(r.jobdir, train_micro_batch_tokens=32768, train_micro_batch_samples=64)
    assert r.wait()["state"] == FAILED and ScriptedRun.started == [False] and r.resumes == 0
    assert said[-1].startswith(
        f"job resume {FAILED}; not resumed automatically: {r.jobdir.job_json} was edited since the launch (batch), "
        "which raised a rank's need from 64.9 to 188.3 GB, past 72.0 GB usable: with the job as edited the trainer's "
        "2 rank(s) at tp 2 pp 1 dp 1 need 188.3 GB each"
    ), said[-1]
    assert "\n" not in said[-1] and "--trainer-split" in said[-1]
    refused = [e for e in r.jobdir.read_lines(r.jobdir.events) if e["event"] == "auto_resume_refused"]
    assert [e["after"] for e in refused] == [FAILED] and warned(r) == []


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(("batch", {"train_micro_batch_tokens": 16384}), id="cut-lowered-not-far-enough"),
        pytest.param(("algorithm", {"lr": 1e-6}), id="lr"),
    ],
)
def test_an_automatic_resume_after_an_edit_that_does_not_raise_the_need_is_resumed_with_the_warning(
    tmp_path, monkeypatch, edit
):
    """A job priced past its GPU (32,768 tokens a rank of a 7B at tp 2: 188.3 GB), resumed with the warning, whose
    job.json is edited during the run without raising a rank's need — the cut lowered as the warning advises, not far
    enough (16,384: 174.7 GB), or algorithm.lr, which a resume takes up — is resumed automatically, its warning (the
    need as edited, the edit said not to raise it) recorded for the new run; versus not resumed, the edit blamed."""
    from tests.unit.ops.test_resume_edit_memory import edit_job

    r, said, line = priced_runs(tmp_path, monkeypatch, [(FAILED, [10]), ("done", [])], cut_tokens=32768)
    assert line is not None
    r.start(warnings=[line])
    field, values = edit
    edit_job(r.jobdir, field, **values)
    assert r.wait()["state"] == "done" and ScriptedRun.started == [False, True] and r.resumes == 1
    (first, (run, again)) = warned(r)
    assert first == ("run-1", line) and run == "run-2"
    assert f"(not refused: its edit since the launch ({field}) did not raise a rank's need (188.3 GB as launched))" in (
        again
    ), again
    assert f" need {188.3 if field == 'algorithm' else 174.7} GB each " in again, again
    assert f"job resume: {again}" in said


def test_an_automatic_resume_of_a_job_json_without_the_launch_record_warns_and_is_not_refused(tmp_path, monkeypatch):
    """A job.json an rlctl before `job_launched` wrote, its cut raised past a rank's GPU during the run: resumed
    automatically with the warning (no launch record to tell the edit's effect by), versus not resumed."""
    from rlctl.launch.jobdir import JOB_LAUNCHED
    from tests.unit.ops.test_resume_edit_memory import edit_batch

    r, _said, line = priced_runs(tmp_path, monkeypatch, [(FAILED, [10]), ("done", [])], cut_tokens=512)
    assert line is None
    data = json.loads(r.jobdir.job_json.read_text())
    del data[JOB_LAUNCHED]
    r.jobdir.job_json.write_text(json.dumps(data))
    r.start()
    edit_batch(r.jobdir, train_micro_batch_tokens=32768, train_micro_batch_samples=64)
    assert r.wait()["state"] == "done" and ScriptedRun.started == [False, True]
    ((run, again),) = warned(r)
    assert (
        run == "run-2"
        and f"(not refused: {r.jobdir.job_json} keeps no launch record of the fields edited since " in (again)
    ), again


def test_an_automatic_resume_of_an_attached_run_records_its_warning(tmp_path, monkeypatch):
    """`rlctl attach` to a run started with the warning, then that run failing past a new checkpoint: the automatic
    resume is judged as `launch --resume` judges it and its warning recorded for the new run, versus none (an
    attach's launcher held no warnings: the first run's were its launcher's)."""
    r, _said, line = priced_runs(tmp_path, monkeypatch, [(FAILED, [10]), ("done", [])], cut_tokens=32768)
    assert line is not None
    r.jobdir.event("agent_started", agent="controller-0", site="c", backend="local", run="run-0")
    r.jobdir.event(WARNING, run="run-0", line=line)  # the run attached to, warned of by its own launcher
    r.attach()
    assert r.wait()["state"] == "done" and ScriptedRun.started == [True]
    assert warned(r) == [("run-0", line), ("run-1", line)]


def test_a_start_that_fails_after_its_controller_started_records_its_warning(runs, tmp_path, monkeypatch):
    """A run whose start fails once its id was given (its controller started, a trainer died starting: `rlctl
    status` shows that run, failed) has its warning recorded all the same, versus none (written after a start that
    returned)."""
    line = "warning: as this rlctl prices the job, on site 't' the trainer's 2 rank(s) …"

    def start(self: ScriptedRun, *, resume: bool = False, checkpoint: int | None = None) -> None:
        self.run_id = "run-1"
        raise LaunchError("trainer-0 exited as it started")

    monkeypatch.setattr(ScriptedRun, "start", start)
    with pytest.raises(LaunchError, match="exited as it started"):
        runs([], auto_resume=0, warnings=[line])
    jd = JobDir(tmp_path / "job")
    assert [(e["run"], e["line"]) for e in jd.read_lines(jd.events) if e["event"] == WARNING] == [("run-1", line)]


def test_a_run_that_completed_no_newer_checkpoint_is_not_resumed_again(runs):
    r, said = runs([(FAILED, [10]), (FAILED, []), ("done", [])], auto_resume=5)
    assert r.wait()["state"] == FAILED  # the second failure is the job's: resuming would loop
    assert ScriptedRun.started == [False, True]
    assert said[-1] == (
        "job demo failed and completed no checkpoint past v10 in this run: not resumed automatically "
        "(it would most likely fail the same way)"
    )


@pytest.mark.parametrize("limit", [None, "the controller's site"])
def test_a_job_json_edit_of_a_field_its_checkpoints_depend_on_stops_the_resumes(runs, limit):
    # seed edited in job.json during the run: `launch --resume` refuses it, and so does the automatic resume (it ran
    # the edited job on the checkpoint), in one line, once: the failure is the job's
    r, said = runs([(FAILED, [10]), ("done", [])], auto_resume=2)
    r.jobdir.write_job(r.spec, source="test")  # the launch's values (`launched`)
    ScriptedRun.limits = [limit]
    data = r.jobdir.read_json(r.jobdir.job_json)
    data["job"]["seed"] = data["job"]["seed"] + 1
    r.jobdir.job_json.write_text(json.dumps(data))
    assert r.wait()["state"] == FAILED
    assert ScriptedRun.started == [False] and r.resumes == 0
    ended = f" {FAILED}" if limit is None else f": time limit reached on {limit}"
    assert said[-1].startswith(f"job demo{ended}; not resumed automatically: "), said[-1]
    assert "job.seed was edited since the launch" in said[-1] and "\n" not in said[-1]
    refused = [e for e in r.jobdir.read_lines(r.jobdir.events) if e["event"] == "auto_resume_refused"]
    assert [e["after"] for e in refused] == [FAILED]


def test_an_automatic_resume_says_the_changes_launch_resume_says(runs, tmp_path):
    # a learning rate edited in job.json during the run (allowed: the resumed run takes it up) and the job file
    # edited since the launch (not taken up): said as `launch --resume` says them, before the run starts; before,
    # an automatic resume said neither
    r, said = runs([(FAILED, [10]), ("done", [])], auto_resume=2)
    source = tmp_path / "demo.yaml"
    source.write_text((ROOT / "jobs" / "demo.yaml").read_text())
    r.jobdir.write_job(r.spec, source=str(source))
    data = r.jobdir.read_json(r.jobdir.job_json)
    data["job"]["algorithm"]["lr"] = 1.0e-4
    r.jobdir.job_json.write_text(json.dumps(data))
    source.write_text(source.read_text().replace("iterations: 300", "iterations: 400"))
    assert r.wait()["state"] == "done"
    assert said[1:3] == [
        f"job demo: {r.jobdir.job_json} was edited since the launch (algorithm): the resume runs the job as edited "
        "there",
        f"job demo: {source} changed since the launch (iterations); the resume runs the job as launched (its "
        f"job.json): to run the changed job, launch it anew (`rlctl launch {source}`)",
    ], said
    assert said[3] == "job demo: resumed from checkpoint v10"


@pytest.mark.parametrize("edited", [False, True], ids=["as-launched", "edited-to-tis"])
def test_an_automatic_resume_says_the_loss_an_older_rlctl_computed_as_launch_resume_does(runs, edited):
    # a job.json naming no rlctl version (an rlctl before 95ff786 launched the job; this launcher resumed it or
    # attached to it), algorithm.off_policy decoupled with an is_cap > 1: `launch --resume` says that the cap's
    # truncation is gone (`older_rlctl_changes`), and so does the automatic resume, before its run starts, versus not
    # a word; job.json edited to the truncation's `tis` (the line's hint) is what the resumed run reads: not said
    r, said = runs([(FAILED, [10]), ("done", [])], auto_resume=2)
    algorithm = r.spec.algorithm.model_copy(update={"off_policy": "decoupled", "is_cap": 1.5})
    r.jobdir.write_job(r.spec.model_copy(update={"algorithm": algorithm}), source="test")
    data = r.jobdir.read_json(r.jobdir.job_json)
    del data["rlctl_version"]
    if edited:
        data["job"]["algorithm"]["off_policy"] = "tis"
    r.jobdir.job_json.write_text(json.dumps(data))
    assert r.wait()["state"] == "done"
    older = [line for line in said if "names no rlctl version" in line]
    assert older == (
        []
        if edited
        else [
            f"job demo: {r.jobdir.job_json} names no rlctl version (launched by an rlctl before 8d7ca57?): there, "
            "algorithm.off_policy 'decoupled' truncated each token's π_prox/μ at is_cap 1.5 (min(π_prox/μ, 1.5), as "
            "'tis' does); now it leaves out a token whose π_prox/μ exceeds 1.5 (weight 0). To resume with the "
            "truncation, set job.algorithm.off_policy to 'tis' in job.json"
        ]
    ), said
    assert said[-1] == "job demo: resumed from checkpoint v10"


def test_resumes_stop_when_none_are_left(runs):
    r, _ = runs([(FAILED, [5]), (FAILED, [10]), (FAILED, [15])], auto_resume=2)
    assert r.wait()["state"] == FAILED
    assert ScriptedRun.started == [False, True, True] and r.left == 0


def test_a_failure_once_the_resumes_are_spent_says_so(runs):
    # the third failure ended the launch with the failure alone, as a job without `auto_resume` does: no word of why
    # this one was not resumed, nor that a `launch --resume` gets its resumes again
    r, said = runs([(FAILED, [5]), (FAILED, [10]), (FAILED, [15])], auto_resume=2)
    assert r.wait()["state"] == FAILED
    assert said[-1] == (
        f"job demo {FAILED}; not resumed automatically: the 2 resume(s) of its checkpoint.auto_resume are spent (why "
        f"its runs fail: {r.jobdir.path}/logs); `rlctl launch --resume j` continues it, with 2 more"
    )


def test_a_failed_run_whose_remains_cannot_be_stopped_is_not_said_to_be_resumed(runs, monkeypatch):
    # it said "resuming it from checkpoint v20 (checkpoint.auto_resume: 1 more left)", wrote an `auto_resume` event
    # and spent a resume, then the stop's LaunchError ended the launch: no resume
    r, said = runs([(FAILED, [10, 20]), ("done", [30])], auto_resume=2)

    def stop(self: ScriptedRun) -> None:
        raise LaunchError("site far: cannot stop rollout-0: ssh: connect to host far: Connection refused")

    monkeypatch.setattr(ScriptedRun, "stop", stop)
    assert r.wait()["state"] == FAILED
    assert ScriptedRun.started == [False] and r.left == 2 and r.resumes == 0
    assert said == [
        f"job demo {FAILED}; not resumed automatically: what is left of its run could not be stopped (site far: "
        "cannot stop rollout-0: ssh: connect to host far: Connection refused); once it is, `rlctl launch --resume j` "
        "continues it"
    ]
    events = [e["event"] for e in r.jobdir.read_lines(r.jobdir.events)]
    assert "auto_resume" not in events and "auto_resume_refused" in events


def test_a_failed_run_is_not_resumed_over_another_run_of_the_job_whose_controller_answers(runs, monkeypatch):
    # a copy of the job dir resumed from another machine (this run's controller did not answer there) stopped this
    # run's agents and started its own on the same sites' job dirs, its controller.json fetched here: the launcher
    # stopped that run's agents (the site's agents.jsonl is its now) and started a second controller over it
    r, said = runs([(FAILED, [10, 20]), ("done", [30])], auto_resume=2)
    r.jobdir.write_json(r.jobdir.controller_json, {"address": "tcp://10.0.0.7:4242", "pid": 7})
    asked: list[str] = []

    class Answers:
        def close(self) -> None:
            pass

    monkeypatch.setattr(
        refusals, "connect_client", lambda jd, *, timeout_s, name: asked.append(str(jd.path)) or Answers()
    )
    assert r.wait()["state"] == FAILED
    assert ScriptedRun.started == [False] and ScriptedRun.stopped == 0 and r.resumes == 0 and r.left == 2
    assert said == [
        f"job demo {FAILED}; not resumed automatically: another run of the job is live: its controller answers at "
        "tcp://10.0.0.7:4242, not this run's (a copy of the job dir resumed elsewhere?); "
        f"`rlctl status {r.jobdir.path}` shows it"
    ]
    refused = [e for e in r.jobdir.read_lines(r.jobdir.events) if e["event"] == "auto_resume_refused"]
    assert len(refused) == 1 and asked == [str(r.jobdir.path)]


def test_a_failed_run_whose_own_controller_is_named_is_resumed_unasked(runs, monkeypatch):
    # this run's controller.json: its address is this run's own, not asked whether it answers (an instant after
    # its end, still closing its listener, it may)
    r, _said = runs([(FAILED, [10, 20]), ("done", [30])], auto_resume=2)
    r.jobdir.write_json(r.jobdir.controller_json, {"address": "tcp://127.0.0.1:1", "pid": 7})
    monkeypatch.setattr(refusals, "connect_client", lambda *_a, **_k: pytest.fail("asked its own controller"))
    assert r.wait()["state"] == "done" and ScriptedRun.started == [False, True]


def test_a_resume_that_starts_over_takes_a_fixed_field_edit_for_the_resumes_after_it(runs):
    # a seed edited in job.json of a job that completed no checkpoint: its resume started over and ran it, but the
    # launch's seed stayed the one the resumes after compared with: once that run checkpointed and failed, it was not
    # resumed ("job.seed was edited since the launch (…); a resume cannot take it", hinting to put back a seed v10 was
    # not written with), nor would `launch --resume` take it
    from rlctl.ops.jobchanges import launch_changes, refuse_fixed_edits

    r, said = runs([(FAILED, [10]), ("done", [])], auto_resume=1)
    r.jobdir.write_job(r.spec, source="test")  # the launch's values (`launched`)
    data = r.jobdir.read_json(r.jobdir.job_json)
    data["job"]["seed"] = data["job"]["seed"] + 1
    r.jobdir.job_json.write_text(json.dumps(data))
    r.start(resume=True)  # `launch --resume`: no checkpoint, it starts over with the edited seed
    assert r.wait()["state"] == "done"
    assert ScriptedRun.started == [False, True, True] and r.resumes == 1
    assert not any("edited" in line for line in said), said
    refuse_fixed_edits(r.jobdir, resumed=10)  # nothing raised
    assert launch_changes(r.jobdir) == []  # said once, as its run started over: not at every resume after


@pytest.mark.parametrize("state", ["stopped", "done"])
def test_a_stopped_or_finished_job_is_not_resumed(runs, state):
    r, said = runs([(state, [10])], auto_resume=3)
    assert r.wait()["state"] == state and ScriptedRun.started == [False] and said == []


def test_without_auto_resume_a_failure_is_the_jobs(runs):
    r, said = runs([(FAILED, [10])], auto_resume=0)
    assert r.wait()["state"] == FAILED and ScriptedRun.started == [False] and said == []


def test_a_controller_gone_without_a_summary_is_resumed_and_otherwise_raised(runs):
    gone = LaunchError("the controller exited with SIGKILL without a summary")
    r, said = runs([(gone, [10]), ("done", [])], auto_resume=1)
    assert r.wait()["state"] == "done" and ScriptedRun.started == [False, True]
    # it said `job demo the controller exited …`: no `failed:` where a summary's state has one
    assert said[0].startswith("job demo failed: the controller exited with SIGKILL without a summary; resuming it from")
    r, _ = runs([(gone, [])], auto_resume=1)
    with pytest.raises(LaunchError, match="without a summary"):
        r.wait()


def test_a_controller_killed_by_rlctl_stop_is_not_resumed(runs):
    """`rlctl stop` kills a controller that did not end within its grace: no summary, and no failure to resume."""
    gone = LaunchError("the controller exited with SIGKILL without a summary")
    r, said = runs([(gone, [10])], auto_resume=1)
    r.jobdir.event(STOP_REQUESTED)
    with pytest.raises(LaunchError, match="without a summary"):
        r.wait()
    assert ScriptedRun.started == [False] and said == []


TERM = "failed: controller got SIGTERM"
LIMIT = "site train (controller-0: SLURM job 12 ran 0:01:31 of its 0:02:00 limit)"


def test_a_time_limit_resumes_without_spending_auto_resume(runs):
    """A SLURM time limit is a planned, recurring end (a week under a 24 h limit: 6 of them): each one that completed
    a newer checkpoint is resumed and spends no resume; before, each spent one (`auto_resume: 7` for that week)."""
    ScriptedRun.limits = [LIMIT, LIMIT, LIMIT, None]
    r, said = runs([(TERM, [5]), (TERM, [10]), (TERM, [15]), (FAILED, [20]), ("done", [25])], auto_resume=1)
    s = r.wait()
    assert s["state"] == "done" and s["auto_resumes"] == 4 and r.left == 0
    assert ScriptedRun.started == [False, True, True, True, True]
    assert said[0] == (
        f"job demo: time limit reached on {LIMIT}; resuming it from checkpoint v5 "
        "(a time limit spends no checkpoint.auto_resume: 1 left)"
    )
    assert said[6] == f"job demo {FAILED}; resuming it from checkpoint v20 (checkpoint.auto_resume: 0 more left)"
    auto = [e for e in r.jobdir.read_lines(r.jobdir.events) if e["event"] == "auto_resume"]
    assert [(e["version"], e["left"], e["time_limit"]) for e in auto] == [
        (5, 1, LIMIT),
        (10, 1, LIMIT),
        (15, 1, LIMIT),
        (20, 0, None),
    ]


def test_a_time_limit_with_no_newer_checkpoint_or_no_auto_resume_is_not_resumed(runs):
    ScriptedRun.limits = [LIMIT, LIMIT]
    r, said = runs([(TERM, [5]), (TERM, [])], auto_resume=3)
    assert r.wait()["state"] == TERM and ScriptedRun.started == [False, True]
    assert said[-1] == (
        f"job demo: time limit reached on {LIMIT} before the run completed a checkpoint past v5: not resumed "
        "automatically (it would end the same way; checkpoint more often than the site's "
        "scheduler.time_limit_min, or raise it)"
    )
    ScriptedRun.limits, ScriptedRun.started = [LIMIT], []
    r, said = runs([(TERM, [5])], auto_resume=0)
    assert r.wait()["state"] == TERM and ScriptedRun.started == [False]
    assert said[-1:] == [
        f"job demo: time limit reached on {LIMIT}; not resumed automatically (checkpoint.auto_resume is 0): "
        "continue it with `rlctl launch --resume j`"
    ]


def test_checkpoints_of_earlier_runs_do_not_count(tmp_path):
    jd = JobDir.create("j", explicit=tmp_path / "job")
    jd.append(jd.events, {"t": time.time() - 100, "event": "checkpoint", "version": 40})
    since = time.time() - 1
    assert autoresume.newest_checkpoint(jd, since=since) is None
    jd.event("checkpoint", version=30)
    jd.event("resumed", version=30)
    assert autoresume.newest_checkpoint(jd, since=since) == 30


def test_a_checkpoint_event_without_a_number_for_its_version_names_none(tmp_path):
    # int(e["version"]) of an edited event's null: a TypeError traceback as the launcher resumed the job
    jd = JobDir.create("j", explicit=tmp_path / "job")
    jd.event("checkpoint", version=None)
    assert autoresume.newest_checkpoint(jd, since=0.0) is None
    jd.event("checkpoint", version=20)
    jd.event("checkpoint", version="x")
    assert autoresume.newest_checkpoint(jd, since=0.0) == 20


def test_the_summary_times_this_launcher_across_its_resumes(runs, monkeypatch):
    # the launch table's `wall` was the last run's alone (59.1 s of a job that ran 81 s with one resume)
    monkeypatch.setattr(ScriptedRun, "wait", lambda self, **_: _scripted(self) | {"wall_s": 59.1})
    r, _ = runs([(FAILED, [10]), ("done", [])], auto_resume=2)
    r._t0 = time.monotonic() - 81.0  # the launcher began 81 s ago
    s = r.wait()
    assert (s["state"], s["run_wall_s"], s["auto_resumes"]) == ("done", 59.1, 1) and s["wall_s"] >= 81.0


_scripted = ScriptedRun.wait


@pytest.mark.parametrize(("ended", "state"), [(ValueError("bad row 3"), "failed"), (KeyboardInterrupt(), "stopped")])
def test_a_launch_that_ends_while_it_prepares_leaves_no_launching_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ended: BaseException, state: str
) -> None:
    """The job enters the index as it starts to prepare (an SFT warm-up, a dataset's tokenizing): a launch that
    ended there (an error, Ctrl-C) left its row `launching` with no launcher, which `list` and `status` showed."""
    from rlctl.ops.jobdb import JobDB

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    spec = load_job(ROOT / "jobs" / "demo.yaml").spec
    jd = JobDir.create("j", explicit=tmp_path / "job")
    db = JobDB()
    try:
        runs = autoresume.Runs(jd, spec, {}, db=db, say=lambda _: None)
        runs.preparing(source="demo.yaml")
        assert db.get("job").state == "launching"
        with pytest.raises(type(ended)):
            try:
                raise ended
            finally:
                runs.stop()  # as be_launcher's `finally`
        assert db.get("job").state == state
    finally:
        db.close()


def test_a_preparing_launch_enters_the_index_with_its_launcher_in_one_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rlctl status --all` as a launch began preparing showed its row without a launcher or job file: put, then
    updated."""
    from rlctl.ops.jobdb import JobDB

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("j", explicit=tmp_path / "job")
    db = JobDB()
    seen = []
    put = db.put

    def watched(*args, **kwargs):
        put(*args, **kwargs)
        seen.append(db.get("job").info)  # what another terminal reads now

    monkeypatch.setattr(db, "put", watched)
    try:
        autoresume.Runs(jd, load_job(ROOT / "jobs" / "demo.yaml").spec, {}, db=db, say=lambda _: None).preparing(
            source="demo.yaml"
        )
        assert [(i.get("source"), "launcher" in i) for i in seen] == [("demo.yaml", True)]
    finally:
        db.close()


def test_a_runs_time_limit_is_asked_of_its_controller_and_trainer_rank_0():
    """`JobRun.time_limit` asks the controller's and the first trainer rank's scheduler (the trainer's ranks are one
    SLURM job); rollout units end at no limit that ends the run, and a site that cannot answer is passed over."""
    from rlctl.launch.base import AgentHandle, AgentSpec
    from rlctl.ops.run import JobRun

    asked: list[str] = []

    class Backend:
        def __init__(self, said: str | LaunchError | None) -> None:
            self.said = said

        def at_time_limit(self, h: AgentHandle) -> str | None:
            asked.append(h.spec.name)
            if isinstance(self.said, LaunchError):
                raise self.said
            return self.said

    def run(said: dict[str, str | LaunchError | None]) -> str | None:
        r = JobRun.__new__(JobRun)
        agents = [("controller", 0, "ctl"), ("trainer", 0, "train"), ("trainer", 1, "train"), ("rollout", 0, "gen")]
        r.handles = [AgentHandle(AgentSpec(role, i, site, []), {}, "slurm") for role, i, site in agents]
        r.backends = type("B", (), {"for_site": lambda _, site: Backend(said[site])})()
        asked.clear()
        return r.time_limit()

    ends = {"ctl": None, "train": "SLURM job 7 ran 23:59:40 of its 24:00:00 limit", "gen": "never asked"}
    assert run(ends) == "site train (trainer-0: SLURM job 7 ran 23:59:40 of its 24:00:00 limit)"
    assert asked == ["controller-0", "trainer-0"]
    assert run(ends | {"ctl": LaunchError("squeue: cannot reach the login node")}) == run(ends)
    assert run(ends | {"train": None}) is None and asked == ["controller-0", "trainer-0"]


def test_a_run_whose_slurm_site_reservation_ended_is_not_resumed(runs, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its reservation ended during the run (SLURM purges it): the automatic resume was spent on a run whose every
    sbatch was refused after the staging; now one line naming the field, as `launch --resume` refuses it."""
    from rlctl.config.inventory import Site
    from rlctl.launch.backends import write_sites
    from rlctl.launch.remote import CommandResult
    from rlctl.launch.slurm import SlurmBackend

    class SubmitHost:
        def run(self, command: str, *, timeout_s: float) -> CommandResult:
            if command.startswith("sinfo"):
                return CommandResult(0, "g-01|(null)\n", "")
            return CommandResult(0, "rlctl-user=rl\nrlctl-groups=rl\nNo reservations in the system\n", "")

        def close(self) -> None:
            pass

    monkeypatch.setattr(SlurmBackend, "site_runner", classmethod(lambda cls, s, h=None: SubmitHost()))
    site = Site.model_validate(
        {
            "datacenter": "d",
            "gpu": "CPU",
            "scheduler": {"kind": "slurm", "partition": "gpu", "reservation": "rl-week"},
            "nodes": [{"host": "g-01", "gpus": 4}],
        }
    )
    plan = {"trainer": {"site": "s", "ranks": 1}, "controller_site": "s", "rollout": [{"site": "s", "units": 1}]}
    r, said = runs([(FAILED, [10]), ("done", [])], auto_resume=2)
    r.plan = plan
    write_sites(r.jobdir.path, {"s": site})
    assert r.wait()["state"] == FAILED
    assert ScriptedRun.started == [False] and r.resumes == 0
    assert said[-1].startswith(
        f"job demo {FAILED}; not resumed automatically: {r.jobdir.path / 'sites.json'}: "
        "sites.s.scheduler.reservation: 'rl-week': no such reservation"
    ), said[-1]
    refused = [e for e in r.jobdir.read_lines(r.jobdir.events) if e["event"] == "auto_resume_refused"]
    assert [e["after"] for e in refused] == [FAILED]
