"""A resume of a job whose job.json was edited since the launch checks the job as edited the way `rlctl check` checks
a job file (`rlctl.ops.resumecheck.edit_problems`): a value a job file is refused for, in a field edited since, is
refused in one line naming job.json and the field, exit 2, before anything starts or is written, and an automatic
resume ends the run with that line. Before, job.json was read with a job's record's leniency (`RECORDED`) and the edit
ran: `decoupled` at is_cap 0.8 as `tis`, a clip_eps of 1.5, 4 transport streams. A field not edited since resumes
as launched, whatever this rlctl's check says of it."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rlctl.launch.jobdir import JOB_LAUNCHED, MEMORY_FIELDS, JobDir, job_digests
from tests.conftest import run_cli
from tests.unit.ops.test_resume_point import split_job

EDITS = [
    pytest.param(
        "algorithm",
        {"off_policy": "decoupled", "is_cap": 0.8},
        "job.algorithm: is_cap 0.8: off_policy 'decoupled' leaves out each token whose π_prox/μ exceeds is_cap",
        id="decoupled-cap-under-1",
    ),
    pytest.param(
        "algorithm",
        {"clip_eps": 1.5},
        "job.algorithm.clip_eps: 1.5: the ratio's lower clip 1 − clip_eps would be -0.5",
        id="clip-eps",
    ),
    pytest.param("transport", {"streams": 4}, "job.transport.streams: 4: a job's connections are one", id="streams"),
    pytest.param(
        "rollout",
        {"on_new_weights": "recompute"},
        "job.rollout.on_new_weights: 'recompute': the embedded engine keeps its running rows' K/V",
        id="recompute-embedded",
    ),
    pytest.param(
        "evaluation",
        {"every_iterations": 5},
        "job.evaluation.every_iterations: read only when evaluation.heldout_prompts > 0",
        id="evaluation-without-heldout",
    ),
    # `load_job`'s own checks (`cross_field_errors`), against the sites as launched (sites.json: c, and t of 2 GPUs);
    # an unknown site was a KeyError traceback, the others ran
    pytest.param(
        "placement",
        {"trainer": {"site": "tt", "gpus": 2}},
        "job.placement.trainer.site: unknown site 'tt'; known: c, t",
        id="unknown-trainer-site",
    ),
    pytest.param(
        "placement",
        {"trainer": {"site": "t", "gpus": 64}},
        "job.placement.trainer.gpus: 64 GPUs asked but site 't' has 2",
        id="more-gpus-than-the-site",
    ),
    pytest.param(
        "placement",
        {"controller_site": "nosuch"},
        "job.placement.controller_site: unknown site 'nosuch'; known: c, t",
        id="unknown-controller-site",
    ),
    pytest.param(
        "placement",
        {"rollout": [{"site": "c", "gpus": 1}, {"site": "c", "gpus": 1}]},
        "job.placement.rollout: each rollout site may appear once",
        id="rollout-site-twice",
    ),
]


def edit(jd: JobDir, field: str, value: dict[str, Any], *, as_launched: bool = False) -> None:
    """job.json's `field` updated with `value`; `as_launched`: its digests and its record of the job as launched
    (`job_launched`) made those of the job as it is (launched so, by an rlctl whose check took it)."""
    data = json.loads(jd.job_json.read_text())
    data["job"][field] = {**data["job"].get(field, {}), **value}
    if as_launched:
        data["job_sha256"] = job_digests(data["job"])
        data[JOB_LAUNCHED] = json.loads(json.dumps(data["job"]))
    jd.job_json.write_text(json.dumps(data))


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    """The plans the resume's run started with (its launcher stood in for, as test_resume_edit_memory's do)."""
    from rlctl.commands.launching import resume as resume_mod

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    runs: list[dict[str, Any]] = []

    def be_launcher(jd_: JobDir, spec_: Any, plan: dict[str, Any], db: Any, begin: Any, *a: Any, **k: Any) -> None:
        begin(SimpleNamespace(start=lambda **kw: runs.append(plan) or "run", run=None), lambda _: None)

    monkeypatch.setattr(resume_mod, "be_launcher", be_launcher)
    return runs


def refused_resume(jd: JobDir, started: list[dict[str, Any]], *argv: str) -> str:
    """`rlctl launch --resume JD ARGV…` refused: exit 2, its one line on stderr (returned), no run started, job.json
    and plan.json as they were (nothing written: not an --iterations count either)."""
    before = {p: p.read_bytes() for p in (jd.job_json, jd.plan_json)}
    r = run_cli("launch", "--resume", str(jd.path), *argv)
    assert r.exit_code == 2, r.stderr
    (line,) = r.stderr.splitlines()
    assert started == []
    assert {p: p.read_bytes() for p in before} == before
    return line


@pytest.mark.parametrize(("field", "value", "said"), EDITS)
def test_a_resume_of_an_edit_a_job_file_is_refused_for_is_refused_in_one_line_before_anything_starts(
    tmp_path: Path, started: list[dict[str, Any]], field: str, value: dict[str, Any], said: str
) -> None:
    jd = split_job(tmp_path)
    edit(jd, field, value)
    line = refused_resume(jd, started, "--iterations", "12")
    assert line.startswith(f"rlctl: error: {jd.job_json}: {said}"), line
    assert "(edited since the launch; `rlctl check` refuses it in a job file)" in line, line
    assert line.endswith("or undo the edit (job.json's `job` section))"), line


@pytest.mark.parametrize("other_edit", [False, True], ids=["nothing-edited", "another-field-edited"])
def test_a_field_this_rlctl_refuses_that_was_not_edited_since_the_launch_still_resumes(
    tmp_path: Path, started: list[dict[str, Any]], other_edit: bool
) -> None:
    """clip_eps 1.5 and 4 transport streams as launched (job.json's digests those of the job as it is: an rlctl whose
    check took them): the resume runs them as launched, with job.json untouched or edited in another field (a lower
    checkpoint.keep): a check added since is no reason to stop a job's resume."""
    jd = split_job(tmp_path)
    edit(jd, "algorithm", {"clip_eps": 1.5}, as_launched=True)
    edit(jd, "transport", {"streams": 4}, as_launched=True)
    if other_edit:
        edit(jd, "checkpoint", {"keep": 1})
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 0, r.stderr
    assert len(started) == 1


