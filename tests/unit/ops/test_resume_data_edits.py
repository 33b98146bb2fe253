"""A resume of a dataset job reads the data its launch prepared (data/, data-heldout/: tokenized once, at the launch),
never job.json's fields that data is made of: an edit of one of them since the launch (`PREPARED_FIELDS`) is refused
in one line naming job.json, the field and its value at the launch and now, exit 2, before anything starts or is
written (`rlctl.ops.preparededits.refuse_prepared_edits`), from a checkpoint or not. Before, the resume said 'the resume
runs the job as edited' and its run read the launch's prompts (held-out prompts asked of a job launched without
them: its run failed at its first evaluation). A held-out count changed over the rows prepared is the run's, taken."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlctl.config.job import JobFile
from rlctl.config.task import DatasetTask
from rlctl.errors import ConfigError, UsageError
from rlctl.launch.jobdir import JobDir
from rlctl.ops.jobchanges import refuse_fixed_edits
from rlctl.rl.dataset import load_dataset, prepare_dataset
from rlctl.rl.source import DATA_DIR, HELDOUT_DIR, DatasetSource, heldout_task
from rlctl.rl.tokenizer import load_tokenizer
from tests.unit.controller_harness import small_job
from tests.unit.hf_tokenizer import write_tokenizer
from tests.unit.ops.test_autoresume import FAILED, runs  # noqa: F401 (runs: a fixture)
from tests.unit.ops.test_resume_edit_check import refused_resume, started  # noqa: F401 (started: a fixture)
from tests.unit.ops.test_resume_point import split_job

TASK = {"kind": "dataset", "path": "train.jsonl", "reward": "exact_match", "max_prompt_tokens": 64}


def _rows(path: Path, n: int) -> None:
    path.write_text("".join(json.dumps({"prompt": f"q {i}", "ground_truth": str(i)}) + "\n" for i in range(n)))


def dataset_job(tmp_path: Path, *, heldout: int) -> tuple[JobDir, Path]:
    """A dataset job as a launch leaves it: job.json, its data/ and (`heldout` > 0) data-heldout/ prepared with the
    model's tokenizer. Returns it and the model directory."""
    job = small_job("ds", iterations=4).model_dump(mode="json", by_alias=True, exclude_unset=True)
    job["task"] = dict(TASK)
    job["evaluation"] = {"heldout_prompts": heldout, "path": "held.jsonl"}
    spec = JobFile.model_validate(job)
    jd = JobDir.create("ds", explicit=tmp_path / "job")
    (tmp_path / "ds.yaml").write_text("name: ds\n")  # (the job file it was launched from: paths are relative to it)
    jd.write_job(spec, source=str(tmp_path / "ds.yaml"))
    model = write_tokenizer(tmp_path / "model")
    tokenizer = load_tokenizer(model)
    task = spec.task
    assert isinstance(task, DatasetTask)
    _rows(tmp_path / "train.jsonl", 4)
    prepare_dataset(task, data_path=tmp_path / "train.jsonl", tokenizer=tokenizer, out_dir=jd.path / DATA_DIR)
    if heldout:
        _rows(tmp_path / "held.jsonl", 3)
        held = heldout_task(task, "held.jsonl")
        prepare_dataset(held, data_path=tmp_path / "held.jsonl", tokenizer=tokenizer, out_dir=jd.path / HELDOUT_DIR)
    return jd, model


def edit(jd: JobDir, name: str, value: Any) -> None:
    data = json.loads(jd.job_json.read_text())
    section, key = name.split(".")
    data["job"][section][key] = value
    jd.job_json.write_text(json.dumps(data))


