"""The part and version a checkpoint's manifest names (`write_part`'s "part", `save_controller`'s "version") are
checked where it is read (`verified_manifest`): a controller manifest of another checkpoint, or of another part, in
iter-N is refused, and a resume takes the newest older checkpoint that verifies, said once; versus those fields
written and read by nothing (the controller's manifest is the one file no digest covers). A manifest written
before the fields is taken as before."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from rlctl.checkpoint import trainer
from rlctl.checkpoint.controller import load_controller
from rlctl.checkpoint.files import file_digest, latest_complete, manifest_path
from rlctl.checkpoint.trainer import CheckpointError, _verified, load_trainer
from rlctl.launch.agentenv import ParallelConfig
from rlctl.launch.sitefs import LocalFiles
from rlctl.models.tinygpt import TinyGPT
from rlctl.ops.resumepoint import pick_checkpoint
from rlctl.trainers.base import DataParallel
from tests.unit.checkpoint.test_checkpoint_properties import Sites, Steps, write_controller, write_trainer
from tests.unit.tiny_models import small_config


def two_checkpoints(tmp_path: Path) -> Sites:
    """v1 and v2 whole, both parts in one job dir, latest.json naming v2."""
    sites = Sites(tmp_path, shared=True, world=1)
    for v in (1, 2):
        sites.write(run=0, version=v, steps=Steps())
    return sites


def edit_controller_manifest(sites: Sites, version: int, fields: dict[str, object]) -> None:
    """Rewrite the controller manifest of `version` with `fields` set (None: left out), its files as they are."""
    path = manifest_path(sites.c.checkpoint(version), "controller")
    body = json.loads(path.read_text())
    for k, v in fields.items():
        if v is None:
            body.pop(k, None)
        else:
            body[k] = v
    path.write_text(json.dumps(body, indent=1, sort_keys=True))


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"version": 3}, "MANIFEST.controller.json is of checkpoint version 3, not v2 (its directory's)"),
        ({"version": "2"}, "MANIFEST.controller.json is of checkpoint version '2', not v2 (its directory's)"),
        ({"part": "trainer"}, "MANIFEST.controller.json is of part 'trainer', not 'controller'"),
    ],
)
def test_a_controller_manifest_of_another_checkpoint_or_part_is_not_used_the_one_before_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, fields: dict[str, object], why: str
) -> None:
    sites = two_checkpoints(tmp_path)
    edit_controller_manifest(sites, 2, fields)
    fs = LocalFiles()
    point = pick_checkpoint((fs, sites.c), (fs, sites.t))
    assert (point.version, point.skipped) == (1, ((2, f"controller part: {why}"),))
    with caplog.at_level(logging.WARNING, logger="rlctl.checkpoint.files"):
        assert latest_complete(sites.c.checkpoints) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"{sites.c.checkpoints}: checkpoint v2 not used: controller part: {why}"
    ]
    with pytest.raises(CheckpointError, match=rf"iter-2: the controller's part is .*: {re.escape(why)}$"):
        load_controller(sites.c, 2)


def test_a_manifest_written_before_the_part_and_version_fields_is_used(tmp_path: Path) -> None:
    sites = two_checkpoints(tmp_path)
    edit_controller_manifest(sites, 2, {"part": None, "version": None})
    fs = LocalFiles()
    assert pick_checkpoint((fs, sites.c), (fs, sites.t)).version == 2
    assert latest_complete(sites.c.checkpoints) == 2


def test_a_trainer_part_whose_counters_name_another_version_is_not_chosen_nor_loaded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """iter-1's trainer part in iter-2, beside a controller part that names it (a controller manifest written
    before its "version" field, or one byte of it changed with the digest): the counters its ranks would resume at
    are v1's, in a directory the launcher calls v2, versus chosen and loaded (the trainer at version 1, the
    controller at 2)."""
    sites = two_checkpoints(tmp_path)
    one, two = sites.t.checkpoint(1), sites.t.checkpoint(2)
    for name in ("model", "ranks"):
        shutil.rmtree(two / name)
        shutil.copytree(one / name, two / name)
    shutil.copy(manifest_path(one, "trainer"), manifest_path(two, "trainer"))
    write_controller(sites.c, run=0, version=2, trainer_digest=file_digest(manifest_path(two, "trainer")))
    why = "MANIFEST.trainer.json is of checkpoint version 1, not v2 (its directory's)"
    fs = LocalFiles()
    point = pick_checkpoint((fs, sites.c), (fs, sites.t))
    assert (point.version, point.skipped) == (1, ((2, f"trainer part: {why}"),))
    with caplog.at_level(logging.WARNING, logger="rlctl.checkpoint.files"):
        assert latest_complete(sites.c.checkpoints) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"{sites.c.checkpoints}: checkpoint v2 not used: trainer part: {why}"
    ]
    model = TinyGPT(small_config())
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(CheckpointError, match=re.escape(f"iter-2: the trainer's part is not usable: {why}")):
        split, alone = ParallelConfig("trainer"), DataParallel()
        load_trainer(two, model=model, optimizers={"policy": opt}, split=split, data_parallel=alone, version=2)


def swap_trainer_part(src: Path, dst: Path) -> None:
    """The trainer part of `src` (its policy, shards and manifest) in `dst`, in place of `dst`'s own."""
    for name in ("model", "ranks"):
        shutil.rmtree(dst / name)
        shutil.copytree(src / name, dst / name)
    shutil.copy(manifest_path(src, "trainer"), manifest_path(dst, "trainer"))


@pytest.mark.parametrize(
    ("other", "why"),
    [
        (
            "v1",
            "rank 1's shard is not usable: MANIFEST.trainer.json is of checkpoint version 1, not v2 (its directory's)",
        ),
        ("another run's v2", "the trainer's part is not usable: MANIFEST.trainer.json changed as rank 1 read it"),
    ],
)
def test_a_trainer_manifest_swapped_between_a_ranks_reads_of_it_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: str, why: str
) -> None:
    """iter-2's trainer part replaced whole (v1's part, another run's v2) after a rank's first read of its manifest
    (the policy, the version its counters name) and before its re-read for the shard it restores: refused, versus
    the shard taken as the new manifest listed it, beside the first one's counters and optimizer digest."""
    sites = Sites(tmp_path / "job", shared=True, world=2)
    for v in (1, 2):
        sites.write(run=0, version=v, steps=Steps())
    two = sites.t.checkpoint(2)
    src = sites.t.checkpoint(1)
    if other != "v1":
        src = tmp_path / "other" / "iter-2"
        write_trainer(src, world=2, run=1, version=2, steps=Steps())
    reads = []
    real = trainer.verified_manifest

    def swapped_after_the_first(*args: Any, **kwargs: Any) -> dict[str, Any]:
        got = real(*args, **kwargs)
        if not reads:
            swap_trainer_part(src, two)
        reads.append(got["digest"])
        return got

    monkeypatch.setattr(trainer, "verified_manifest", swapped_after_the_first)
    with pytest.raises(CheckpointError, match=re.escape(f"iter-2: {why}")):
        _verified(two, rank=1, reads=lambda _m: [1], version=2)
    assert len(reads) == (2 if other != "v1" else 1)
