"""`launch --resume` says what changed since the job's launch (rlctl.ops.jobchanges): the job file it was launched
from, edited since (the resume runs the job as launched), and its job.json, edited by hand (used as edited)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from rlctl.launch.jobdir import JobDir
from rlctl.ops.jobchanges import changed_fields, launch_changes
from tests.conftest import ROOT
from tests.unit.controller_harness import small_job

FILE = {"apiVersion": "rlctl/v1", "kind": "Job", "name": "kt", "iterations": 200, "algorithm": {"lr": 1.0e-5}}


def _launched(tmp_path: Path) -> tuple[JobDir, Path]:
    source = tmp_path / "kt.yaml"
    source.write_text(yaml.safe_dump(FILE))
    jd = JobDir.create("kt", explicit=tmp_path / "job")
    jd.write_job(small_job("kt", iterations=200), source=str(source))
    return jd, source


def test_a_resume_names_the_fields_of_the_job_file_changed_since_the_launch(tmp_path: Path) -> None:
    # lr and iterations changed in jobs/kt.yaml: the resume said only `resumed from checkpoint v30` and ran 200
    jd, source = _launched(tmp_path)
    assert launch_changes(jd) == []
    source.write_text(yaml.safe_dump(FILE | {"iterations": 300, "algorithm": {"lr": 2.0e-5}}) + "# a comment\n")
    assert launch_changes(jd) == [
        f"{source} changed since the launch (algorithm.lr, iterations); the resume runs the job as launched (its "
        f"job.json): to run the changed job, launch it anew (`rlctl launch {source}`)"
    ]
    source.unlink()  # moved or removed: nothing to compare with
    assert launch_changes(jd) == []


def test_a_hand_edited_job_json_is_said_with_its_fields(tmp_path: Path) -> None:
    jd, _ = _launched(tmp_path)
    data = json.loads(jd.job_json.read_text())
    data["job"]["iterations"] = 400
    data["job"]["checkpoint"]["keep"] = 1
    jd.job_json.write_text(json.dumps(data))
    assert launch_changes(jd) == [
        f"{jd.job_json} was edited since the launch (checkpoint, iterations): the resume runs the job as edited there"
    ]
    assert jd.read_job().iterations == 400


def test_a_resume_names_the_files_of_the_reward_changed_since_the_launch(tmp_path: Path) -> None:
    """Before: a helper module of the reward file, edited between runs, went unsaid, and the resume scored with the
    job's copy of the one launched (its reward/)."""
    from rlctl.rl.reward_files import copy_reward

    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "helper.py").write_text("X = 1\n")
    (tmp_path / "rewards" / "r.py").write_text("from helper import X\n")
    source = tmp_path / "kt.yaml"
    source.write_text(yaml.safe_dump(FILE | {"task": {"kind": "dataset", "reward": "rewards/r.py:f"}}))
    jd = JobDir.create("kt", explicit=tmp_path / "job")
    jd.write_job(small_job("kt", iterations=200), source=str(source))
    copy_reward(tmp_path / "rewards" / "r.py", jd.path / "reward")  # as the launch copies it
    assert launch_changes(jd) == []
    (tmp_path / "rewards" / "helper.py").write_text("X = 2\n")
    assert launch_changes(jd) == [
        f"the reward ({tmp_path / 'rewards' / 'r.py'}, with the modules beside it that it imports) changed since the "
        f"launch (helper.py); the resume runs the reward as launched (its {jd.path / 'reward'}): to run the changed "
        "reward, launch the job anew"
    ]


def test_changed_fields_names_nested_added_and_removed_fields() -> None:
    before = {"a": 1, "b": {"c": [1, 2], "d": "x"}, "e": 2}
    after = {"a": 1, "b": {"c": [1, 3], "f": "y"}}
    assert changed_fields(before, after) == ["b.c", "b.d", "b.f", "e"]
    assert changed_fields(before, before) == []


def _inventory(gpus: int, name: str = "local") -> dict[str, Any]:
    site = {
        "datacenter": "here",
        "scheduler": {"kind": "local"},
        "gpu": "CPU",
        "nodes": [{"host": "localhost", "gpus": gpus}],
        "network": {"bandwidth_gbps": 10},
    }
    return {"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": {name: site}}


