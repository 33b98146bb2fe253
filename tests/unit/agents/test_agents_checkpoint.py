"""Checkpoints: each part written atomically with its manifest last; a part that does not verify is never
used; the trainer's state (policy, optimizer, RNG, counters) comes back exactly as saved."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlctl.agents.controller import ControllerAgent
from rlctl.checkpoint.background import BackgroundWriter
from rlctl.checkpoint.files import (
    file_digest,
    latest_complete,
    manifest_path,
    prune,
    read_manifest,
    set_aside_newer,
    set_latest,
    write_part,
)
from rlctl.checkpoint.trainer import (
    CheckpointError,
    HostPolicy,
    load_trainer,
    optimizer_digest,
    save_trainer,
    snapshot_trainer,
)
from rlctl.launch.agentenv import ParallelConfig
from rlctl.models.tinygpt import TinyGPT, load_state_dict
from rlctl.trainers.base import DataParallel
from tests.unit.hf_checkpoints import rope_rows_loaded
from tests.unit.tiny_models import small_config

ONE = ParallelConfig("trainer")  # tp 1 pp 1 dp 1: one rank, no process group
ALONE = DataParallel()  # replica 0 of 1


def text_part(ckpt: Path, part: str, body: str) -> str:
    """Part `part` of checkpoint `ckpt`, its state.json `body`; a controller part names the trainer part beside it
    (its manifest's SHA-256, as `save_controller` writes it: that part first)."""

    def fill(tmp: Path) -> None:
        tmp.mkdir()
        (tmp / "state.json").write_text(body)

    meta: dict[str, object] = {"version": int(ckpt.name.split("-")[1])}
    if part == "controller":
        meta["trainer_digest"] = file_digest(manifest_path(ckpt, "trainer"))
    return write_part(ckpt, part, {part: fill}, meta=meta)


def test_a_part_is_used_only_when_every_file_matches_its_manifest(tmp_path: Path) -> None:
    ckpt = tmp_path / "iter-3"
    text_part(ckpt, "trainer", "{}")
    digest = text_part(ckpt, "controller", '{"iteration": 3}')
    m = read_manifest(ckpt, "controller")
    assert m is not None and m["digest"] == digest and list(m["files"]) == ["controller/state.json"]
    assert not list(ckpt.glob(".*tmp*"))  # nothing left under a temporary name
    (ckpt / "controller" / "state.json").write_text('{"iteration": 4}')  # same size, other bytes
    assert read_manifest(ckpt, "controller") is None
    text_part(ckpt, "controller", '{"iteration": 3}')
    manifest_path(ckpt, "controller").unlink()  # a part whose manifest was never written
    assert read_manifest(ckpt, "controller") is None


def test_latest_complete_follows_the_pointer_and_falls_back_past_a_damaged_checkpoint(tmp_path: Path) -> None:
    for v in (2, 4, 6):
        for part in ("trainer", "controller"):
            text_part(tmp_path / f"iter-{v}", part, json.dumps({"v": v}))
    assert latest_complete(tmp_path) == 6  # no pointer yet: the newest that verifies
    set_latest(tmp_path, 4)
    assert latest_complete(tmp_path) == 4  # iter-6 was written after the pointer last moved
    (tmp_path / "iter-4" / "trainer" / "state.json").write_text("damaged")
    assert latest_complete(tmp_path) == 2
    assert latest_complete(tmp_path, ["controller"]) == 4
    set_latest(tmp_path, 0)
    assert latest_complete(tmp_path) is None


def test_latest_complete_never_reads_a_damaged_pointer_as_no_checkpoint(tmp_path: Path) -> None:
    for v in (2, 4):
        for part in ("trainer", "controller"):
            text_part(tmp_path / f"iter-{v}", part, json.dumps({"v": v}))
    (tmp_path / "latest.json").write_text('{"version": ')  # damaged: every checkpoint is tried instead
    assert latest_complete(tmp_path) == 4
    (tmp_path / "latest.json").write_text('{"version": "4"}')
    assert latest_complete(tmp_path) == 4


def test_latest_complete_skips_a_newest_checkpoint_whose_manifest_is_bad(tmp_path: Path, caplog) -> None:
    for v in (2, 4):
        for part in ("trainer", "controller"):
            text_part(tmp_path / f"iter-{v}", part, json.dumps({"v": v}))
    set_latest(tmp_path, 4)
    body = json.loads(manifest_path(tmp_path / "iter-4", "trainer").read_text())
    body["files"]["trainer/state.json"]["sha256"] = "0" * 64  # a manifest whose checksum does not match
    manifest_path(tmp_path / "iter-4", "trainer").write_text(json.dumps(body))
    with caplog.at_level("INFO", logger="rlctl.checkpoint.files"):
        assert latest_complete(tmp_path) == 2
    said = [r.getMessage() for r in caplog.records]
    assert any("checkpoint v4 not used: trainer part: trainer/state.json does not match" in m for m in said), said
    assert said[-1] == f"{tmp_path}: latest complete checkpoint v2 (latest.json names v4)"
    manifest_path(tmp_path / "iter-2", "controller").unlink()
    assert latest_complete(tmp_path) is None  # none complete: None, never version 0


def sealed(root: Path, version: int, run: str) -> str:
    """Both parts of checkpoint `version` as the agents write them (the controller's names the trainer's
    manifest), written by run `run`; the trainer manifest's SHA-256."""
    digest = text_part(root / f"iter-{version}", "trainer", json.dumps({"run": run}))
    write_part(
        root / f"iter-{version}",
        "controller",
        {"controller": lambda tmp: (tmp.mkdir(), (tmp / "state.json").write_text(json.dumps({"run": run})))},
        meta={"version": version, "trainer_digest": digest},
    )
    return digest


def run_of(ckpt: Path, part: str) -> str:
    return json.loads((ckpt / part / "state.json").read_text())["run"]


def test_a_lost_pointer_never_resumes_a_lineage_a_resume_abandoned(tmp_path: Path, caplog) -> None:
    """Run A checkpoints v2…v8; a resume goes back to v4 (v6 and v8 did not verify then, or the pointer still
    named v4), and run B starts there: each agent sets its part of v6 and v8 aside. B rewrites v6's trainer part;
    latest.json is lost before the controller's part: the resume takes v4, never A's v8 nor A's controller part of
    v6 with B's trainer part; once B seals v6, v6."""
    for v in (2, 4, 6, 8):
        sealed(tmp_path, v, "A")
    a6 = file_digest(manifest_path(tmp_path / "iter-6", "trainer"))
    set_latest(tmp_path, 4)
    with caplog.at_level("WARNING", logger="rlctl.checkpoint.files"):
        moved = [
            set_aside_newer(tmp_path, "controller", resumed=4, keep=0),  # (the controller's _resume)
            set_aside_newer(tmp_path, "trainer", resumed=4, keep=0),  # (trainer rank 0, at its start)
        ]
    said = [r.getMessage() for r in caplog.records]
    text_part(tmp_path / "iter-6", "trainer", json.dumps({"run": "B"}))  # B's trainer part; the controller's next
    (tmp_path / "latest.json").unlink()
    assert latest_complete(tmp_path) == 4
    assert moved == [[6, 8], [6, 8]]
    assert said == [
        f"checkpoints {tmp_path}: set aside the {part} part of v[6, 8] in abandoned/: newer than v4, which this "
        "run resumes from, so of an abandoned lineage (no resume continues it)"
        for part in ("controller", "trainer")
    ]
    set_latest(tmp_path, 4)
    sealed(tmp_path, 6, "B")
    (tmp_path / "latest.json").write_text('{"vers')  # damaged: every checkpoint is tried
    assert latest_complete(tmp_path) == 6 and run_of(tmp_path / "iter-6", "controller") == "B"
    # nothing was deleted: A's v6 and v8, both parts together, are checkpoint directories one can move back
    aside = tmp_path / "abandoned"
    assert sorted(p.name for p in aside.iterdir()) == [f"iter-6.{a6[:12]}", f"iter-8.{sealed_digest(aside, 8)}"]
    for ckpt in aside.iterdir():
        assert read_manifest(ckpt, "trainer") is not None and read_manifest(ckpt, "controller") is not None
        assert run_of(ckpt, "trainer") == run_of(ckpt, "controller") == "A"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["abandoned", "iter-2", "iter-4", "iter-6", "latest.json"]


def sealed_digest(aside: Path, version: int) -> str:
    (ckpt,) = aside.glob(f"iter-{version}.*")
    return file_digest(manifest_path(ckpt, "trainer"))[:12]


def test_a_run_that_starts_over_sets_every_checkpoint_aside_and_nothing_is_overwritten(tmp_path: Path) -> None:
    """A resume from no checkpoint (0) abandons all of them; a part set aside twice (the same version abandoned by
    two resumes) gets a directory of its own."""
    sealed(tmp_path, 2, "A")
    assert set_aside_newer(tmp_path, "trainer", resumed=0, keep=0) == [2]
    assert set_aside_newer(tmp_path, "controller", resumed=0, keep=0) == [2]
    assert set_aside_newer(tmp_path, "controller", resumed=0, keep=0) == []  # done: nothing moves twice
    assert sorted(p.name for p in tmp_path.iterdir()) == ["abandoned"]
    sealed(tmp_path, 2, "B")
    digest = file_digest(manifest_path(tmp_path / "iter-2", "trainer"))[:12]
    shutil.copytree(tmp_path / "iter-2", tmp_path / "abandoned" / f"iter-2.{digest}")  # (as if set aside before)
    set_aside_newer(tmp_path, "trainer", resumed=0, keep=0)
    set_aside_newer(tmp_path, "controller", resumed=0, keep=0)
    aside = tmp_path / "abandoned"
    assert len(list(aside.iterdir())) == 3
    assert run_of(aside / f"iter-2.{digest}.2", "controller") == run_of(aside / f"iter-2.{digest}.2", "trainer") == "B"
    assert read_manifest(aside / f"iter-2.{digest}", "trainer") is not None  # the one there before, untouched


def cut_short(root: Path, version: int) -> None:
    """What the background writer had of the trainer part of `version` when the run died: a shard and part of the
    policy, no manifest."""
    (root / f"iter-{version}" / "ranks").mkdir(parents=True)
    (root / f"iter-{version}" / "ranks" / "rank-0.pt").write_bytes(b"shard")
    (root / f"iter-{version}" / ".model.tmp-123").mkdir()
    (root / f"iter-{version}" / ".model.tmp-123" / "model.safetensors").write_bytes(b"\0" * 4096)


def test_a_part_never_sealed_is_removed_not_set_aside_at_each_auto_resume(tmp_path: Path, caplog) -> None:
    """A trainer node lost five times, each while the next checkpoint was being written: each resume moved that
    unsealed part to abandoned/ (one checkpoint's disk per resume, whatever `keep`), where nothing could ever
    resume from it. It is removed; the lineage's checkpoints stay as `keep` leaves them."""
    complete: list[int] = []
    for v in range(1, 6):
        sealed(tmp_path, v, "A")
        complete.append(v)
        cut_short(tmp_path, v + 1)
        with caplog.at_level("WARNING", logger="rlctl.checkpoint.files"):
            assert set_aside_newer(tmp_path, "trainer", resumed=v, keep=1) == []
        assert set_aside_newer(tmp_path, "controller", resumed=v, keep=1) == []
        for part in ("trainer", "controller"):
            prune(tmp_path, part, complete=complete, keep=1)
    assert not (tmp_path / "abandoned").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter-5"]
    assert caplog.records[-1].getMessage() == (
        f"checkpoints {tmp_path}: removed the trainer part of v[6]: newer than v5, which this run resumes from, and "
        "never sealed (a write cut short: no resume can use it)"
    )


def test_abandoned_keeps_the_keep_newest_sealed_checkpoints_of_each_part(tmp_path: Path) -> None:
    """Three resumes each abandon a sealed checkpoint (v3 of lineages A, B, C): with `keep: 2` the two set aside
    last stay, whole; with `keep: 0` every one does. What an older rlctl set aside unsealed goes either way."""
    aside = tmp_path / "abandoned"
    cut_short(aside, 9)  # (an older rlctl moved unsealed parts too)
    for n, run in enumerate("ABC"):
        sealed(tmp_path, 3, run)
        for part in ("trainer", "controller"):  # sealed an hour apart (the order `keep` goes by)
            os.utime(manifest_path(tmp_path / "iter-3", part), (3600.0 * (n + 1),) * 2)
        for part in ("trainer", "controller"):
            assert set_aside_newer(tmp_path, part, resumed=2, keep=2) == [3]
        assert not (aside / "iter-9").exists()
        assert len(list(aside.iterdir())) == min(n + 1, 2)
    assert sorted(run_of(d, part) for d in aside.iterdir() for part in ("trainer", "controller")) == [
        "B", "B", "C", "C",
    ]  # fmt: skip
    sealed(tmp_path, 3, "D")
    for part in ("trainer", "controller"):
        set_aside_newer(tmp_path, part, resumed=2, keep=0)
    assert sorted(run_of(d, "trainer") for d in aside.iterdir()) == ["B", "C", "D"]


def test_latest_complete_never_pairs_parts_of_two_lineages(tmp_path: Path) -> None:
    """A controller part names the trainer part it was written with; a trainer part rewritten since (another
    run's) does not make the checkpoint complete, even though each part verifies on its own."""
    for v in (2, 4):
        sealed(tmp_path, v, "A")
    text_part(tmp_path / "iter-4", "trainer", json.dumps({"run": "B"}))
    assert latest_complete(tmp_path) == 2
    assert latest_complete(tmp_path, ["trainer"]) == 4


def test_prune_after_a_resume_keeps_the_newest_complete_checkpoint_of_the_run_and_never_the_abandoned(
    tmp_path: Path,
) -> None:
    """`checkpoint.keep: 1`: the resumed run (from v4, A's v6 and v8 set aside) seals v6 and prunes what is older
    than it; the abandoned ones are not prune's (abandoned/ keeps `keep` of its own), and v6 — the newest complete
    one — stays."""
    for v in (2, 4, 6, 8):
        sealed(tmp_path, v, "A")
    for part in ("controller", "trainer"):
        set_aside_newer(tmp_path, part, resumed=4, keep=1)
    sealed(tmp_path, 6, "B")
    set_latest(tmp_path, 6)
    for part in ("controller", "trainer"):
        assert prune(tmp_path, part, complete=[4, 6], keep=1) == [2, 4]
    (tmp_path / "latest.json").unlink()
    assert latest_complete(tmp_path) == 6 and run_of(tmp_path / "iter-6", "trainer") == "B"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["abandoned", "iter-6"]
    # abandoned/ holds `keep` of what was set aside there: A's v8, sealed last
    assert [p.name.split(".")[0] for p in (tmp_path / "abandoned").iterdir()] == ["iter-8"]


def trained_model(steps: int) -> tuple[TinyGPT, torch.optim.AdamW]:
    torch.manual_seed(0)
    model = TinyGPT(small_config())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        train_step(model, opt)
    return model, opt


def train_step(model: TinyGPT, opt: torch.optim.Optimizer) -> None:
    loss = model(torch.randint(0, 60, (2, 8))).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_trainer_state_round_trips_exactly(tmp_path: Path) -> None:
    model, opt = trained_model(3)
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    saved_params = {k: v.clone() for k, v in model.state_dict().items()}
    saved_opt = opt.state_dict()
    digest = save_trainer(
        tmp_path / "iter-3",
        model=model,
        optimizers={"policy": opt},
        counters={"version": 3},
        split=ONE,
        data_parallel=ALONE,
    )
    after = (random.random(), float(np.random.rand()), float(torch.rand(1)))

    other, other_opt = trained_model(5)  # a different state, restored into
    counters, got = load_trainer(
        tmp_path / "iter-3", model=other, optimizers={"policy": other_opt}, split=ONE, data_parallel=ALONE, version=3
    )
    assert counters == {"version": 3} and got == digest
    assert all(torch.equal(other.state_dict()[k], v) for k, v in saved_params.items())
    restored = other_opt.state_dict()
    assert restored["param_groups"] == saved_opt["param_groups"]
    for i, st in saved_opt["state"].items():
        assert all(torch.equal(restored["state"][i][k], v) for k, v in st.items())
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == after  # RNG streams continue
    manifest = read_manifest(tmp_path / "iter-3", "trainer")
    assert manifest is not None and manifest["optimizer_sha256"] == optimizer_digest({"policy": other_opt})
    assert manifest["split"] == {"tp": 1, "pp": 1, "dp": 1, "world": 1}
    assert manifest["ranks"] == [
        {"rank": 0, "file": "ranks/rank-0.pt", "optimizer_sha256": manifest["optimizer_sha256"], "restored_by": [0]}
    ]
    assert "ranks/rank-0.pt" in manifest["files"]
    assert optimizer_digest({"policy": trained_model(4)[1]}) != manifest["optimizer_sha256"]


def test_a_resume_reads_the_checkpoints_policy_without_rope_tables_of_its_every_position(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the weights of the checkpoint's model are read into the trainer's, no model built of them: no tables of
    max_position_embeddings positions (1,024,000 for Mistral Nemo: ≈ 1 GiB, and twice that while they are made)
    beside the policy's."""
    model, opt = trained_model(3)
    save_trainer(
        tmp_path / "iter-3", model=model, optimizers={"policy": opt}, counters={}, split=ONE, data_parallel=ALONE
    )
    tables = rope_rows_loaded(monkeypatch)
    other, other_opt = trained_model(5)
    load_trainer(
        tmp_path / "iter-3", model=other, optimizers={"policy": other_opt}, split=ONE, data_parallel=ALONE, version=3
    )
    assert tables == []
    assert all(torch.equal(other.state_dict()[k], v) for k, v in model.state_dict().items())


def test_a_phi3_policy_resumes_from_its_checkpoints_fused_file(tmp_path: Path) -> None:
    """A Phi3 checkpoint's model holds q/k/v and gate/up fused, as transformers writes them; a resume reads them back
    into the trainer's model, whose names are Llama's."""
    torch.manual_seed(0)
    config = dataclasses.replace(small_config(heads=4), architecture="Phi3ForCausalLM")
    model, other = TinyGPT(config), TinyGPT(config)
    opt = torch.optim.AdamW(model.parameters())
    save_trainer(
        tmp_path / "iter-1", model=model, optimizers={"policy": opt}, counters={}, split=ONE, data_parallel=ALONE
    )
    written = load_state_dict(tmp_path / "iter-1" / "model")
    assert "model.layers.0.self_attn.qkv_proj.weight" in written and "model.layers.0.mlp.up_proj.weight" not in written
    load_trainer(
        tmp_path / "iter-1", model=other, optimizers={"policy": torch.optim.AdamW(other.parameters())}, split=ONE,
        data_parallel=ALONE, version=1,
    )  # fmt: skip
    assert all(torch.equal(other.state_dict()[k], v) for k, v in model.state_dict().items())


def test_a_damaged_trainer_part_is_refused_with_the_checkpoint_named(tmp_path: Path) -> None:
    model, opt = trained_model(1)
    save_trainer(
        tmp_path / "iter-1",
        model=model,
        optimizers={"policy": opt},
        counters={"version": 1},
        split=ONE,
        data_parallel=ALONE,
    )
    shard = next((tmp_path / "iter-1" / "model").glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-1] + b"\0")
    with pytest.raises(CheckpointError, match=r"iter-1: the trainer's part is not usable: model/.* does not match"):
        load_trainer(
            tmp_path / "iter-1", model=model, optimizers={"policy": opt}, split=ONE, data_parallel=ALONE, version=1
        )


def test_a_damaged_or_missing_rank_shard_and_another_split_are_refused_naming_the_rank(tmp_path: Path) -> None:
    model, opt = trained_model(1)
    ckpt = tmp_path / "iter-1"
    save_trainer(ckpt, model=model, optimizers={"policy": opt}, counters={"version": 1}, split=ONE, data_parallel=ALONE)
    with pytest.raises(CheckpointError, match=r"iter-1: written by a trainer at tp 1 pp 1 dp 1, which this trainer "
                       r"\(tp 2 pp 1 dp 1\) cannot load"):  # fmt: skip
        load_trainer(
            ckpt,
            model=model,
            optimizers={"policy": opt},
            split=ParallelConfig("trainer", tp=2),
            data_parallel=ALONE,
            version=1,
        )
    shard = ckpt / "ranks" / "rank-0.pt"
    body = shard.read_bytes()
    shard.write_bytes(body[:100] + bytes([body[100] ^ 1]) + body[101:])  # one flipped bit
    with pytest.raises(CheckpointError, match=r"iter-1: rank 0's shard is not usable: ranks/rank-0.pt does not match"):
        load_trainer(ckpt, model=model, optimizers={"policy": opt}, split=ONE, data_parallel=ALONE, version=1)
    shard.unlink()
    with pytest.raises(CheckpointError, match=r"iter-1: rank 0's shard is not usable: ranks/rank-0.pt is missing"):
        load_trainer(ckpt, model=model, optimizers={"policy": opt}, split=ONE, data_parallel=ALONE, version=1)
    assert read_manifest(ckpt, "trainer") is None  # nor does the launcher pick it (verified_manifest)


def test_prune_keeps_the_newest_complete_checkpoints_and_any_newer_part(tmp_path: Path) -> None:
    """Only checkpoints older than the `keep`-th newest complete one lose the part; a newer part not yet
    complete (its other part not written) stays; the directory goes once both parts are gone; keep 0: none."""
    for v in (1, 2, 3, 4):
        for part in ("trainer", "controller"):
            text_part(tmp_path / f"iter-{v}", part, json.dumps({"v": v}))
    (tmp_path / "iter-1" / ".trainer.tmp-99").mkdir()  # a crashed write's leftover
    text_part(tmp_path / "iter-5", "trainer", "{}")  # written, not yet complete
    assert prune(tmp_path, "trainer", complete=[1, 2, 3, 4], keep=0) == []
    assert prune(tmp_path, "trainer", complete=[1], keep=2) == []  # fewer complete than keep: nothing goes
    assert prune(tmp_path, "trainer", complete=[1, 2, 3, 4], keep=2) == [1, 2]
    assert read_manifest(tmp_path / "iter-2", "trainer") is None
    assert read_manifest(tmp_path / "iter-2", "controller") is not None  # the other part is its writer's
    assert read_manifest(tmp_path / "iter-5", "trainer") is not None
    assert prune(tmp_path, "controller", complete=[1, 2, 3, 4], keep=2) == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter-3", "iter-4", "iter-5"]
    set_latest(tmp_path, 4)
    assert latest_complete(tmp_path) == 4


def test_a_resumed_run_prunes_the_older_checkpoints_at_its_first_one_as_keep_says(tmp_path: Path) -> None:
    """`checkpoint.keep: 3`, v1–v3 on disk, resumed from v3 (each side knows only v3 complete): once v4 is complete
    the 3 newest are v2–v4 and v1 goes, versus every one kept until the run had sealed v5 itself (4 checkpoints
    on disk after v4, 5 while v5 was written, where `checkpoints_held` counts 4; found by the property test of
    writes, crashes and resumes)."""
    for v in (1, 2, 3):
        sealed(tmp_path, v, "A")
    for part in ("controller", "trainer"):
        set_aside_newer(tmp_path, part, resumed=3, keep=3)
    sealed(tmp_path, 4, "B")
    set_latest(tmp_path, 4)
    for part in ("controller", "trainer"):
        assert prune(tmp_path, part, complete=[3, 4], keep=3) == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter-2", "iter-3", "iter-4", "latest.json"]
    assert prune(tmp_path, "trainer", complete=[4], keep=3) == []  # a part sealed is counted only below those known
    assert latest_complete(tmp_path) == 4


def test_a_manifests_temporary_a_crash_left_goes_with_its_part_and_the_directory_too(tmp_path: Path) -> None:
    """An agent killed as it renamed its part's manifest into place leaves `.MANIFEST.<part>.json.tmp-<pid>`; the run
    resumed after it (another pid) seals the part under its own. A prune of that checkpoint, or a resume's removal
    of it never sealed, takes the temporary and then the directory, versus iter-N left for good with the file in it
    (every later prune listed it again; found by the property test of writes, crashes and resumes)."""
    for v in (1, 2):
        sealed(tmp_path, v, "A")
    (tmp_path / "iter-1" / ".MANIFEST.controller.json.tmp-4242").write_text('{"files": {}}')
    (tmp_path / "iter-1" / ".MANIFEST.trainer.json.tmp-4243").write_text("{")
    for part in ("controller", "trainer"):
        assert prune(tmp_path, part, complete=[1, 2], keep=1) == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter-2"]
    (tmp_path / "iter-3" / "controller").mkdir(parents=True)  # cut short as its manifest was renamed
    (tmp_path / "iter-3" / ".MANIFEST.controller.json.tmp-4242").write_text('{"files": {}}')
    assert set_aside_newer(tmp_path, "controller", resumed=2, keep=1) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter-2"]


def test_a_background_checkpoint_holds_the_state_of_its_snapshot_not_of_the_steps_after(tmp_path: Path) -> None:
    model, opt = trained_model(3)
    saved_params = {k: v.clone() for k, v in model.state_dict().items()}
    saved_digest = optimizer_digest({"policy": opt})
    write = snapshot_trainer(
        tmp_path / "iter-3",
        model=HostPolicy(model.state_dict(), model.config),
        optimizers={"policy": opt},
        counters={"version": 3},
        split=ONE,
        data_parallel=ALONE,
    )
    assert read_manifest(tmp_path / "iter-3", "trainer") is None  # nothing written yet
    for _ in range(2):  # training goes on before the write: steps change the parameters and moments in place
        train_step(model, opt)
    writer = BackgroundWriter()
    writer.submit(write)
    writer.wait()
    other, other_opt = trained_model(4)
    _, digest = load_trainer(
        tmp_path / "iter-3", model=other, optimizers={"policy": other_opt}, split=ONE, data_parallel=ALONE, version=3
    )
    manifest = read_manifest(tmp_path / "iter-3", "trainer")
    assert manifest is not None and digest == manifest["digest"]
    assert optimizer_digest({"policy": other_opt}) == saved_digest != optimizer_digest({"policy": opt})
    assert all(torch.equal(other.state_dict()[k], v) for k, v in saved_params.items())


def test_the_background_writer_writes_one_at_a_time_and_raises_a_writes_error_in_the_training_thread() -> None:
    order: list[str] = []
    gate = threading.Event()

    def slow() -> None:
        gate.wait(5)
        order.append("first")

    def failing() -> None:
        order.append("second")
        raise OSError("disk full")

    writer = BackgroundWriter()
    writer.submit(slow)
    assert writer.busy()
    threading.Timer(0.5, gate.set).start()
    writer.submit(failing)  # waits for the first write (about 0.5 s; 0.1 s is the bound a late start leaves)
    with pytest.raises(OSError, match="disk full"):
        writer.wait()
    assert order == ["first", "second"] and writer.writes == 2 and writer.blocked_s >= 0.1
    writer.wait()  # the error was raised once


def _fsynced_inodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The inodes the checkpoint code fsyncs from now on, in the order it does (each call still syncs)."""
    from rlctl.checkpoint import files

    synced: list[int] = []
    real = files.os.fsync

    def fsync(fd: int) -> None:
        synced.append(files.os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(files.os, "fsync", fsync)
    return synced


def test_every_file_and_directory_latest_names_is_fsynced_before_it_does(tmp_path: Path, monkeypatch) -> None:
    # the model's files, the controller's ledger and state, and the directories' renames were never synced: after a
    # power loss they could read back empty, and `keep` had already removed the checkpoint before it
    from rlctl.agents.ledger import Ledger
    from rlctl.checkpoint.controller import save_controller
    from rlctl.launch.jobdir import JobDir

    synced = _fsynced_inodes(monkeypatch)
    jd = JobDir(tmp_path)
    torch.manual_seed(0)
    model = TinyGPT(small_config())
    opt = torch.optim.AdamW(model.parameters())
    ckpt = jd.checkpoint(10)
    digest = save_trainer(
        ckpt, model=model, optimizers={"policy": opt}, counters={"version": 10}, split=ONE, data_parallel=ALONE
    )
    state = {"iteration": 10, "ranker": {"tokens": [], "lengths": []}, "rebalance_window": [], "samples_log_bytes": 0}
    save_controller(jd, 10, state=state, ledger=Ledger(), trainer_digest=digest)
    entries = [p for p in ckpt.rglob("*")]
    assert [p for p in entries if p.is_file()] and [p for p in entries if p.is_dir()]
    unsynced = [p for p in [*entries, ckpt, jd.checkpoints] if p.stat().st_ino not in synced]
    assert unsynced == [] and latest_complete(jd.checkpoints) == 10


def test_the_sample_log_a_checkpoints_ledger_relies_on_is_fsynced_before_latest_names_it(
    tmp_path: Path, monkeypatch
) -> None:
    # the ledger.json of a checkpoint holds only the rounds in flight; the retired ones are the sample log's first
    # samples_log_bytes, which was only flushed: a power loss after `latest` moved could lose them from both
    from rlctl.agents.ledger import Ledger
    from rlctl.checkpoint.controller import save_controller
    from rlctl.launch.jobdir import JobDir

    synced = _fsynced_inodes(monkeypatch)
    jd = JobDir(tmp_path)
    jd.samples.write_text('{"sample_id": "p0/0"}\n')  # the rounds retired before the checkpoint
    state = {"iteration": 2, "ranker": {"tokens": [], "lengths": []}, "rebalance_window": []}
    save_controller(
        jd, 2, state=state | {"samples_log_bytes": jd.samples.stat().st_size}, ledger=Ledger(), trainer_digest="d" * 64
    )
    latest = (jd.checkpoints / "latest.json").stat().st_ino
    assert jd.samples.stat().st_ino in synced[: synced.index(latest)]
    assert tmp_path.stat().st_ino in synced  # its name in the job dir too


def test_the_metrics_and_evaluations_a_resume_keeps_are_fsynced_before_latest_names_the_checkpoint(
    tmp_path: Path, monkeypatch
) -> None:
    # a resume keeps the rows before the checkpoint (cut_metrics, cut_evaluations) of what is on disk: rows only
    # flushed could be lost to a power loss after `latest` moved, a gap in the job's curves for good
    from rlctl.agents.ledger import Ledger
    from rlctl.checkpoint.controller import save_controller
    from rlctl.launch.jobdir import JobDir

    synced = _fsynced_inodes(monkeypatch)
    jd = JobDir(tmp_path)
    jd.append(jd.metrics, {"iteration": 0, "reward_mean": 0.5})
    jd.append(jd.evaluations, {"version": 0, "accuracy": 0.1})
    state = {"iteration": 1, "ranker": {"tokens": [], "lengths": []}, "rebalance_window": [], "samples_log_bytes": 0}
    save_controller(jd, 1, state=state, ledger=Ledger(), trainer_digest="d" * 64)
    before_latest = synced[: synced.index((jd.checkpoints / "latest.json").stat().st_ino)]
    assert jd.metrics.stat().st_ino in before_latest and jd.evaluations.stat().st_ino in before_latest
    assert tmp_path.stat().st_ino in before_latest


def test_the_metrics_a_resume_keeps_are_fsynced_as_it_rewrites_them(tmp_path: Path, monkeypatch) -> None:
    # cut_metrics rewrites metrics.jsonl (temporary file, rename) with the rows before the checkpoint: unsynced, a
    # power loss after the rename could leave it empty, every row `sync_logs` had made durable lost for good
    from rlctl.checkpoint.controller import cut_metrics
    from rlctl.launch.jobdir import JobDir

    jd = JobDir(tmp_path)
    for i in range(3):
        jd.append(jd.metrics, {"iteration": i, "reward_mean": 0.1 * i})
    synced = _fsynced_inodes(monkeypatch)
    assert [r["iteration"] for r in cut_metrics(jd, 2)] == [0, 1]
    aside = tmp_path / "metrics.discarded.jsonl"
    assert [r["iteration"] for r in jd.read_lines(aside)] == [2]
    kept = synced.index(jd.metrics.stat().st_ino)  # the rewritten file, before its rename
    assert aside.stat().st_ino in synced[:kept]  # the row set aside is on disk before the file loses it
    assert tmp_path.stat().st_ino in synced[kept:]  # then the rename


def test_a_resume_sets_aside_a_metrics_row_without_a_number_for_its_iteration(tmp_path: Path) -> None:
    # int(r["iteration"]) raised on null (TypeError) or text (ValueError): the resumed controller died as it started
    from rlctl.checkpoint.controller import cut_metrics
    from rlctl.launch.jobdir import JobDir

    jd = JobDir(tmp_path)
    for i in (None, "x", 0, True, 1.0, 2):
        jd.append(jd.metrics, {"iteration": i, "reward_mean": 0.5})
    assert [r["iteration"] for r in cut_metrics(jd, 2)] == [0, 1.0]
    assert [r["iteration"] for r in jd.read_lines(tmp_path / "metrics.discarded.jsonl")] == [None, "x", True, 2]


def test_a_shard_write_that_failed_leaves_no_partial_file(tmp_path: Path, monkeypatch) -> None:
    # a full disk left ranks/.rank-0.pt.tmp-PID inside the checkpoint, never counted or removed
    def full(obj: object, f: object) -> None:
        f.write(b"x" * 1000)  # type: ignore[attr-defined]
        raise RuntimeError("No space left on device")

    monkeypatch.setattr(torch, "save", full)
    model = TinyGPT(small_config())
    with pytest.raises(Exception, match="could not write its shard"):
        save_trainer(tmp_path / "iter-1", model=model, optimizers={"policy": torch.optim.AdamW(model.parameters())},
                     counters={"version": 1}, split=ONE, data_parallel=ALONE)  # fmt: skip
    assert not list((tmp_path / "iter-1").rglob(".*tmp-*"))


def test_an_unsharded_trainers_checkpoint_keeps_fp32_masters_under_the_jobs_model_dtype(tmp_path: Path) -> None:
    """A job on a bf16 model: its checkpoint holds the fp32 master weights (a resume continues from them exactly)
    and declares bf16, as a sharded trainer's checkpoint of the published version does, so transformers (dtype
    auto), a next job's planner and engines take it as the bf16 model it is, not an fp32 one of twice the bytes."""
    import dataclasses

    import transformers

    from rlctl.models import hf

    model, _ = trained_model(1)
    config = dataclasses.replace(model.config, torch_dtype="bfloat16")  # the job's model came in bf16
    HostPolicy(model.state_dict(), config).save_pretrained(tmp_path / "model")
    assert json.loads((tmp_path / "model" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert hf.read_config(tmp_path / "model").torch_dtype == "bfloat16"
    again = TinyGPT.from_pretrained(tmp_path / "model", dtype=torch.float32)  # what a resumed trainer loads
    assert all(torch.equal(again.state_dict()[k], v) for k, v in model.state_dict().items())
    served = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype="auto")
    assert served.dtype == torch.bfloat16


def test_a_shard_write_on_a_full_disk_says_so_with_the_free_bytes_and_the_directory(
    tmp_path: Path, monkeypatch
) -> None:
    # torch.save on a full disk says only `unexpected pos 551872 vs 551764`: the job failed naming that, and the
    # hint sent the operator to a resume that hit the same full disk
    def full(obj: object, f: object) -> None:
        f.write(b"x" * 1000)  # type: ignore[attr-defined]
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 551872 vs 551764")

    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: SimpleNamespace(total=10**9, used=10**9 - 4096, free=4096))
    model = TinyGPT(small_config())
    with pytest.raises(CheckpointError) as e:
        save_trainer(tmp_path / "iter-8", model=model, optimizers={"policy": torch.optim.AdamW(model.parameters())},
                     counters={"version": 8}, split=ONE, data_parallel=ALONE)  # fmt: skip
    ranks = tmp_path / "iter-8" / "ranks"
    assert e.value.full_dir == str(tmp_path)  # the checkpoints' directory (iter-8 is set aside by the resume)
    assert f"rank 0 could not write its shard ranks/rank-0.pt: the disk is full: 4,096 B free in {ranks} (" in str(
        e.value
    )
    assert "unexpected pos 551872 vs 551764" in str(e.value)  # what torch said, kept