EDITS = [
    ("task.path", "other.jsonl", '"train.jsonl" → "other.jsonl"', "data/"),
    ("task.prompt_key", "question", '"prompt" → "question"', "data/"),
    ("task.answer_key", "answer", '"ground_truth" → "answer"', "data/"),
    ("task.data_source_key", "src", '"data_source" → "src"', "data/"),
    ("task.extra_info_key", None, '"extra_info" → null', "data/"),
    ("task.template_strings", True, "false → true", "data/"),
    ("task.chat_template_kwargs", {"enable_thinking": False}, '{} → {"enable_thinking": false}', "data/"),
    ("task.max_prompt_tokens", 8, "64 → 8", "data/"),
    ("task.bad_rows", "skip", '"refuse" → "skip"', "data/"),
    ("evaluation.path", "other-held.jsonl", '"held.jsonl" → "other-held.jsonl"', "data-heldout/"),
]


@pytest.mark.parametrize(("name", "value", "shown", "where"), EDITS, ids=[e[0] for e in EDITS])
@pytest.mark.parametrize("resumed", [0, 3])
def test_an_edit_of_a_field_the_prepared_data_is_made_of_is_refused_with_both_values(
    tmp_path: Path, name: str, value: Any, shown: str, where: str, resumed: int
) -> None:
    jd, _ = dataset_job(tmp_path, heldout=2)
    refuse_fixed_edits(jd, resumed=resumed)  # as launched
    edit(jd, name, value)
    with pytest.raises(UsageError) as e:
        refuse_fixed_edits(jd, resumed=resumed)
    line = str(e.value)
    assert line.startswith(
        f"{jd.job_json}: job.{name} was edited since the launch ({shown}); a resume cannot take it: "
    )
    assert f"reads the data the launch prepared (its {where}" in line and "\n" not in line, line
    assert e.value.exit_code == 2


def test_a_held_out_count_within_the_prepared_rows_and_the_run_s_own_fields_are_taken(tmp_path: Path) -> None:
    """evaluation.heldout_prompts 2 → 1 and → 3 (data-heldout/ holds the file's 3 rows), shuffle_seed and
    max_output_tokens: read by the run, not refused; the run's held-out prompts are the count as edited."""
    jd, model = dataset_job(tmp_path, heldout=2)
    for n in (1, 3):
        edit(jd, "evaluation.heldout_prompts", n)
        refuse_fixed_edits(jd, resumed=3)
        source = DatasetSource(jd.read_job().task, jd.path, model, scoring=False, heldout_path="held.jsonl")  # type: ignore[arg-type]
        assert len(source.heldout(n)) == n
    edit(jd, "task.shuffle_seed", 5)
    edit(jd, "task.max_output_tokens", 32)
    refuse_fixed_edits(jd, resumed=3)


def test_held_out_prompts_asked_of_a_job_launched_without_them_are_refused(tmp_path: Path) -> None:
    """Launched with no held-out prompts (no data-heldout/), evaluation.heldout_prompts edited to 2: the run's first
    evaluation failed (no prepared dataset); now refused naming the field. Put back to 0: taken."""
    jd, _ = dataset_job(tmp_path, heldout=0)
    edit(jd, "evaluation.heldout_prompts", 2)
    with pytest.raises(UsageError) as e:
        refuse_fixed_edits(jd, resumed=0)
    assert str(e.value).startswith(f"{jd.job_json}: job.evaluation.heldout_prompts was edited since the launch (0 → 2)")
    assert "the launch prepared no held-out rows (no data-heldout/)" in str(e.value)
    with pytest.raises(ConfigError, match="no prepared dataset here"):  # what the run read
        load_dataset(jd.path / HELDOUT_DIR, heldout_task(DatasetTask.model_validate(TASK), "held.jsonl"))
    edit(jd, "evaluation.path", "other.jsonl")  # read by nothing while no held-out prompts are asked
    edit(jd, "evaluation.heldout_prompts", 0)
    refuse_fixed_edits(jd, resumed=0)