def test_an_edit_beside_a_field_this_rlctl_refuses_as_launched_is_still_checked(
    tmp_path: Path, started: list[dict[str, Any]]
) -> None:
    """clip_eps 1.5 as launched (not judged) and transport.streams edited to 4: the edit is refused, versus let
    through because the job as a whole does not validate as a job file."""
    jd = split_job(tmp_path)
    edit(jd, "algorithm", {"clip_eps": 1.5}, as_launched=True)
    edit(jd, "transport", {"streams": 4})
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 2, r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"rlctl: error: {jd.job_json}: job.transport.streams: 4: "), line
    assert started == []


def test_a_staleness_past_the_iterations_is_refused_against_the_count_the_resume_runs(
    tmp_path: Path, started: list[dict[str, Any]]
) -> None:
    """pipeline.staleness edited to 20 (the job's 9 iterations): refused as `load_job` refuses it in a job file; with
    `--iterations 30` the resume's count bounds it (resumed); the count edited in job.json to 5 under a staleness of
    6 as launched: refused too (the bound reads both fields). Before, each ran."""
    jd = split_job(tmp_path)
    edit(jd, "pipeline", {"staleness": 20})
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 2, r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"rlctl: error: {jd.job_json}: job.pipeline.staleness: 20 is more than the job's 9 "), line
    assert started == []
    r = run_cli("launch", "--resume", str(jd.path), "--iterations", "30")
    assert r.exit_code == 0, r.stderr
    assert len(started) == 1
    jd = split_job(tmp_path / "again")
    edit(jd, "pipeline", {"staleness": 6}, as_launched=True)
    data = json.loads(jd.job_json.read_text())
    data["job"]["iterations"] = 5
    jd.job_json.write_text(json.dumps(data))
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 2, r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"rlctl: error: {jd.job_json}: job.pipeline.staleness: 6 is more than the job's 5 "), line
    assert len(started) == 1


