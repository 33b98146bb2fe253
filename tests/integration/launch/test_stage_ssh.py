"""Staging over SSH against the real sshd on 127.0.0.1:2222 (tests/services/sshd.sh): a copy cut short goes on
from the bytes that arrived (`<file>.part`), one whose earlier bytes were other bytes is copied again from its
start, and the model lands once in the work root's model directory that jobs share."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlctl.launch import stage
from rlctl.launch.sitefs import file_state, ssh_target
from rlctl.launch.sshrunner import PART_SUFFIX, SshRunner
from tests.integration.sshsite import ssh_site

pytestmark = pytest.mark.integration
MODEL_BYTES = 3 << 20


def job_dir(tmp_path: Path) -> Path:
    d = tmp_path / "op" / "job-1"
    (d / "model" / "init").mkdir(parents=True)
    (d / "job.json").write_text(json.dumps({"name": "job"}))
    (d / "model" / "init" / "config.json").write_text("{}")
    (d / "model" / "init" / "model.safetensors").write_bytes(os.urandom(MODEL_BYTES))
    return d


def model_dir(src: Path, workdir: Path) -> Path:
    files = {n.name: file_state(n) for n in (src / "model" / "init").iterdir()}
    return workdir / "models" / stage.model_digest(files)


@pytest.mark.timeout(120)
def test_a_copy_cut_short_goes_on_from_its_bytes(services: dict[str, str], tmp_path: Path) -> None:
    src = job_dir(tmp_path)
    site = ssh_site(services, gpus=2, workdir=tmp_path / "remote")
    weights = src / "model" / "init" / "model.safetensors"
    cache = model_dir(src, tmp_path / "remote")
    cache.mkdir(parents=True)
    (cache / ("model.safetensors" + PART_SUFFIX)).write_bytes(weights.read_bytes()[: 1 << 20])  # 1 of 3 MiB
    runner = SshRunner(ssh_target(site))
    moved: list[int] = []
    try:
        have = runner.put(weights, str(cache / "model.safetensors"), progress=moved.append, resume=True)
    finally:
        runner.close()
    assert have == 1 << 20 and sum(moved) == MODEL_BYTES  # the resumed MiB counted once, at once
    assert (cache / "model.safetensors").read_bytes() == weights.read_bytes()
    assert not (cache / ("model.safetensors" + PART_SUFFIX)).exists()


@pytest.mark.timeout(120)
def test_a_resumed_copy_of_other_bytes_is_copied_again_and_the_model_is_shared(
    services: dict[str, str], tmp_path: Path
) -> None:
    src = job_dir(tmp_path)
    workdir = tmp_path / "remote"
    site = ssh_site(services, gpus=2, workdir=workdir)
    cache = model_dir(src, workdir)
    cache.mkdir(parents=True)
    (cache / ("model.safetensors" + PART_SUFFIX)).write_bytes(b"\0" * (1 << 20))  # an earlier copy of other bytes
    said: list[str] = []
    staged = stage.stage_all(src, {"b": site}, job_id="job-1", say=said.append)["b"]
    weights = src / "model" / "init" / "model.safetensors"
    assert (cache / "model.safetensors").read_bytes() == weights.read_bytes()
    init = workdir / "jobs" / "job-1" / "model" / "init"
    assert init.is_symlink() and init.resolve() == cache.resolve()
    assert staged["model_cache"]["dir"] == str(cache) and list(staged["copied"].values()) == [3]
    assert said and " copied in " in said[-1]
    again = stage.stage_all(src, {"b": site}, job_id="job-2")["b"]  # another job, the same model: not copied
    assert list(again["copied"].values()) == [1]  # job.json only