def test_a_resume_names_the_sites_whose_inventory_changed_since_the_launch(tmp_path: Path) -> None:
    # the inventory's site gained GPUs after the launch: the resume ran on sites.json, as launched, without a word
    from rlctl.config.inventory import load_inventory
    from rlctl.launch.backends import write_sites

    jd, _ = _launched(tmp_path)
    inventory = tmp_path / "x.yaml"  # the job's `inventory: [x.yaml]`, beside its job file
    inventory.write_text(yaml.safe_dump(_inventory(4)))
    write_sites(jd.path, load_inventory([inventory]).sites)
    assert launch_changes(jd) == []
    inventory.write_text(yaml.safe_dump(_inventory(8)))
    assert launch_changes(jd) == [
        f"the inventory ({inventory}) changed since the launch (sites.local.nodes); the resume runs on the sites as "
        "launched (its sites.json): to run on the changed inventory, launch the job anew"
    ]
    inventory.write_text(yaml.safe_dump(_inventory(4, "other")))
    assert "(sites.local (gone))" in launch_changes(jd)[0]
    inventory.write_text("sites: [")  # broken: nothing to compare with
    assert launch_changes(jd) == []


def test_an_edit_while_the_launch_prepares_the_job_is_a_change_since_the_launch(tmp_path: Path) -> None:
    # job.json is written once the job is prepared (minutes of SFT warm-up): it read the job file again then, so an
    # edit made meanwhile became the launch's mapping, and the resume never said it ran the job without it
    from rlctl.config import load_job

    job_file = ROOT / "jobs" / "demo.yaml"
    source = tmp_path / "demo.yaml"
    source.write_text(job_file.read_text().replace("../clusters/", f"{ROOT}/clusters/"))
    job = load_job(source)  # what the launch read
    assert job.mapping is not None and job.mapping["name"] == job.spec.name
    source.write_text(source.read_text().replace(f"iterations: {job.spec.iterations}", "iterations: 999"))
    jd = JobDir.create("d", explicit=tmp_path / "job")
    jd.write_job(job.spec, source=str(source), mapping=job.mapping)
    assert launch_changes(jd)[0].startswith(f"{source} changed since the launch (iterations)")


def test_a_reward_file_that_is_a_link_unchanged_since_the_launch_is_not_said(tmp_path: Path) -> None:
    """Before: the launch copies a linked reward file under the link's name (rewards/score.py), the comparison copied
    it under its target's (impl.py), so every resume said 'the reward … changed since the launch (impl.py, score.py)'
    of a reward nobody touched."""
    from rlctl.rl.reward_files import copy_reward

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "impl.py").write_text("def f(*a): return 1.0\n")
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "score.py").symlink_to(tmp_path / "lib" / "impl.py")
    source = tmp_path / "kt.yaml"
    source.write_text(yaml.safe_dump(FILE | {"task": {"kind": "dataset", "reward": "rewards/score.py:f"}}))
    jd = JobDir.create("kt", explicit=tmp_path / "job")
    jd.write_job(small_job("kt", iterations=200), source=str(source))
    copy_reward(tmp_path / "rewards" / "score.py", jd.path / "reward")  # as the launch copies it
    assert launch_changes(jd) == []
    (tmp_path / "lib" / "impl.py").write_text("def f(*a): return 2.0\n")
    assert "changed since the launch (score.py)" in launch_changes(jd)[0]


def test_a_job_json_edit_its_checkpoints_cannot_run_on_is_refused_naming_the_field_and_both_values(
    tmp_path: Path,
) -> None:
    """batch.samples_per_prompt 2 → 4 in job.json: the resume ran the checkpoint's groups of 2 beside new ones of 4,
    said only as 'job.json was edited (batch)'; now refused, one line. An edit that fits (checkpoint.keep) is still
    taken and said."""
    import pytest

    from rlctl.errors import UsageError
    from rlctl.ops.jobchanges import refuse_fixed_edits

    jd, _ = _launched(tmp_path)
    refuse_fixed_edits(jd, resumed=5)  # as launched
    data = json.loads(jd.job_json.read_text())
    data["job"]["checkpoint"]["keep"] = 1
    jd.job_json.write_text(json.dumps(data))
    refuse_fixed_edits(jd, resumed=5)
    assert launch_changes(jd)[0].startswith(f"{jd.job_json} was edited since the launch (checkpoint)")
    for name, edit, shown in (
        ("batch.samples_per_prompt", lambda j: j["batch"].update(samples_per_prompt=4), "(2 → 4)"),
        ("model.name", lambda j: j["model"].update(name="qwen2.5-7b"), '("tiny-demo" → "qwen2.5-7b")'),
        ("seed", lambda j: j.update(seed=7), "(0 → 7)"),
        ("task.kind", lambda j: j["task"].update(kind="lengths"), '("digits" → "lengths")'),
        ("trainer.lora", lambda j: j["trainer"].update(lora={"rank": 4, "alpha": 8}), "(null → "),
    ):
        edited = json.loads(json.dumps(data))
        edit(edited["job"])
        jd.job_json.write_text(json.dumps(edited))
        with pytest.raises(UsageError) as e:
            refuse_fixed_edits(jd, resumed=5)
        assert str(e.value).startswith(f"{jd.job_json}: job.{name} was edited since the launch "), str(e.value)
        assert shown in str(e.value) and "\n" not in str(e.value) and e.value.exit_code == 2
        refuse_fixed_edits(jd, resumed=0)  # no checkpoint to continue from: the resume starts over, and takes it
    del data["launched"]  # a job.json of an rlctl before it kept the launch's values: said, not refused
    data["job"]["seed"] = 7
    jd.job_json.write_text(json.dumps(data))
    refuse_fixed_edits(jd, resumed=5)