def test_the_policys_safetensors_on_a_full_disk_say_so_too(tmp_path: Path, monkeypatch) -> None:
    # safetensors raises its own SafetensorError (not an OSError): the full disk went out as that error, unsaid
    import safetensors.torch
    from safetensors import SafetensorError

    def full(*_: object, **__: object) -> None:
        raise SafetensorError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
        )

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    model = TinyGPT(small_config())
    with pytest.raises(CheckpointError) as e:
        save_trainer(tmp_path / "iter-8", model=model, optimizers={"policy": torch.optim.AdamW(model.parameters())},
                     counters={"version": 8}, split=ONE, data_parallel=ALONE)  # fmt: skip
    assert e.value.full_dir == str(tmp_path)
    assert f"{tmp_path / 'iter-8'}: the policy could not be written: the disk is full: " in str(e.value)


def test_a_full_disk_is_the_error_said_before_another_ranks(tmp_path: Path) -> None:
    from rlctl.checkpoint.trainer import _seal

    split = ParallelConfig("trainer", tp=2)  # two shards, ranks 0 and 1
    records = [
        {"rank": 0, "replicas": [0], "file": "ranks/rank-0.pt", "error": "RuntimeError: gone"},
        {"rank": 1, "replicas": [1], "file": "ranks/rank-1.pt", "error": "the disk is full: …", "full_dir": "/d"},
    ]
    with pytest.raises(CheckpointError) as e:
        _seal(tmp_path, records, model=TinyGPT(small_config()), counters={}, split=split, tokenizer_from=None)
    assert e.value.full_dir == "/d" and "rank 1 could not write" in str(e.value)