def launched_by_an_older_rlctl(jd: JobDir) -> None:
    """job.json's launch record as an rlctl before the whole job was kept wrote it: `MEMORY_FIELDS` alone."""
    data = json.loads(jd.job_json.read_text())
    data[JOB_LAUNCHED] = {name: data[JOB_LAUNCHED][name] for name in MEMORY_FIELDS}
    jd.job_json.write_text(json.dumps(data))


def staleness_past_the_rounds_ahead(jd: JobDir, *, prompts_per_iteration: int) -> None:
    """job.json launched async at staleness 8 with 128 samples a prompt: 8 rounds past 262,144 samples ahead (the
    rounds-ahead bound) at 512 prompts, within it at 16."""
    edit(jd, "pipeline", {"mode": "async", "staleness": 8}, as_launched=True)
    edit(jd, "batch", {"prompts_per_iteration": prompts_per_iteration, "samples_per_prompt": 128}, as_launched=True)
    data = json.loads(jd.job_json.read_text())
    data["launched"]["batch.samples_per_prompt"] = 128  # (as the launch kept it: a field its checkpoints depend on)
    jd.job_json.write_text(json.dumps(data))


@pytest.mark.parametrize("older", [False, True], ids=["launch-record-whole", "launch-record-of-memory-fields"])
def test_a_micro_batch_cut_under_a_staleness_past_the_rounds_ahead_as_launched_resumes(
    tmp_path: Path, started: list[dict[str, Any]], older: bool
) -> None:
    """A job launched (by an older rlctl) async at staleness 8 over 512 prompts × 128 samples, past the rounds-ahead
    bound this rlctl's `load_job` refuses; its only edit `batch.train_micro_batch_samples: 2` (an out-of-memory fix):
    the resume runs, versus refused with `job.pipeline.staleness: 8: …` (the bound judged whenever any of `batch`
    was edited, the problem the launch had said as the edit's). An edit that brings the bound's problem in (the
    prompts raised from 16 to 512) is still refused."""
    jd = split_job(tmp_path)
    staleness_past_the_rounds_ahead(jd, prompts_per_iteration=512)
    if older:
        launched_by_an_older_rlctl(jd)
    edit(jd, "batch", {"train_micro_batch_samples": 2})
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 0, r.stderr
    assert len(started) == 1
    jd = split_job(tmp_path / "raised")
    staleness_past_the_rounds_ahead(jd, prompts_per_iteration=16)
    if older:
        launched_by_an_older_rlctl(jd)
    edit(jd, "batch", {"prompts_per_iteration": 512})
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 2, r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"rlctl: error: {jd.job_json}: job.pipeline.staleness: 8: the controller creates "), line
    how = (
        "read with `batch`, a section edited since the launch"
        if older
        else "read with `batch.prompts_per_iteration`, edited since the launch"
    )
    assert f"({how}; `rlctl check` refuses it in a job file)" in line, line
    assert len(started) == 1


def test_an_edit_of_one_leaf_leaves_its_sections_others_as_launched_unjudged(
    tmp_path: Path, started: list[dict[str, Any]]
) -> None:
    """clip_eps 1.5 as launched and `algorithm.lr` edited: the resume runs, versus refused with `job.algorithm.
    clip_eps: 1.5: … (edited since the launch; …)`, a field not edited (job.json kept the whole job as launched:
    its leaves edited are known)."""
    jd = split_job(tmp_path)
    edit(jd, "algorithm", {"clip_eps": 1.5}, as_launched=True)
    edit(jd, "algorithm", {"lr": 5e-7})
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 0, r.stderr
    assert len(started) == 1


def test_a_job_json_without_the_whole_launch_record_says_the_section_edited_not_the_field(
    tmp_path: Path, started: list[dict[str, Any]]
) -> None:
    """A job.json an rlctl before the whole launch record wrote, its transport launched with 4 streams and its
    timeout edited: the streams' problem is refused (nothing tells the leaf edited, nor the job as launched outside
    `MEMORY_FIELDS`), said as in a section edited since the launch, versus as the field edited since."""
    jd = split_job(tmp_path)
    edit(jd, "transport", {"streams": 4}, as_launched=True)
    launched_by_an_older_rlctl(jd)
    edit(jd, "transport", {"timeout_s": 60.0})
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 2, r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"rlctl: error: {jd.job_json}: job.transport.streams: 4: "), line
    assert "(in `transport`, a section edited since the launch; `rlctl check` refuses it in a job file)" in line, line
    assert started == []


