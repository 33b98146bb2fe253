"""`launch --resume` of a job whose job.json was edited since the launch in what a trainer rank's memory is priced on
(its micro-batch budgets, task rows, activation checkpointing): the plan's split is judged again with
the job as edited (`preflight.memory.trainer_memory_refusal`, as `rlctl check` and `--trainer-split` judge one) and
refused in one line where a rank no longer fits; before, it ran unchecked on the launch's pricing of the cuts."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rlctl.errors import UsageError
from rlctl.launch.jobdir import JobDir
from tests.conftest import run_cli
from tests.unit.ops.test_resume_point import split_job


def edit_batch(jd: JobDir, **batch: Any) -> None:
    data = json.loads(jd.job_json.read_text())
    data["job"]["batch"] = {**data["job"].get("batch", {}), **batch}
    jd.job_json.write_text(json.dumps(data))


@pytest.fixture
def said() -> list[str]:
    """The lines the resume's launcher said as its run started (`started`)."""
    return []


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch, said: list[str]) -> list[dict[str, Any]]:
    """The plans the resume's run started with (its launcher stood in for, as test_resume_point's split tests do)."""
    from rlctl.commands.launching import resume as resume_mod

    runs: list[dict[str, Any]] = []

    def be_launcher(jd_: JobDir, spec_: Any, plan: dict[str, Any], db: Any, begin: Any, *a: Any, **k: Any) -> None:
        begin(SimpleNamespace(start=lambda **kw: runs.append(plan) or "run", run=None), said.append)

    monkeypatch.setattr(resume_mod, "be_launcher", be_launcher)
    return runs


def test_a_resume_whose_edited_cut_no_longer_fits_the_plans_split_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, started: list[dict[str, Any]]
) -> None:
    """A megatron 7B trainer launched at tp 2 on H100s with a rank's cut of 512 tokens (62 GB a rank, and 4.7 GB of
    activations): job.json edited to 32,768 tokens a rank is refused with the figures (each 7B rank's share of such
    a cut: tens of GB of layers and the full fp32 logits); an edit that still fits (1,024) resumes."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = split_job(tmp_path, gpus=4, model={"kind": "builtin", "name": "qwen2.5-7b"}, gpu="H100", cut_tokens=512)
    edit_batch(jd, train_micro_batch_tokens=32768, train_micro_batch_samples=64)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 2, r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith(
        f"rlctl: error: {jd.job_json} was edited since the launch (batch), which raised a rank's need from "
    ), line
    figures = re.search(r"need from ([\d.]+) to ([\d.]+) GB, past ([\d.]+) GB usable: ", line)
    assert figures is not None, line
    before_gb, after_gb, usable_gb = map(float, figures.groups())
    assert before_gb <= 72.0 < after_gb and usable_gb == 72.0, line  # 90% of an H100's 80 GB
    assert f"with the job as edited the trainer's 2 rank(s) at tp 2 pp 1 dp 1 need {after_gb:.1f} GB each" in line
    assert "activations of a cut's " in line and "and a H100 holds 80 GB (90% usable)" in line, line
    assert line.endswith("(hint: undo the edit, or resume at a split that fits it: --trainer-split tp=T,pp=P,dp=D)")
    assert started == []
    edit_batch(jd, train_micro_batch_tokens=1024, train_micro_batch_samples=2)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 0, r.stderr
    assert [p["trainer"]["parallel"] for p in started] == [{"tp": 2, "pp": 1, "dp": 1}]


def test_an_edit_of_fields_a_ranks_memory_is_not_priced_on_is_not_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, started: list[dict[str, Any]]
) -> None:
    """A job whose ranks do not fit at its plan's split as this rlctl prices them (launched so: job.json's digests of
    its batch and its launch record are the launch's), edited since in `tracking` and `name` alone, resumes: the
    refusal is of an edit that moved a rank's memory, versus "was edited since the launch (name, tracking), and with
    the job as edited …", an edit blamed that changed nothing priced. An edit of its batch besides that raises a
    rank's need is refused, naming that field alone."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = split_job(tmp_path, gpus=4, model={"kind": "builtin", "name": "qwen2.5-7b"}, gpu="H100", cut_tokens=512)
    launched_as_is(jd, train_micro_batch_tokens=32768, train_micro_batch_samples=64)  # the cut no rank fits
    data = json.loads(jd.job_json.read_text())
    data["job"]["tracking"], data["job"]["name"] = {"backends": ["tensorboard"]}, f"{data['job']['name']}-renamed"
    jd.job_json.write_text(json.dumps(data))
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 0, r.stderr
    assert [p["trainer"]["parallel"] for p in started] == [{"tp": 2, "pp": 1, "dp": 1}]
    edit_batch(jd, train_micro_batch_tokens=65536, train_micro_batch_samples=128)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 2, r.stderr
    assert f"{jd.job_json} was edited since the launch (batch), which raised a rank's need from " in r.stderr