def test_a_trainer_part_lost_to_a_full_disk_fails_the_job_saying_to_free_space_before_resuming(tmp_path: Path) -> None:
    from rlctl.agents.messages import CheckpointWritten
    from tests.unit.controller_harness import HandledController, small_job

    h = HandledController(tmp_path, small_job("full", iterations=6), listen="inproc://full-disk-checkpoint")
    try:
        h.ctl.writing[8] = ({}, "{}", [])
        error = "CheckpointError: …: the disk is full: 4,096 B free in /d/iter-8/ranks (…)"
        assert h.ctl._checkpoint(CheckpointWritten(version=8, error=error, full_dir="/d/iter-8/ranks")) == []
        assert h.ctl.core.failed == (
            f"the trainer could not write its part of checkpoint iter-8: {error}; free space in /d/iter-8/ranks "
            f"first; continue the job with `rlctl launch --resume {h.jd.path.name}`"
        )
    finally:
        h.close()


def test_a_checkpoints_rng_states_touch_only_the_cuda_device_the_rank_computes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process that has not initialised CUDA (a CPU trainer on a GPU host) asked for every visible device's RNG
    state, initialising CUDA there; a GPU rank saved every visible device's and restored them only where the counts
    matched, so a SLURM task computing on its node's SLURM_LOCALID-th GPU never had its own state back."""
    from rlctl.checkpoint import trainer as ckpt

    def initialise(*args: object) -> None:
        raise AssertionError("CUDA initialised by a CPU trainer's checkpoint")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", initialise)
    monkeypatch.setattr(torch.cuda, "get_rng_state", initialise)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    state = ckpt.rng_state()  # a CPU trainer
    assert not [k for k in state if k.startswith("cuda")]
    ckpt.set_rng_state(state)

    events: list[tuple[str, int, int]] = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # a GPU rank on device 3 of 8 visible
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: torch.tensor([device], dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, device: events.append(("set", device, int(s[0]))))
    state = ckpt.rng_state()
    assert [k for k in state if k.startswith("cuda")] == ["cuda"]
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 5)  # replica 0's state, restored on another rank
    ckpt.set_rng_state(state)
    old = {k: v for k, v in state.items() if k != "cuda"} | {
        f"cuda.{i}": torch.tensor([i], dtype=torch.uint8) for i in range(8)
    }
    ckpt.set_rng_state(old)  # a checkpoint written before: this device's entry
    assert events == [("set", 5, 3), ("set", 5, 5)]