def test_grpo_edited_in_over_a_group_of_one_is_refused_naming_the_bound(
    tmp_path: Path, started: list[dict[str, Any]]
) -> None:
    """A PPO job launched with 1 sample a prompt, algorithm.kind edited to grpo: refused as `load_job` refuses GRPO's
    group of 1 (batch.samples_per_prompt, the bound's field, though algorithm was the edit), versus resumed to train
    nothing (a group of 1 has advantage 0)."""
    jd = split_job(tmp_path, algorithm="ppo")
    edit(jd, "batch", {"samples_per_prompt": 1}, as_launched=True)
    data = json.loads(jd.job_json.read_text())
    data["launched"]["batch.samples_per_prompt"] = 1  # (as the launch kept it: a field its checkpoints depend on)
    data["job"]["algorithm"] = {"kind": "grpo"}  # (PPO's keys out with it)
    jd.job_json.write_text(json.dumps(data))
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 2, r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"rlctl: error: {jd.job_json}: job.batch.samples_per_prompt: GRPO's advantage "), line
    assert started == []


@pytest.mark.parametrize("edited", ["rollout", "checkpoint"])
def test_a_warning_of_a_field_not_edited_since_the_launch_is_not_said_again(
    tmp_path: Path, started: list[dict[str, Any]], edited: str, caplog: pytest.LogCaptureFixture
) -> None:
    """checkpoint.auto_resume 1 with every_iterations 9 (the job's 9 iterations: no checkpoint to resume from, a
    warning) as launched; rollout.on_new_weights edited: the resume says no warning of checkpoint, versus
    `warn_past_the_end`'s said again on every resume after any edit; checkpoint.keep edited: it is said."""
    jd = split_job(tmp_path)
    edit(jd, "checkpoint", {"auto_resume": 1, "every_iterations": 9}, as_launched=True)
    edit(jd, *(("rollout", {"on_new_weights": "keep"}) if edited == "rollout" else ("checkpoint", {"keep": 1})))
    with caplog.at_level(logging.WARNING):
        r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 0, r.stderr
    assert len(started) == 1
    assert ("checkpoint.auto_resume: 1 resumes a failed run" in caplog.text) == (edited == "checkpoint"), caplog.text


def auto_resumed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[JobDir, Any, list[str]]:
    """A job of one automatic resume started, its first run to fail and the second to end done (`ScriptedRun`): its
    job dir, its runs (`autoresume.Runs`, started) and the lines they say."""
    from rlctl.ops import autoresume
    from tests.unit.ops.test_autoresume import FAILED, ScriptedRun

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(autoresume, "JobRun", ScriptedRun)
    ScriptedRun.started, ScriptedRun.stopped, ScriptedRun.limits = [], 0, []
    ScriptedRun.script = [(FAILED, [10]), ("done", [])]
    jd = split_job(tmp_path)
    spec = jd.read_job()
    spec = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"auto_resume": 1})})
    said: list[str] = []
    r = autoresume.Runs(jd, spec, jd.read_plan(), db=None, say=said.append)
    r.start()
    return jd, r, said


def test_an_automatic_resume_after_such_an_edit_ends_the_run_with_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """algorithm.clip_eps edited to 1.5 during the run: not resumed automatically, the run's failure the job's, said
    in one line naming job.json and the field, with an `auto_resume_refused` event; versus resumed on it."""
    from tests.unit.ops.test_autoresume import FAILED, ScriptedRun

    jd, r, said = auto_resumed(tmp_path, monkeypatch)
    edit(jd, "algorithm", {"clip_eps": 1.5})
    assert r.wait()["state"] == FAILED and ScriptedRun.started == [False] and r.resumes == 0
    assert said[-1].startswith(
        f"job resume {FAILED}; not resumed automatically: {jd.job_json}: job.algorithm.clip_eps: 1.5: the ratio's "
        "lower clip"
    ), said[-1]
    assert "\n" not in said[-1]
    refused = [e for e in jd.read_lines(jd.events) if e["event"] == "auto_resume_refused"]
    assert [e["after"] for e in refused] == [FAILED]