def launched_as_is(jd: JobDir, **batch: Any) -> None:
    """job.json's batch set to `batch` as the launch's: its digests and its launch record (`job_launched`) made those
    of the job as it is (no edit)."""
    from rlctl.launch.jobdir import JOB_LAUNCHED, MEMORY_FIELDS, job_digests

    edit_batch(jd, **batch)
    data = json.loads(jd.job_json.read_text())
    data["job_sha256"] = job_digests(data["job"])
    data[JOB_LAUNCHED] = {name: data["job"][name] for name in MEMORY_FIELDS if name in data["job"]}
    jd.job_json.write_text(json.dumps(data))


def test_an_unedited_job_that_no_longer_fits_as_priced_now_resumes_with_one_warning_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, started: list[dict[str, Any]], said: list[str]
) -> None:
    """A job launched with a cut this rlctl prices past a rank's GPU (a price changed since: it ran at that split)
    and job.json unedited resumes at the plan's split, saying in one line the site, the figures (needed versus what a
    GPU holds) and what to change; versus resumed with no word. A job that fits resumes saying nothing of it."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = split_job(tmp_path, gpus=4, model={"kind": "builtin", "name": "qwen2.5-7b"}, gpu="H100", cut_tokens=512)
    launched_as_is(jd, train_micro_batch_tokens=32768, train_micro_batch_samples=64)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 0, r.stderr
    assert [p["trainer"]["parallel"] for p in started] == [{"tp": 2, "pp": 1, "dp": 1}]
    (line,) = [line for line in said if "warning" in line]
    assert line.startswith(
        "job resume: warning: as this rlctl prices the job, on site 't' the trainer's 2 rank(s) at tp 2 pp 1 dp 1 need "
    ), line
    need_gb = float(line.split(" need ")[1].split(" GB each")[0])
    assert need_gb > 0.9 * 80, line
    assert "and a H100 holds 80 GB (90% usable); resumed at the split it was launched at (not refused" in line, line
    assert line.endswith(
        f"lower batch.train_micro_batch_tokens in {jd.job_json}, or resume on more ranks "
        "(--trainer-split tp=T,pp=P,dp=D, checked by --dry-run)"
    ), line
    said.clear()
    launched_as_is(jd, train_micro_batch_tokens=1024, train_micro_batch_samples=2)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 0, r.stderr
    assert len(started) == 2
    assert not [line for line in said if "warning" in line], said


def test_the_status_of_a_run_resumed_with_that_warning_shows_it_and_of_a_run_that_fits_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warning line of a resume whose rank this rlctl prices past its GPU is recorded as a `warning` event of the
    run it started (`runstate.WARNING`, its run's id), and `rlctl status JOB` of that run shows it in one row; versus
    said on the launcher's output alone (launcher.log, detached), seen nowhere after. Resumed again with a cut that
    fits, the new run's status shows none. The launcher's `Runs` is the real one; its run's start stands in for the
    agents as the status reads them: the controller's `agent_started` naming the run, its end a failed summary."""
    from rlctl.commands.launching import resume as resume_mod
    from rlctl.launch.summary import write_summary
    from rlctl.ops.autoresume import Runs
    from rlctl.ops.run import JobRun

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    ids = iter(["run-1", "run-2"])

    def start(self: JobRun, *, resume: bool = False, checkpoint: int | None = None) -> None:
        self.run_id = next(ids)
        self.jobdir.event("agent_started", agent="controller-0", site="c", backend="local", run=self.run_id)
        write_summary(self.jobdir.summary_json, {"run": self.run_id, "state": "failed", "iterations": 3})

    def be_launcher(jd_: JobDir, spec_: Any, plan: dict[str, Any], db: Any, begin: Any, *a: Any, **k: Any) -> None:
        begin(Runs(jd_, spec_, plan, db=None, say=lambda line: None), lambda line: None)

    monkeypatch.setattr(JobRun, "start", start)
    monkeypatch.setattr(resume_mod, "be_launcher", be_launcher)
    jd = split_job(tmp_path, gpus=4, model={"kind": "builtin", "name": "qwen2.5-7b"}, gpu="H100", cut_tokens=512)
    launched_as_is(jd, train_micro_batch_tokens=32768, train_micro_batch_samples=64)
    assert run_cli("launch", "--resume", str(jd.path)).exit_code == 0
    r = run_cli("status", str(jd.path))
    assert r.exit_code == 0, r.stderr
    (row,) = [line for line in r.stdout.splitlines() if line.startswith("warning ")]
    said = row.removeprefix("warning").strip()
    assert said.startswith("as this rlctl prices the job, on site 't' the trainer's 2 rank(s) at tp 2 pp 1 dp 1 need ")
    assert said.endswith("(--trainer-split tp=T,pp=P,dp=D, checked by --dry-run)"), said
    shown = json.loads(run_cli("status", str(jd.path), "--output", "json").stdout)
    assert shown["warnings"] == [f"warning: {said}"]

    launched_as_is(jd, train_micro_batch_tokens=1024, train_micro_batch_samples=2)
    assert run_cli("launch", "--resume", str(jd.path)).exit_code == 0
    r = run_cli("status", str(jd.path))
    assert r.exit_code == 0, r.stderr
    assert "warning" not in r.stdout, r.stdout
    assert "warnings" not in json.loads(run_cli("status", str(jd.path), "--output", "json").stdout)