def test_a_job_json_edit_of_an_hf_models_path_is_taken_and_said_not_refused(tmp_path: Path) -> None:
    # the model's directory moved since the launch, its path edited to the new place: the checkpoints carry its
    # weights, so the resume takes it (said as any edit), versus refused as another model
    from rlctl.config.job import JobFile
    from rlctl.ops.jobchanges import refuse_fixed_edits

    job = small_job("kt", iterations=200).model_dump(mode="json", by_alias=True)
    job["model"] = {"kind": "hf", "path": "/models/qwen-0.5b"}
    jd = JobDir.create("kt", explicit=tmp_path / "job")
    jd.write_job(JobFile.model_validate(job), source="test")
    data = json.loads(jd.job_json.read_text())
    data["job"]["model"]["path"] = "/data/models/qwen-0.5b"
    jd.job_json.write_text(json.dumps(data))
    refuse_fixed_edits(jd, resumed=5)
    assert launch_changes(jd)[0].startswith(f"{jd.job_json} was edited since the launch (model)")


def test_a_job_json_edit_of_an_hf_models_name_is_taken_but_a_builtin_models_is_refused(tmp_path: Path) -> None:
    # an HF model's name only labels the architecture its directory holds (the checkpoints carry its weights): an
    # edit of it was refused as 'its checkpoints hold the weights of the model it was launched with'
    import pytest

    from rlctl.config.job import JobFile
    from rlctl.errors import UsageError
    from rlctl.ops.jobchanges import refuse_fixed_edits

    job = small_job("kt", iterations=200).model_dump(mode="json", by_alias=True)
    builtin = JobDir.create("kt", explicit=tmp_path / "builtin")
    builtin.write_job(JobFile.model_validate(job), source="test")
    job["model"] = {"kind": "hf", "path": "/models/qwen-0.5b", "name": "qwen-0.5b"}
    hf = JobDir.create("kt", explicit=tmp_path / "hf")
    hf.write_job(JobFile.model_validate(job), source="test")
    for jd, name in ((hf, "qwen2.5-0.5b-instruct"), (builtin, "qwen2.5-7b")):
        data = json.loads(jd.job_json.read_text())
        data["job"]["model"]["name"] = name
        jd.job_json.write_text(json.dumps(data))
    refuse_fixed_edits(hf, resumed=5)
    assert launch_changes(hf)[0].startswith(f"{hf.job_json} was edited since the launch (model)")
    with pytest.raises(UsageError, match=r"job\.model\.name was edited since the launch"):
        refuse_fixed_edits(builtin, resumed=5)


def test_a_path_under_a_home_that_is_not_here_is_nothing_to_compare_with_not_a_folder_beside_the_job_file(
    tmp_path: Path,
) -> None:
    """The reward file and the inventory files the job names under ~nosuchuser/… (a home of the machine it was
    launched from) are read as `load_job` reads them (`home_expanded`): no file here, nothing to compare with. Before,
    os.path left them as written and the resume compared with a folder named `~nosuchuser` beside the job file."""
    from rlctl.config.inventory import load_inventory
    from rlctl.launch.backends import write_sites
    from rlctl.rl.reward_files import copy_reward

    beside = tmp_path / "~rlctl-no-such-user"  # a folder of that name beside the job file, which is no home
    beside.mkdir()
    (beside / "r.py").write_text("def f(*a): return 2.0\n")
    (beside / "x.yaml").write_text(yaml.safe_dump(_inventory(8)))
    (tmp_path / "launched.py").write_text("def f(*a): return 1.0\n")
    source = tmp_path / "kt.yaml"
    reward = {"task": {"kind": "dataset", "reward": "~rlctl-no-such-user/r.py:f"}}
    source.write_text(yaml.safe_dump(FILE | reward))
    jd = JobDir.create("kt", explicit=tmp_path / "job")
    jd.write_job(small_job("kt", iterations=200), source=str(source))
    copy_reward(tmp_path / "launched.py", jd.path / "reward")
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(_inventory(4)))
    write_sites(jd.path, load_inventory([tmp_path / "x.yaml"]).sites)
    data = json.loads(jd.job_json.read_text())
    data["job"]["inventory"] = ["~rlctl-no-such-user/x.yaml"]  # edited by hand
    jd.job_json.write_text(json.dumps(data))
    assert launch_changes(jd) == [
        f"{jd.job_json} was edited since the launch (inventory): the resume runs the job as edited there"
    ]