def test_the_steps_skipped_in_a_row_before_a_checkpoint_count_on_in_the_run_resumed_from_it(
    tmp_path: Path, monkeypatch
) -> None:
    """`trainer.skip_nonfinite: 3`: iterations 1–3 skipped their step (a gradient not finite), then the checkpoint
    v4 and a crash. The run resumed from v4 takes its first skipped step for the fourth in a row (and fails, naming v1,
    whose weights it still has), versus a count started over at each resume: three more skipped steps a resume (an
    auto-resume loop trained nothing for as long as it had resumes) and a failure naming the resume's version."""
    import time

    from rlctl.agents import views
    from rlctl.agents.controller import ControllerAgent
    from rlctl.agents.messages import CheckpointWritten
    from rlctl.launch.agentenv import ENV_RESUME
    from rlctl.transport import InprocTransport
    from tests.unit.controller_harness import HandledController, small_job

    job = small_job("skips", iterations=8)
    h = HandledController(tmp_path, job, listen="inproc://skips-a")
    try:
        h.ctl.core.skipped_in_a_row = [1, 2, 3]  # as `core.trained` left it after iterations 1–3 skipped
        h.ctl._checkpoint_due(4)
        assert h.ctl._checkpoint(CheckpointWritten(version=4, checkpoint="d" * 64))
    finally:
        h.close()
    monkeypatch.setenv(ENV_RESUME, "4")
    ctl = ControllerAgent(h.jd, job, InprocTransport(secret=h.jd.secret()), listen="inproc://skips-b")
    try:
        # the next skipped step is the fourth in a row (`core.trained` fails the job past skip_nonfinite:
        # test_agents_core's test_more_skipped_steps_in_a_row_than_the_job_takes_fail_it); status says 3 so far
        assert ctl.core.skipped_in_a_row == [1, 2, 3]
        assert views.status(ctl.snapshot(), now=time.monotonic())["training"]["skipped_in_a_row"] == 3
    finally:
        ctl.listener.close()
        threading.Thread(target=ctl.metrics.close, daemon=True).start()