def edit_job(jd: JobDir, field: str, **values: Any) -> None:
    data = json.loads(jd.job_json.read_text())
    data["job"][field] = {**data["job"].get(field, {}), **values}
    jd.job_json.write_text(json.dumps(data))


def warning_of(said: list[str]) -> str:
    (line,) = [line for line in said if "warning" in line]
    assert line.startswith("job resume: warning: as this rlctl prices the job, on site 't' the trainer's 2 rank(s) ")
    assert line.endswith("(--trainer-split tp=T,pp=P,dp=D, checked by --dry-run)"), line
    return line


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(("batch", {"train_micro_batch_tokens": 16384}), id="cut-lowered-not-far-enough"),
        pytest.param(("algorithm", {"lr": 1e-6}), id="lr"),
    ],
)
def test_an_edit_that_does_not_raise_a_ranks_need_resumes_a_job_priced_past_its_gpu_with_the_warning(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    started: list[dict[str, Any]],
    said: list[str],
    edit: tuple[str, dict[str, Any]],
) -> None:
    """A job launched with a cut this rlctl prices past a rank's GPU (32,768 tokens of the 7B at tp 2: 188.3 GB a
    rank), its job.json edited since in a field a rank is priced on without raising the need — the cut lowered as the
    warning advises, not far enough (16,384: 174.7 GB), or algorithm.lr (no memory at all) — resumes at the plan's
    split with the warning, saying the edit did not raise the need; versus refused, blaming the edit ("was edited
    since the launch (batch), and with the job as edited …"), where unedited it resumed."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = split_job(tmp_path, gpus=4, model={"kind": "builtin", "name": "qwen2.5-7b"}, gpu="H100", cut_tokens=512)
    launched_as_is(jd, train_micro_batch_tokens=32768, train_micro_batch_samples=64)
    field, values = edit
    edit_job(jd, field, **values)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 0, r.stderr
    assert [p["trainer"]["parallel"] for p in started] == [{"tp": 2, "pp": 1, "dp": 1}]
    line = warning_of(said)
    assert f"(not refused: its edit since the launch ({field}) did not raise a rank's need (188.3 GB as launched))" in (
        line
    ), line
    need_gb = float(line.split(" need ")[1].split(" GB each")[0])
    assert need_gb == (188.3 if field == "algorithm" else 174.7), line


def test_an_edit_that_raises_a_fitting_jobs_need_past_its_gpu_is_refused_with_the_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, started: list[dict[str, Any]]
) -> None:
    """A job launched with a cut that fits (1,024 tokens: 66.9 GB a rank), its cut raised in job.json to 32,768
    (188.3 GB): refused in one line with the need before and after the edit and what a rank can use (72 GB of an
    H100's 80); nothing starts."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = split_job(tmp_path, gpus=4, model={"kind": "builtin", "name": "qwen2.5-7b"}, gpu="H100", cut_tokens=512)
    launched_as_is(jd, train_micro_batch_tokens=1024, train_micro_batch_samples=2)
    edit_batch(jd, train_micro_batch_tokens=32768, train_micro_batch_samples=64)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 2, r.stderr
    (line,) = r.stderr.splitlines()
    assert f"{jd.job_json} was edited since the launch (batch), which raised a rank's need from 66.9 to 188.3 GB, " in (
        line
    ), line
    assert "past 72.0 GB usable: with the job as edited the trainer's 2 rank(s) at tp 2 pp 1 dp 1 need 188.3 GB" in line
    assert started == []


def test_a_job_json_without_the_launch_record_is_never_refused_on_memory_and_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, started: list[dict[str, Any]], said: list[str]
) -> None:
    """A job.json an rlctl before `job_launched` wrote (nothing to price the job as launched by), its cut raised
    past a rank's GPU since the launch: resumed with the warning, saying it keeps no launch record; versus refused
    (an edit whose effect cannot be told is not blamed)."""
    from rlctl.launch.jobdir import JOB_LAUNCHED

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = split_job(tmp_path, gpus=4, model={"kind": "builtin", "name": "qwen2.5-7b"}, gpu="H100", cut_tokens=512)
    data = json.loads(jd.job_json.read_text())
    assert data[JOB_LAUNCHED]["batch"]["train_micro_batch_tokens"] == 512  # the launch keeps it
    del data[JOB_LAUNCHED]
    jd.job_json.write_text(json.dumps(data))
    edit_batch(jd, train_micro_batch_tokens=32768, train_micro_batch_samples=64)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 0, r.stderr
    assert len(started) == 1
    line = warning_of(said)
    assert f"(not refused: {jd.job_json} keeps no launch record of the fields edited since (batch))" in line, line