def test_an_automatic_resume_refused_for_several_edits_says_each_ones_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rollout.on_new_weights edited to recompute (the embedded engine) and transport.streams to 4 during the run: the
    refusal's one line says each problem with its own hint, versus both problems and then the first's hint alone (the
    streams' fix unsaid)."""
    from tests.unit.ops.test_autoresume import FAILED, ScriptedRun

    jd, r, said = auto_resumed(tmp_path, monkeypatch)
    edit(jd, "rollout", {"on_new_weights": "recompute"})
    edit(jd, "transport", {"streams": 4})
    assert r.wait()["state"] == FAILED and ScriptedRun.started == [False]
    line = said[-1]
    assert "\n" not in line
    recompute, streams = line.split("; job.transport.streams: ")
    assert recompute.startswith(
        f"job resume {FAILED}; not resumed automatically: {jd.job_json}: job.rollout.on_new_weights: 'recompute': "
    ), recompute
    assert "(hint: edit job.rollout.on_new_weights in job.json to a valid value" in recompute, recompute
    assert recompute.endswith("or undo the edit (job.json's `job` section))"), recompute
    assert streams.startswith("4: a job's connections are one"), streams
    assert "(hint: edit job.transport.streams in job.json to a valid value" in streams, streams
    assert streams.endswith("or undo the edit (job.json's `job` section))"), streams


def hf_demo_launched(tmp_path: Path, *, heldout: int = 0) -> JobDir:
    """The hf-demo job on the windowed Mistral (a window of 96 tokens, the job's context exactly), launched (its
    inputs prepared: the reward copied into the job dir, which job.json names it in, the data tokenized into data/);
    `heldout`: evaluation.heldout_prompts, of held.jsonl (a copy of the data file, tokenized into data-heldout/)."""
    import yaml

    from bench.gpu_check import hf_demo_builder
    from rlctl.config import load_job
    from rlctl.ops.counts import plan_counts
    from rlctl.ops.jobprep import prepare
    from tests.unit.ops.test_preflight_hf_demo import hf_demo_job

    hf_demo_builder().build(tmp_path, rows=8, sft_steps=0, shape="tiny-mistral-window")
    path = hf_demo_job(tmp_path)
    if heldout:
        (tmp_path / "held.jsonl").write_bytes((tmp_path / "data.jsonl").read_bytes())
        mapping = yaml.safe_load(path.read_text())
        mapping["evaluation"] = {"heldout_prompts": heldout, "path": "held.jsonl"}
        path.write_text(yaml.safe_dump(mapping))
    job = load_job(path)
    plan = plan_counts(job, job.spec)
    jd = JobDir.create("hf-demo", explicit=tmp_path / "run")
    prepare(jd, job.spec, plan, source=str(job.path), job=job)
    return jd


def test_a_dataset_jobs_edited_task_is_checked_on_the_files_the_launch_read(tmp_path: Path) -> None:
    """The hf-demo job launched: task.max_output_tokens edited to 65 in job.json is refused as `rlctl check` refuses
    it in a job file (past the window); edited to 60, the task's data file (relative to the job file), its reward (the
    job dir's copy) and the model (the job dir's) read as the launch read them: nothing refused."""
    from rlctl.ops.jobchanges import edited_fields
    from rlctl.ops.resumecheck import edit_problems

    jd = hf_demo_launched(tmp_path)
    assert json.loads(jd.job_json.read_text())["job"]["task"]["reward"] == "reward/reward.py:compute_score"
    edit(jd, "task", {"max_output_tokens": 65})
    (p,) = edit_problems(jd, jd.read_plan(), edited=edited_fields(jd))
    assert p.field == "job.task.max_output_tokens" and "sliding_window 96 binds" in p.message, p
    edit(jd, "task", {"max_output_tokens": 60})
    assert edited_fields(jd) == ["task"]
    assert edit_problems(jd, jd.read_plan(), edited=["task"]) == []


def test_a_dataset_jobs_data_is_read_again_only_where_a_field_it_depends_on_was_edited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hf-demo job launched, checkpoint.keep edited: its data file is not read (tokenized) again by the resume's
    check, versus read on every resume after any edit; task.max_output_tokens edited: it is, once."""
    from rlctl.ops import preflight
    from rlctl.ops.jobchanges import edited_fields
    from rlctl.ops.resumecheck import edit_problems

    jd = hf_demo_launched(tmp_path)
    read: list[str] = []
    check_task = preflight.check_task
    monkeypatch.setattr(preflight, "check_task", lambda task, **kw: read.append(task.path) or check_task(task, **kw))
    edit(jd, "checkpoint", {"keep": 1})
    assert edit_problems(jd, jd.read_plan(), edited=edited_fields(jd)) == []
    assert read == []
    edit(jd, "task", {"max_output_tokens": 60})
    assert edited_fields(jd) == ["checkpoint", "task"]
    assert edit_problems(jd, jd.read_plan(), edited=edited_fields(jd)) == []
    assert len(read) == 1 and read[0].endswith("data.jsonl"), read


def test_a_dataset_jobs_edit_is_checked_on_the_job_dirs_copy_of_a_data_file_moved_since_the_launch(
    tmp_path: Path,
) -> None:
    """The hf-demo job launched with 2 held-out prompts, then its data and held-out files moved away: task.
    max_output_tokens edited to 60 and evaluation.heldout_prompts to 8 are checked on the job dir's tokenized copies
    (data/, data-heldout/: what the run reads), nothing refused, versus refused as no such file; 9 held-out prompts
    are refused as more than the copy's 8 rows, and max_output_tokens 65 as past the window still."""
    from rlctl.ops.jobchanges import edited_fields
    from rlctl.ops.resumecheck import edit_problems

    jd = hf_demo_launched(tmp_path, heldout=2)
    (tmp_path / "moved").mkdir()
    for name in ("data.jsonl", "held.jsonl"):
        (tmp_path / name).rename(tmp_path / "moved" / name)
    edit(jd, "task", {"max_output_tokens": 60})
    edit(jd, "evaluation", {"heldout_prompts": 8})
    assert edited_fields(jd) == ["evaluation", "task"]
    assert edit_problems(jd, jd.read_plan(), edited=edited_fields(jd)) == []
    edit(jd, "evaluation", {"heldout_prompts": 9})
    (p,) = edit_problems(jd, jd.read_plan(), edited=edited_fields(jd))
    assert p.field == "job.evaluation.heldout_prompts", p
    assert p.message.startswith(f"9 asked, but {jd.path / 'data-heldout'} has 8 usable rows; use ≤ 8"), p
    edit(jd, "evaluation", {"heldout_prompts": 2})
    edit(jd, "task", {"max_output_tokens": 65})
    (p,) = edit_problems(jd, jd.read_plan(), edited=edited_fields(jd))
    assert p.field == "job.task.max_output_tokens" and "sliding_window 96 binds" in p.message, p


def test_an_edit_whose_problem_is_said_of_another_field_of_its_section_is_refused(
    tmp_path: Path, started: list[dict[str, Any]]
) -> None:
    """trainer.backend edited from megatron to torch under the launch's tensor_parallel 2: the check of the backend
    says its problem of trainer.tensor_parallel, not edited: refused, said as in `trainer`, a section edited since the
    launch, versus run (the problem judged by the leaves edited alone)."""
    jd = split_job(tmp_path)
    edit(jd, "trainer", {"backend": "torch"})
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 2, r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"rlctl: error: {jd.job_json}: job.trainer.tensor_parallel: 2: "), line
    assert "(in `trainer`, a section edited since the launch; `rlctl check` refuses it in a job file)" in line, line
    assert started == []


def test_an_edit_made_in_the_launch_record_too_is_still_checked(tmp_path: Path, started: list[dict[str, Any]]) -> None:
    """clip_eps 1.5 written in job.json's job and in its record of the job as launched (`job_launched`) alike, its
    digests as launched: no leaf differs, but the section's digest says it was edited: refused, versus run."""
    jd = split_job(tmp_path)
    data = json.loads(jd.job_json.read_text())
    for job in (data["job"], data[JOB_LAUNCHED]):
        job["algorithm"]["clip_eps"] = 1.5
    jd.job_json.write_text(json.dumps(data))
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 2, r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"rlctl: error: {jd.job_json}: job.algorithm.clip_eps: 1.5: "), line
    assert "(in `algorithm`, a section edited since the launch;" in line, line
    assert started == []