def test_the_staleness_violations_before_a_checkpoint_stay_in_the_summary_of_the_run_resumed_from_it(
    tmp_path: Path, monkeypatch
) -> None:
    """The trainer reported a sample staler than η before checkpoint v2 (the invariant broken, in the weights for
    good); the run resumed from v2 says so in its status and summary, versus staleness_violations 0 (each resume
    started the count over, and a job's summary after a resume read as if the bound had held)."""
    import time

    from rlctl.agents import views
    from rlctl.agents.controller import ControllerAgent
    from rlctl.agents.messages import CheckpointWritten
    from rlctl.launch.agentenv import ENV_RESUME
    from rlctl.transport import InprocTransport
    from tests.unit.controller_harness import HandledController, small_job

    job = small_job("stale", iterations=6)
    h = HandledController(tmp_path, job, listen="inproc://stale-a")
    try:
        h.ctl.violations = 1  # as `_trained` counted the trainer's `staleness_violations` of an iteration before v2
        h.ctl._checkpoint_due(2)
        assert h.ctl._checkpoint(CheckpointWritten(version=2, checkpoint="d" * 64))
    finally:
        h.close()
    monkeypatch.setenv(ENV_RESUME, "2")
    ctl = ControllerAgent(h.jd, job, InprocTransport(secret=h.jd.secret()), listen="inproc://stale-b")
    try:
        assert views.status(ctl.snapshot(), now=time.monotonic())["staleness_violations"] == 1
        # … and its gauge, the job's as status's; the counter counts this controller's (none: a resume pages nothing)
        assert ctl.metrics.registry.get_sample_value("rlctl_job_staleness_violations") == 1.0
        assert ctl.metrics.registry.get_sample_value("rlctl_sample_staleness_violations_total") == 0.0
    finally:
        ctl.listener.close()
        threading.Thread(target=ctl.metrics.close, daemon=True).start()