def test_evaluation_turned_off_on_a_resume_is_taken_whatever_its_path(tmp_path: Path) -> None:
    """Launched with held-out prompts (data-heldout/ prepared), evaluation.heldout_prompts edited to 0 and its path to
    null or another file: nothing reads the path then, taken; versus refused naming evaluation.path. Asked again of
    another file: refused."""
    jd, _ = dataset_job(tmp_path, heldout=2)
    edit(jd, "evaluation.heldout_prompts", 0)
    for path in (None, "other-held.jsonl"):
        edit(jd, "evaluation.path", path)
        refuse_fixed_edits(jd, resumed=3)
    edit(jd, "evaluation.heldout_prompts", 2)
    with pytest.raises(UsageError, match=r"job\.evaluation\.path was edited since the launch"):
        refuse_fixed_edits(jd, resumed=3)


def test_a_job_json_of_an_rlctl_that_kept_the_task_alone_is_compared_with_it(tmp_path: Path) -> None:
    """`launched` without the prepared fields (an rlctl before them): task.path compared with `job_launched`'s task."""
    jd, _ = dataset_job(tmp_path, heldout=2)
    data = json.loads(jd.job_json.read_text())
    data["launched"] = {k: v for k, v in data["launched"].items() if not k.startswith(("task.path", "evaluation."))}
    data["job"]["task"]["path"] = "other.jsonl"
    data["job"]["evaluation"]["path"] = "other-held.jsonl"  # (no launch value kept: nothing to compare with)
    jd.job_json.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=r"job\.task\.path was edited since the launch \(\"train\.jsonl\" → "):
        refuse_fixed_edits(jd, resumed=3)


def test_launch_resume_refuses_an_edited_data_path_before_anything_starts(
    tmp_path: Path,
    started: list[dict[str, Any]],  # noqa: F811
) -> None:
    jd = split_job(tmp_path)
    data = json.loads(jd.job_json.read_text())
    job = data["job"]
    job["task"] = dict(TASK)
    jd.write_job(JobFile.model_validate(job), source="test")
    edit(jd, "task.path", "other.jsonl")
    line = refused_resume(jd, started, "--iterations", "12")
    assert line.startswith(
        f"rlctl: error: {jd.job_json}: job.task.path was edited since the launch "
        '("train.jsonl" → "other.jsonl"); a resume cannot take it'
    ), line


@pytest.mark.parametrize("name", ["task.path", "evaluation.path"])
def test_a_data_file_moved_since_the_launch_and_its_path_edited_to_it_is_taken(tmp_path: Path, name: str) -> None:
    """The data file moved to moved/ and its path edited to it: the same bytes as the rows prepared, taken (nothing
    the run reads differs); the file there changed (another row), refused."""
    jd, _ = dataset_job(tmp_path, heldout=2)
    was = "train.jsonl" if name == "task.path" else "held.jsonl"
    (tmp_path / "moved").mkdir()
    (tmp_path / was).rename(tmp_path / "moved" / was)
    edit(jd, name, f"moved/{was}")
    refuse_fixed_edits(jd, resumed=3)
    with (tmp_path / "moved" / was).open("a") as f:
        f.write(json.dumps({"prompt": "q new", "ground_truth": "9"}) + "\n")
    with pytest.raises(UsageError, match=rf"job\.{name} was edited since the launch \(\"{was}\" → \"moved/{was}\"\)"):
        refuse_fixed_edits(jd, resumed=3)


def test_an_automatic_resume_after_a_data_path_edit_is_refused_as_launch_resume_refuses_it(
    runs: Any,  # noqa: F811
) -> None:
    """task.path edited in job.json during the run: the automatic resume ran the launch's data/ under it, said as
    an edit it takes; now not resumed automatically, one line naming the field, the failure the job's."""
    r, said = runs([(FAILED, [10]), ("done", [])], auto_resume=2)
    r.jobdir.write_job(r.spec.model_copy(update={"task": DatasetTask.model_validate(TASK)}), source="test")
    edit(r.jobdir, "task.path", "other.jsonl")
    assert r.wait()["state"] == FAILED
    assert r.resumes == 0
    assert said[-1].startswith(f"job demo {FAILED}; not resumed automatically: {r.jobdir.job_json}: job.task.path "), (
        said[-1]
    )
    assert '("train.jsonl" → "other.jsonl")' in said[-1] and "\n" not in said[-1]