def test_a_resume_that_starts_the_job_over_makes_its_edit_the_launch_record_the_next_resume_prices_against(
    tmp_path: Path,
) -> None:
    """A job launched with a cut of 512 tokens (66.5 GB a rank), its cut edited to 16,384 (125.6 GB) and started over
    by a resume (`take_edits`: its checkpoints are of the job as edited): job.json's `job_launched` is the edited
    job's, so a later edit to 32,768 is refused as raising the need from 125.6 GB, not from the first launch's 66.5;
    and the edit taken is not judged an edit (a warning, not refused)."""
    from rlctl.launch.jobdir import JOB_LAUNCHED
    from rlctl.ops.jobchanges import edited_fields, take_edits
    from rlctl.ops.resumememory import judge_memory

    jd = split_job(tmp_path, gpus=4, model={"kind": "builtin", "name": "qwen2.5-7b"}, gpu="H100", cut_tokens=512)
    edit_batch(jd, train_micro_batch_tokens=16384, train_micro_batch_samples=32)
    take_edits(jd)
    data = json.loads(jd.job_json.read_text())
    assert data[JOB_LAUNCHED]["batch"] == data["job"]["batch"]
    line = judge_memory(jd, jd.read_plan(), edited=edited_fields(jd))
    assert line is not None and "(not refused: the rlctl that launched it may have priced it otherwise)" in line
    edit_batch(jd, train_micro_batch_tokens=32768, train_micro_batch_samples=64)
    with pytest.raises(UsageError, match=r"raised a rank's need from 125\.6 to 188\.3 GB, past 72\.0 GB usable"):
        judge_memory(jd, jd.read_plan(), edited=edited_fields(jd))