def test_the_latest_complete_checkpoint_is_a_gauge_in_the_run_that_wrote_it_and_the_run_resumed_from_it(
    tmp_path: Path, monkeypatch
) -> None:
    """rlctl_checkpoint_version: NaN before the first, each checkpoint once both parts are complete (not one whose
    trainer part failed), and the resumed run's from its start, versus `rlctl status` alone (Prometheus had nothing
    of how many iterations a crash of a weeks-long run would lose)."""
    import math

    from rlctl.agents.controller import ControllerAgent
    from rlctl.agents.messages import CheckpointWritten
    from rlctl.launch.agentenv import ENV_RESUME
    from rlctl.transport import InprocTransport
    from tests.unit.controller_harness import HandledController, small_job

    job = small_job("gauged", iterations=6)
    h = HandledController(tmp_path, job, listen="inproc://gauged-a")
    try:
        value = h.ctl.metrics.registry.get_sample_value
        assert math.isnan(value("rlctl_checkpoint_version"))
        h.ctl._checkpoint_due(2)
        assert math.isnan(value("rlctl_checkpoint_version"))  # its trainer part still being written
        assert h.ctl._checkpoint(CheckpointWritten(version=2, checkpoint="d" * 64))
        assert value("rlctl_checkpoint_version") == 2.0
        h.ctl._checkpoint_due(4)
        assert h.ctl._checkpoint(CheckpointWritten(version=4, error="disk full")) == []
        assert value("rlctl_checkpoint_version") == 2.0  # v4 never completed
    finally:
        h.close()
    monkeypatch.setenv(ENV_RESUME, "2")
    ctl = ControllerAgent(h.jd, job, InprocTransport(secret=h.jd.secret()), listen="inproc://gauged-b")
    try:
        assert ctl.metrics.registry.get_sample_value("rlctl_checkpoint_version") == 2.0
    finally:
        ctl.listener.close()
        threading.Thread(target=ctl.metrics.close, daemon=True).start()


