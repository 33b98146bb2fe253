"""A resume never reads job.json's HF `model.path`: every run of the job, resumed or not, trains the model its launch
copied into the job dir (model/init: the trainer, the rollout engines and the prompts' tokenizer read it; the
checkpoints carry its weights). An edit of it (a directory moved since, or another model's) is said as not read by the
line that says job.json was edited, versus 'the resume runs the job as edited there', and refused by nothing: its
problems are judged on the job dir's copy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlctl.launch.jobdir import JobDir
from rlctl.ops.jobchanges import edited_fields, launch_changes, refuse_fixed_edits
from rlctl.ops.resumecheck import edit_problems
from rlctl.rl.dataset import MANIFEST_FILE
from rlctl.rl.source import DATA_DIR
from rlctl.rl.tokenizer import load_tokenizer
from tests.unit.hf_tokenizer import write_tokenizer
from tests.unit.ops.test_resume_edit_check import hf_demo_launched


def _edit_model_path(jd: JobDir, path: Path) -> str:
    data = json.loads(jd.job_json.read_text())
    was = data["job"]["model"]["path"]
    data["job"]["model"]["path"] = str(path)
    jd.job_json.write_text(json.dumps(data))
    return str(was)


@pytest.mark.parametrize("to", ["moved", "another-tokenizer"])
def test_an_edit_of_an_hf_models_path_is_said_as_not_read_by_the_resume(tmp_path: Path, to: str) -> None:
    jd = hf_demo_launched(tmp_path / "launch")
    launched = Path(json.loads(jd.job_json.read_text())["job"]["model"]["path"])
    if to == "moved":
        new = shutil.copytree(launched, tmp_path / "moved-model")
    else:
        new = write_tokenizer(tmp_path / "other-model")
        shutil.copy(launched / "config.json", new / "config.json")
    prepared = json.loads((jd.path / DATA_DIR / MANIFEST_FILE).read_text())["tokenizer"]
    # what the run reads: the job dir's copy, whose tokenizer the prompts were prepared with
    assert load_tokenizer(jd.init_model).fingerprint() == prepared
    assert (load_tokenizer(new).fingerprint() == prepared) == (to == "moved")
    was = _edit_model_path(jd, new)
    refuse_fixed_edits(jd, resumed=3)  # not refused
    assert edited_fields(jd) == ["model"]
    assert edit_problems(jd, jd.read_plan(), edited=["model"]) == []  # judged on the job dir's copy
    (line,) = launch_changes(jd)
    assert line == (
        f"{jd.job_json} was edited since the launch (model): the resume runs the job as edited there, but for "
        f'job.model.path ("{was}" → "{new}"), which no resume reads: its run trains the model the launch copied into '
        f"{jd.init_model} (the checkpoints carry its weights; the prompts were tokenized with its tokenizer), "
        "whatever directory model.path names; to train another model, launch the changed job anew"
    ), line


def test_another_edit_of_the_model_says_nothing_of_its_path(tmp_path: Path) -> None:
    jd = hf_demo_launched(tmp_path)
    data = json.loads(jd.job_json.read_text())
    data["job"]["model"]["name"] = "relabelled"
    jd.job_json.write_text(json.dumps(data))
    assert launch_changes(jd) == [
        f"{jd.job_json} was edited since the launch (model): the resume runs the job as edited there"
    ]


def test_the_model_a_resume_plans_for_keeps_the_launchs_name_under_a_path_edited_to_another_folder(
    tmp_path: Path,
) -> None:
    """model.path edited to where the model moved, a folder of another name (no model.name): the job a resume plans
    and prices (`resumed_job`: the job dir's copy) keeps the name of the folder the launch copied it from, the one
    its plan and a named profile know it by, versus the edited folder's name."""
    from rlctl.ops.resumememory import resumed_job

    jd = hf_demo_launched(tmp_path / "launch")
    launched = Path(json.loads(jd.job_json.read_text())["job"]["model"]["path"])
    before = resumed_job(jd).model
    _edit_model_path(jd, shutil.copytree(launched, tmp_path / "moved-elsewhere"))
    after = resumed_job(jd).model
    assert (after.name, after.path) == (before.name, before.path) == (launched.resolve().name, str(jd.init_model))