def test_the_reward_failures_before_a_checkpoint_stay_in_the_summary_of_the_run_resumed_from_it(
    tmp_path: Path, monkeypatch
) -> None:
    """Reward calls failed (scored task.reward_on_error) before checkpoint v2; the run resumed from v2 counts them in
    its summary's `reward_failures` and `rewards`, as `iterations` counts the job's, versus 0 (the pool's counts are
    the run's, and the failures before a resume disappeared from the summary and its reward-failures line)."""
    import time

    from rlctl.agents import views
    from rlctl.agents.controller import ControllerAgent
    from rlctl.agents.messages import CheckpointWritten
    from rlctl.launch.agentenv import ENV_RESUME
    from rlctl.render import reward_failures_line
    from rlctl.rl.reward_pool import RewardStats
    from rlctl.transport import InprocTransport
    from tests.unit.controller_harness import HandledController, small_job

    job = small_job("rewfail", iterations=6)
    h = HandledController(tmp_path, job, listen="inproc://rewfail-a")
    try:
        failed = RewardStats(calls=10, errors=2, timeouts=1, first_failure="error: s1 boom")
        monkeypatch.setattr(h.ctl.task, "reward_stats", lambda: failed)  # the pool's counts up to v2
        h.ctl._checkpoint_due(2)
        assert h.ctl._checkpoint(CheckpointWritten(version=2, checkpoint="d" * 64))
    finally:
        h.close()
    monkeypatch.setenv(ENV_RESUME, "2")
    ctl = ControllerAgent(h.jd, job, InprocTransport(secret=h.jd.secret()), listen="inproc://rewfail-b")
    try:
        later = RewardStats(calls=4, bad_type=1, first_failure="bad_type: s9")
        monkeypatch.setattr(ctl.task, "reward_stats", lambda: later)  # the resumed run's pool
        snap = ctl.snapshot()
        rewards = views.summary(snap)["rewards"]
        assert (rewards["calls"], rewards["errors"], rewards["timeouts"], rewards["bad_type"]) == (14, 2, 1, 1)
        assert rewards["first_failure"] == "error: s1 boom"
        assert views.status(snap, now=time.monotonic())["rewards"]["calls"] == 14
        line = reward_failures_line(rewards)
        assert line is not None and line.startswith("4 of 14 calls")
    finally:
        ctl.listener.close()
        threading.Thread(target=ctl.metrics.close, daemon=True).start()


def test_a_second_resume_from_a_checkpoint_does_not_set_aside_the_rounds_the_first_retired_from_its_ledger(
    tmp_path: Path, monkeypatch
) -> None:
    """Checkpoint v1's ledger holds round 0 trained, not yet retired: each resume from v1 retires it to the sample
    log. A second resume from v1 (the first died before its next checkpoint) keeps those lines and sets aside only
    what the first run retired itself, versus setting round 0 aside too: samples_discarded counted its 4 trained
    samples, and samples.discarded.jsonl held them, each resume from v1 once more."""
    from rlctl.agents.controller import ControllerAgent
    from rlctl.agents.ledger import Entry, Ledger, State
    from rlctl.agents.samplelog import SampleLog
    from rlctl.checkpoint.controller import save_controller
    from rlctl.launch.agentenv import ENV_RESUME
    from rlctl.transport import InprocTransport
    from tests.unit.controller_harness import HandledController, small_job

    job = small_job("twice", iterations=4)
    h = HandledController(tmp_path, job, listen="inproc://twice-a")
    h.close()
    jd = h.jd
    led = Ledger()
    for g in range(2):  # round 0: two groups of two, trained
        for sid in led.add_prompt(iteration=0, prompt_id=f"q{g}", num_samples=2):
            led.dispatch(sid, agent="rollout-0", version=0)
            led.finish(sid, agent="rollout-0", version=0, output_tokens=5)
            led.deliver(sid)
            led.mark_trained(sid)
    state = {"iteration": 1, "ranker": {"tokens": [], "lengths": []}, "rebalance_window": [], "samples_log_bytes": 0}
    save_controller(jd, 1, state=state, ledger=led, trainer_digest="d" * 64)
    monkeypatch.setenv(ENV_RESUME, "1")

    def resume(listen: str) -> None:
        ctl = ControllerAgent(jd, job, InprocTransport(secret=jd.secret()), listen=listen)
        ctl.samples.close()
        ctl.listener.close()
        threading.Thread(target=ctl.metrics.close, daemon=True).start()

    resume("inproc://twice-b")
    assert [r["sample_id"] for r in jd.read_lines(jd.samples)] == ["q0/0", "q0/1", "q1/0", "q1/1"]
    own = Entry(sample_id="q2/0", prompt_id="q2", iteration=1, round=1, state=State.TRAINED)
    SampleLog(jd.samples).write([own])  # a line the first resumed run retired itself
    resume("inproc://twice-c")
    assert [e["samples_discarded"] for e in jd.read_events("resumed_from")] == [0, 1]
    assert [r["sample_id"] for r in jd.read_lines(jd.samples)] == ["q0/0", "q0/1", "q1/0", "q1/1"]
    assert [r["sample_id"] for r in jd.read_lines(tmp_path / "job" / "samples.discarded.jsonl")] == ["q2/0"]


def test_a_resume_that_lowers_the_iterations_counts_only_the_samples_it_generates_again(
    tmp_path: Path, monkeypatch
) -> None:
    """Checkpoint v1 holds rounds 0–2 untrained (4 samples each); the resume lowers the job to 2 iterations, so round
    2 is never generated: its `resumed_from` event says 8 samples to generate again, versus 12 (counted before the
    rounds past the new count were taken out)."""
    from rlctl.agents.controller import ControllerAgent
    from rlctl.checkpoint.controller import save_controller
    from rlctl.launch.agentenv import ENV_RESUME
    from rlctl.transport import InprocTransport
    from tests.unit.controller_harness import HandledController, small_job

    job = small_job("lower", iterations=6)
    h = HandledController(tmp_path, job, listen="inproc://lower-a")
    try:
        h.ctl.core._create(2)  # rounds 0 and 1 are out, round 2 drawn ahead
        assert sorted({e.round for e in h.ctl.core.ledger.entries.values()}) == [0, 1, 2]
        state = {"iteration": 1, "ranker": {"tokens": [], "lengths": []}, "rebalance_window": []}
        save_controller(
            h.jd, 1, state=state | {"samples_log_bytes": 0}, ledger=h.ctl.core.ledger, trainer_digest="d" * 64
        )
    finally:
        h.close()
    monkeypatch.setenv(ENV_RESUME, "1")
    lowered = job.model_copy(update={"iterations": 2})
    ctl = ControllerAgent(h.jd, lowered, InprocTransport(secret=h.jd.secret()), listen="inproc://lower-b")
    try:
        assert len(ctl.core.ledger.entries) == 8
        assert [e["regenerate"] for e in h.jd.read_events("resumed_from")] == [8]
    finally:
        ctl.listener.close()
        threading.Thread(target=ctl.metrics.close, daemon=True).start()


SCALE_OUT = {"direction": "out", "site": "local", "reason": "manual", "delta_s": None, "delta_prime_s": None}


@contextlib.contextmanager
def resumed_from_v4_after_scale_outs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, scaled: list[tuple[str, object]]
) -> Iterator[ControllerAgent]:
    """The controller of job `name` resumed from checkpoint v4 (iteration 4), its events holding a scale-out
    (`SCALE_OUT`) of each (agent, iteration) of `scaled`; closed after."""
    from rlctl.agents.ledger import Ledger
    from rlctl.checkpoint.controller import save_controller
    from rlctl.launch.agentenv import ENV_RESUME
    from rlctl.transport import InprocTransport
    from tests.unit.controller_harness import HandledController, small_job

    job = small_job(name, iterations=8)
    h = HandledController(tmp_path, job, listen=f"inproc://{name}-a")
    h.close()
    for agent, iteration in scaled:
        h.jd.event("scale", agent=agent, iteration=iteration, **SCALE_OUT)
    state = {"iteration": 4, "ranker": {"tokens": [], "lengths": []}, "rebalance_window": [], "samples_log_bytes": 0}
    save_controller(h.jd, 4, state=state, ledger=Ledger(), trainer_digest="d" * 64)
    monkeypatch.setenv(ENV_RESUME, "4")
    ctl = ControllerAgent(h.jd, job, InprocTransport(secret=h.jd.secret()), listen=f"inproc://{name}-b")
    try:
        yield ctl
    finally:
        ctl.listener.close()
        threading.Thread(target=ctl.metrics.close, daemon=True).start()


def test_the_summary_of_a_resumed_run_lists_the_scale_events_of_the_jobs_history_it_continues(
    tmp_path: Path, monkeypatch
) -> None:
    """rollout-2 was added at iteration 2 and rollout-3 at 4, then the run failed and was resumed from v4: the
    resumed run's summary and status list rollout-2's scale-out (the job's history before v4), not rollout-3's (past
    it, abandoned), as `rlctl report` does, versus none at all (its scale_events were the current run's only, while
    its iterations were the job's)."""
    import time

    from rlctl.agents import views

    with resumed_from_v4_after_scale_outs(tmp_path, monkeypatch, "scaled", [("rollout-2", 2), ("rollout-3", 4)]) as ctl:
        snap = ctl.snapshot()
        assert views.summary(snap)["scale_events"] == [{"agent": "rollout-2", "iteration": 2, **SCALE_OUT}]
        assert [e["agent"] for e in views.status(snap, now=time.monotonic())["scale_events"]] == ["rollout-2"]


def test_a_resume_leaves_out_a_scale_event_whose_iteration_is_text_as_the_report_does(
    tmp_path: Path, monkeypatch
) -> None:
    """A scale event edited by hand ('iteration': 'two') beside rollout-3's at 4 and rollout-2's at 2, then a resume
    from v4: the resumed controller's look for the scale events of the job's history compared 'two' >= 4, a TypeError
    that killed it as it started; then it kept the event in summary.json's scale_events, while `rlctl report` leaves
    it out, naming it. Both now keep what the other keeps (rollout-2's)."""
    from rlctl import reportrecord
    from rlctl.agents import views

    scaled: list[tuple[str, object]] = [("rollout-1", "two"), ("rollout-2", 2), ("rollout-3", 4)]
    with resumed_from_v4_after_scale_outs(tmp_path, monkeypatch, "edited", scaled) as ctl:
        kept = [e["agent"] for e in views.summary(ctl.snapshot())["scale_events"]]
        assert kept == ["rollout-2"]
        assert [e["agent"] for e in reportrecord.load(ctl.jobdir.path).scales] == kept


@pytest.mark.parametrize("keep", [0, 2])
def test_the_controller_keeps_the_checkpoints_a_prune_reads_not_one_per_checkpoint(tmp_path: Path, keep: int) -> None:
    """12 checkpoints completed: the controller holds the newest `checkpoint.keep` complete ones (the newest with keep
    0: nothing is pruned), what the next prune reads, versus one entry per checkpoint of the run; what is on disk and
    offered is as before."""
    from rlctl.agents.messages import CheckpointWritten
    from rlctl.ops.extend import completed_checkpoints
    from tests.unit.controller_harness import HandledController, small_job

    job = small_job("kept", iterations=20)
    job = job.model_copy(update={"checkpoint": job.checkpoint.model_copy(update={"keep": keep})})
    h = HandledController(tmp_path, job, listen=f"inproc://kept-{keep}")
    try:
        for v in range(1, 13):
            h.ctl._checkpoint_due(v)
            h.ctl._checkpoint(CheckpointWritten(v, "d" * 64))
        assert h.ctl.complete == ([11, 12] if keep else [12])
        assert completed_checkpoints(h.jd) == ([11, 12] if keep else list(range(1, 13)))
    finally:
        h.close()


# the real controller's entry point resumed from v2 as the launcher chose it, its part of v2 damaged since
# (argv: job dir)
RESUMED_FROM_DAMAGED = """
import os, sys
from pathlib import Path
from rlctl.agents.__main__ import main
from rlctl.agents.ledger import Ledger
from rlctl.checkpoint.controller import save_controller
from rlctl.config import load_job
from rlctl.launch.agentenv import ENV_RESUME
from rlctl.launch.jobdir import JobDir

jd = JobDir.create("j", explicit=Path(sys.argv[1]))
jd.write_job(load_job(Path("jobs/demo.yaml")).spec, source="x")
state = {"iteration": 2, "ranker": {"tokens": [], "lengths": []}, "rebalance_window": [], "samples_log_bytes": 0}
save_controller(jd, 2, state=state, ledger=Ledger(), trainer_digest="d" * 64)
(jd.checkpoint(2) / "controller" / "state.json").write_text("{}")
os.environ[ENV_RESUME] = "2"
sys.exit(main(["controller", "--job-dir", str(jd.path), "--listen", "tcp://127.0.0.1:0"]))
"""


def test_a_controller_resumed_from_a_part_damaged_after_the_launcher_chose_it_ends_in_one_line_naming_it(
    tmp_path: Path,
) -> None:
    """`launch --resume` chose v2, whose controller part changed on disk before the controller started: its log ends
    on one line naming the checkpoint, why, and what to do (a resume again passes v2 over), exit 1, versus a
    ValueError's traceback (the entry point catches RlctlError alone) saying no more than that it did not match."""
    import subprocess
    import sys

    from rlctl.ops.runbase import last_error
    from tests.conftest import ROOT

    proc = subprocess.run(
        [sys.executable, "-c", RESUMED_FROM_DAMAGED, str(tmp_path / "j")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert [line for line in proc.stderr.splitlines() if " ERROR " in line] == [proc.stderr.splitlines()[-2]]
    ckpt = tmp_path / "j" / "checkpoints" / "iter-2"
    assert re.fullmatch(
        re.escape(f": {ckpt}: the controller's part is missing or does not match its manifest: controller/state.json ")
        + r"does not match MANIFEST\.controller\.json: 2 bytes, \d+ listed "
        + re.escape(
            "(resume the job again (`rlctl launch --resume j`): it takes the newest checkpoint before this one whose "
            "parts verify)"
        ),
        last_error(proc.stderr),
    ), proc.stderr[-2000:]
