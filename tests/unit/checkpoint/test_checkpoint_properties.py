"""Properties of checkpoints over arbitrary histories, on real files: how a part is written (the trainer's ranks'
shards and seal, `rlctl.checkpoint.files.write_part`, `save_controller`), which checkpoint a resume continues from
(`rlctl.ops.resumepoint.pick_checkpoint`, `latest_complete`, `choose_resume`), what `checkpoint.keep` prunes and a
resume sets aside, and the writer thread (`BackgroundWriter`).

    a write cut at any step (a rename, a removal, a chunk of a file) ─▶ a reader sees each part whole, or not at all
    iter-*/ in any state (whole, cut short, damaged, of two runs, stale temporaries) and any latest.json ─▶
        the newest checkpoint ≤ latest.json whose two parts are whole and of one run; a refusal, never a part
    rank 0 seals the trainer part only with every rank's shard on disk as that rank wrote it
    any one byte of a sealed checkpoint changed, or a file cut short ─▶ it is not used
    writes, crashes, resumes and prunes in any order ─▶ the choice is always the newest whole one, the one
        latest.json names; `keep` bounds iter-* and abandoned/; nothing else in the job dir is touched
    the writer thread: one write at a time; each failure raised once, in the training thread

"Whole" is judged against the bytes a write that was never cut writes (`intended`), not by the code under test.
The two fixes this found are pinned as @examples of the last property (and as plain tests in
tests/unit/agents/test_agents_checkpoint.py): a resumed run's prune, a manifest's temporary a crash left.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rlctl.checkpoint.background import BackgroundWriter
from rlctl.checkpoint.choose import choose_resume, parse_latest
from rlctl.checkpoint.controller import prune_controller, save_controller
from rlctl.checkpoint.files import (
    latest_complete,
    manifest_path,
    newest_complete,
    prune,
    read_manifest,
    set_aside_newer,
)
from rlctl.checkpoint.trainer import CheckpointError, _seal, _verified, _write_shard
from rlctl.errors import RlctlError
from rlctl.launch.agentenv import ParallelConfig
from rlctl.launch.jobdir import JobDir
from rlctl.launch.sitefs import LocalFiles
from rlctl.ops.resumepoint import pick_checkpoint
from tests.unit.props import props

PROPS = props(60)
CHUNK_BYTES = 16  # a file the test writes goes in chunks of this many bytes, each a step a crash may cut


@pytest.fixture(autouse=True, scope="module")
def no_fsync() -> Iterator[None]:
    """The crashes here are the process's, not the machine's: what an fsync makes durable is not at stake (the
    fsyncs are test_agents_checkpoint.py's), and on a shared disk they were most of these tests' time."""
    with patch.object(os, "fsync", lambda fd: None):
        yield


# -- a write cut at any step -------------------------------------------------------------------------------------
class Crash(Exception):
    """The process dies here: nothing from this step on is done."""


class Steps:
    """The filesystem mutations of a write, counted: `at` (None: never) is the one it dies at; `before` runs before
    each (a reader that looks at every moment)."""

    def __init__(self, at: int | None = None, *, before: Callable[[], None] | None = None) -> None:
        self.at, self.before, self.done, self.looking = at, before, 0, False

    def __call__(self, what: str) -> None:
        if self.looking:  # the reader's own steps
            return
        if self.before is not None:
            self.looking = True
            try:
                self.before()
            finally:
                self.looking = False
        if self.at is not None and self.done >= self.at:
            raise Crash(what)
        self.done += 1


@contextlib.contextmanager
def cut_at(steps: Steps) -> Iterator[None]:
    """Every rename, file removal, directory removal (each entry of a tree) under it is a step of `steps`."""
    replace, unlink, rmdir = os.replace, Path.unlink, Path.rmdir

    def os_replace(src: Any, dst: Any) -> None:
        steps(f"rename {src} -> {dst}")
        replace(src, dst)

    def path_unlink(self: Path, missing_ok: bool = False) -> None:
        steps(f"unlink {self}")
        unlink(self, missing_ok=missing_ok)

    def path_rmdir(self: Path) -> None:
        steps(f"rmdir {self}")
        rmdir(self)

    def rmtree(path: Any, ignore_errors: bool = False, **_: Any) -> None:  # an entry at a time: cut anywhere
        try:
            for top, dirs, files in os.walk(path, topdown=False):
                for name in [*files, *dirs]:
                    p = os.path.join(top, name)
                    steps(f"remove {p}")
                    (os.rmdir if os.path.isdir(p) and not os.path.islink(p) else os.unlink)(p)
            steps(f"rmdir {path}")
            os.rmdir(path)
        except OSError:
            if not ignore_errors:
                raise

    with (
        patch.object(os, "replace", os_replace),
        patch.object(Path, "unlink", path_unlink),
        patch.object(Path, "rmdir", path_rmdir),
        patch.object(shutil, "rmtree", rmtree),
    ):
        yield


def put(path: Path, data: bytes, steps: Steps) -> None:
    with path.open("wb") as f:
        for i in range(0, len(data), CHUNK_BYTES):
            steps(f"write {path}@{i}")
            f.write(data[i : i + CHUNK_BYTES])


# -- the agents' writes, through the code they run -----------------------------------------------------------------
@dataclass
class Policy:
    """The policy's HF directory as a trainer writes it (`SavesPretrained`), a chunk at a time."""

    run: int
    version: int
    steps: Steps

    def save_pretrained(self, directory: str | Path, *, tokenizer_from: str | Path | None = None) -> Path:
        d = Path(directory)
        d.mkdir()
        put(d / "config.json", json.dumps({"run": self.run, "version": self.version}).encode(), self.steps)
        weights = b"".join(hashlib.sha256(f"{self.run}/{self.version}/{i}".encode()).digest() for i in range(3))
        put(d / "model.safetensors", weights, self.steps)
        return d


def shard_body(run: int, version: int, rank: int) -> dict[str, Any]:
    """A rank's shard (`_shard_snapshot`'s layout): small tensors that say whose it is."""
    moment = torch.full((4,), float(100 * run + 10 * version + rank))
    return {
        "rank": rank,
        "rng": {"torch": torch.tensor([run, version, rank], dtype=torch.uint8)},
        "optimizer.policy": {"state": {0: {"exp_avg": moment}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
    }


def write_trainer(ckpt: Path, *, world: int, run: int, version: int, steps: Steps) -> str:
    """The trainer's part as rank 0 and the other ranks of replica 0 write it (`snapshot_trainer`, `snapshot_shard`:
    the manifest goes, each rank's shard, the gather, `_seal`); the SHA-256 of its manifest."""
    split = ParallelConfig("trainer", tp=world)
    manifest_path(ckpt, "trainer").unlink(missing_ok=True)  # (snapshot_trainer's first step)
    records = []
    for rank in range(world):
        with patch("rlctl.checkpoint.trainer._rank_world", return_value=(rank, world)):
            body = shard_body(run, version, rank)
            records.append(_write_shard(ckpt, body, optimizers=["policy"], split=split, replicas=[rank]))
    policy = Policy(run, version, steps)
    return _seal(ckpt, records, model=policy, counters={"version": version}, split=split, tokenizer_from=None)


def write_controller(jobdir: JobDir, *, run: int, version: int, trainer_digest: str) -> None:
    """The controller's part, then latest.json (`save_controller`)."""
    ledger = json.dumps({"run": run, "version": version})
    save_controller(jobdir, version, state={"run": run}, ledger=ledger, trainer_digest=trainer_digest)


@dataclass(frozen=True)
class Written:
    """The files of checkpoint (run, version) as a write never cut leaves them, by path in iter-N."""

    trainer: dict[str, bytes]
    controller: dict[str, bytes]


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@functools.cache
def intended(world: int, run: int, version: int) -> Written:
    with tempfile.TemporaryDirectory() as d:
        jobdir = JobDir(Path(d))
        digest = write_trainer(jobdir.checkpoint(version), world=world, run=run, version=version, steps=Steps())
        write_controller(jobdir, run=run, version=version, trainer_digest=digest)
        every = files_under(jobdir.checkpoint(version))
    controller = {rel: b for rel, b in every.items() if rel.startswith(("controller/", "MANIFEST.controller"))}
    return Written({rel: b for rel, b in every.items() if rel not in controller}, controller)


def whole(ckpt: Path, files: dict[str, bytes]) -> bool:
    """Whether `ckpt` holds every one of `files` with those bytes."""
    return all((ckpt / rel).is_file() and (ckpt / rel).read_bytes() == data for rel, data in files.items())


class Sites:
    """A job's controller site and trainer site (one directory when `shared`), and what is outside checkpoints."""

    def __init__(self, base: Path, *, shared: bool, world: int) -> None:
        self.c = JobDir(base / "c" / "job")
        self.t = self.c if shared else JobDir(base / "t" / "job")
        self.shared, self.world = shared, world
        for jobdir in (self.c, self.t):
            jobdir.checkpoints.mkdir(parents=True, exist_ok=True)
            (jobdir.path / "metrics.jsonl").write_text('{"iteration": 0}\n')  # the job's own files: never touched
            (jobdir.checkpoints / "NOTES.txt").write_text("an operator's note")
            (jobdir.checkpoints / "iter-x").mkdir(exist_ok=True)  # not a checkpoint's name
            (jobdir.checkpoints / "iter-x" / "MANIFEST.trainer.json").write_text("{}")
            (jobdir.path.parent / "iter-1").mkdir(exist_ok=True)  # beside the job dir
            (jobdir.path.parent / "iter-1" / "MANIFEST.trainer.json").write_text("{}")
        self.outside = self.others()

    def others(self) -> dict[str, bytes]:
        """Every file of both sites but iter-N/, abandoned/, latest.json and events.jsonl (the prunes' record)."""
        out = {}
        for jobdir in {self.c.path: self.c, self.t.path: self.t}.values():
            for rel, data in files_under(jobdir.path.parent).items():
                parts = rel.split("/")
                if len(parts) > 2 and parts[1] == "checkpoints":
                    name = parts[2]
                    if name in ("abandoned", "latest.json") or name.startswith(".latest.json.tmp-"):
                        continue
                    if name.startswith("iter-") and name[5:].isdigit():
                        continue
                if rel.endswith("/events.jsonl"):
                    continue
                out[f"{jobdir.path}:{rel}"] = data
        return out

    def write(self, *, run: int, version: int, steps: Steps, controller: bool = True) -> None:
        with cut_at(steps):
            digest = write_trainer(self.t.checkpoint(version), world=self.world, run=run, version=version, steps=steps)
            if controller:
                write_controller(self.c, run=run, version=version, trainer_digest=digest)

    def pair_whole(self, version: int, runs: set[int]) -> bool:
        """Both parts of `version` as one run's write left them (manifests too)."""
        return any(
            whole(self.t.checkpoint(version), intended(self.world, r, version).trainer)
            and whole(self.c.checkpoint(version), intended(self.world, r, version).controller)
            for r in runs
        )

    def expected(self, runs: dict[int, set[int]]) -> int | None:
        """The documented choice (`choose_resume`), from what is whole: the newest pair no newer than the version
        latest.json names; 0 where no checkpoint is stored and no pointer names one; None: a refusal."""
        pointer = self.c.checkpoints / "latest.json"
        named: int | None = None
        if pointer.is_file():
            with contextlib.suppress(ValueError):
                named = parse_latest(pointer.read_text())
        bound = named if named is not None else float("inf")
        good = [v for v in runs if v <= bound and self.pair_whole(v, runs[v])]
        if good:
            return max(good)
        stored = any(p.is_file() for p in self.c.checkpoints.glob("iter-*/MANIFEST.controller.json"))
        return 0 if not stored and (not pointer.is_file() or named == 0) else None

    def pick(self, only: int | None = None) -> int | None:
        fs = LocalFiles()
        try:
            return pick_checkpoint((fs, self.c), (fs, self.t), only=only).version
        except RlctlError:  # (UsageError, for `only`, is one)
            return None

    def check_choice(self, runs: dict[int, set[int]]) -> int | None:
        """The launcher's choice (and, on one site, `latest_complete`'s) is the documented one."""
        want = self.expected(runs)
        assert self.pick() == want, (want, self.listing())
        if self.shared:
            assert latest_complete(self.c.checkpoints) == (want or None), (want, self.listing())
        return want

    def listing(self) -> list[str]:
        out = []
        for jobdir in {self.c.path: self.c, self.t.path: self.t}.values():
            out += [str(p.relative_to(jobdir.path)) for p in sorted(jobdir.checkpoints.rglob("*"))]
        return out


# -- choose_resume, the rule ----------------------------------------------------------------------------------------
@settings(PROPS, max_examples=300)
@given(
    problems=st.dictionaries(st.integers(1, 12), st.one_of(st.none(), st.just("damaged")), max_size=8),
    pointer=st.one_of(st.none(), st.integers(0, 14).map(lambda v: json.dumps({"version": v})), st.just('{"vers')),
)
def test_choose_resume_takes_the_newest_that_verifies_up_to_the_pointer_or_refuses(
    problems: dict[int, str | None], pointer: str | None
) -> None:
    """The newest version no newer than latest.json's for which `problem` finds nothing (the pointer's own too,
    even where it is not listed); each newer one skipped with why; a refusal where none verifies and there was a
    checkpoint or a pointer to lose (a damaged pointer bounds nothing); 0 only where there was neither."""
    named = None
    with contextlib.suppress(ValueError):
        named = parse_latest(pointer) if pointer is not None else None
    bound = named if named is not None else 99
    candidates = {*problems, *([named] if named else [])}
    good = [v for v in candidates if v <= bound and problems.get(v, "missing") is None]
    asked: list[int] = []

    def problem(v: int) -> str | None:
        asked.append(v)
        return problems.get(v, "missing")

    try:
        point = choose_resume(pointer, list(problems), problem)
    except RlctlError as e:
        assert not good, e
        assert problems or (pointer is not None and named != 0), e
        return
    if good:
        assert point.version == max(good)
        assert [v for v, _ in point.skipped] == sorted((v for v in candidates if v > point.version), reverse=True)
        assert asked == [v for v in sorted(candidates, reverse=True) if point.version <= v <= bound]
    else:
        assert point.version == 0 and not problems and (pointer is None or named == 0)


# -- the choice over iter-*/ in any state --------------------------------------------------------------------------
TRAINER_FAULTS = ("whole", "absent", "cut", "rewrite-cut", "no-manifest", "manifest-flip", "manifest-cut")
TRAINER_FAULTS += ("file-flip", "file-cut", "shard-gone", "stale-temporaries", "other-run")
CONTROLLER_FAULTS = ("whole", "absent", "cut", "no-manifest", "manifest-cut", "file-flip", "file-cut")
CONTROLLER_FAULTS += ("stale-temporaries",)


@st.composite
def checkpoint_states(draw: st.DrawFn) -> dict[str, Any]:
    versions = draw(st.lists(st.integers(1, 6), unique=True, max_size=4))
    each = {
        v: {
            "trainer": draw(st.sampled_from(TRAINER_FAULTS)),
            "controller": draw(st.sampled_from(CONTROLLER_FAULTS)),
            "at": draw(st.integers(0, 30)),  # the step a cut write dies at (a whole one takes 17 to 25)
            "where": draw(st.integers(0, 1 << 16)),  # which file, which byte, how much is left
            "xor": draw(st.integers(1, 255)),
        }
        for v in sorted(versions)
    }
    pointer = draw(
        st.one_of(st.none(), st.integers(0, 7).map(lambda v: json.dumps({"version": v})), st.just('{"version": '))
    )
    return {
        "world": draw(st.integers(1, 3)),
        "shared": draw(st.booleans()),
        "versions": each,
        "pointer": pointer,
    }


def damage(ckpt: Path, files: list[str], how: str, where: int, xor: int) -> None:
    """One fault of a sealed part in `ckpt`: a byte of one of `files` changed, or that file cut short."""
    path = ckpt / files[where % len(files)]
    data = path.read_bytes()
    if how.endswith("flip"):
        i = (where // len(files)) % len(data)
        path.write_bytes(data[:i] + bytes([data[i] ^ xor]) + data[i + 1 :])
    else:
        path.write_bytes(data[: (where // len(files)) % len(data)])


def make_state(sites: Sites, spec: dict[str, Any]) -> dict[int, set[int]]:
    """Write and damage each version as `spec` says; the runs that wrote each (run 0, then 1 rewriting)."""
    runs: dict[int, set[int]] = {}
    for v, f in spec["versions"].items():
        tf, cf = f["trainer"], f["controller"]
        runs[v] = {0, 1}
        if tf == "absent":
            continue
        if tf == "cut":  # the trainer died as it wrote: no controller part
            with contextlib.suppress(Crash):
                sites.write(run=0, version=v, steps=Steps(f["at"]))
            continue
        if cf == "cut":
            sites.write(run=0, version=v, steps=Steps(), controller=False)
            with contextlib.suppress(Crash), cut_at(Steps(f["at"])):
                digest = hashlib.sha256(manifest_path(sites.t.checkpoint(v), "trainer").read_bytes()).hexdigest()
                write_controller(sites.c, run=0, version=v, trainer_digest=digest)
        else:
            sites.write(run=0, version=v, steps=Steps(), controller=cf != "absent")
        t, c = sites.t.checkpoint(v), sites.c.checkpoint(v)
        if tf == "rewrite-cut":  # a resumed run rewrote it and died as it did
            with contextlib.suppress(Crash):
                sites.write(run=1, version=v, steps=Steps(f["at"]), controller=False)
        elif tf == "other-run":  # a resumed run rewrote the trainer part beside the old run's controller part
            sites.write(run=1, version=v, steps=Steps(), controller=False)
        elif tf == "no-manifest":
            manifest_path(t, "trainer").unlink()
        elif tf.startswith("manifest-"):
            damage(t, ["MANIFEST.trainer.json"], tf, f["where"], f["xor"])
        elif tf.startswith("file-"):
            damage(t, sorted(rel for rel in intended(sites.world, 0, v).trainer if "MANIFEST" not in rel), tf,
                   f["where"], f["xor"])  # fmt: skip
        elif tf == "shard-gone":
            (t / "ranks" / f"rank-{f['where'] % sites.world}.pt").unlink()
        elif tf == "stale-temporaries":  # a write cut short before, under another pid: never read
            (t / ".model.tmp-99999").mkdir()
            (t / ".model.tmp-99999" / "config.json").write_text("{")
            (t / ".MANIFEST.trainer.json.tmp-99999").write_text('{"files": {}}')
            (t / "ranks" / ".rank-0.pt.tmp-99999").write_bytes(b"PK")
        if not c.is_dir() or cf in ("whole", "absent", "cut"):
            continue
        if cf == "no-manifest":
            manifest_path(c, "controller").unlink(missing_ok=True)
        elif cf == "manifest-cut":
            with contextlib.suppress(FileNotFoundError):
                damage(c, ["MANIFEST.controller.json"], cf, f["where"], f["xor"])
        elif cf.startswith("file-"):
            with contextlib.suppress(FileNotFoundError):
                damage(c, ["controller/ledger.json", "controller/state.json"], cf, f["where"], f["xor"])
        elif cf == "stale-temporaries":
            (c / ".controller.tmp-99999").mkdir(exist_ok=True)
            (c / ".MANIFEST.controller.json.tmp-99999").write_text('{"files": {}, "trainer_digest": ""}')
    pointer = sites.c.checkpoints / "latest.json"
    pointer.unlink(missing_ok=True)
    if spec["pointer"] is not None:
        pointer.write_text(spec["pointer"])
    return runs


@settings(PROPS, max_examples=100)
@given(spec=checkpoint_states())
def test_a_resume_takes_the_newest_whole_checkpoint_up_to_the_pointer_or_refuses_never_a_part(
    spec: dict[str, Any],
) -> None:
    """Whatever iter-*/ holds — parts whole, a write cut at any step (a first write, a rewrite), a manifest gone,
    changed or cut short, a file changed or cut short, a rank's shard gone, a trainer part rewritten beside another
    run's controller part, stale temporaries — and whatever latest.json says (nothing, a version, damaged), the
    launcher (`pick_checkpoint`, two sites or one) and `latest_complete` take the newest checkpoint no newer than
    the pointer's whose two parts are one run's, whole; refuse where there is none but something to lose."""
    with tempfile.TemporaryDirectory() as d:
        sites = Sites(Path(d), shared=spec["shared"], world=spec["world"])
        runs = make_state(sites, spec)
        sites.check_choice(runs)
        for v in runs:  # a roll-back (`--checkpoint V`) takes V only where it is whole
            assert sites.pick(only=v) == (v if sites.pair_whole(v, runs[v]) else None), (v, sites.listing())


# -- the seal: every rank's shard, as it wrote it ------------------------------------------------------------------
@settings(PROPS, max_examples=60)
@given(
    ranks=st.lists(st.sampled_from(["ok", "ok", "failed", "gone", "other-bytes"]), min_size=1, max_size=3),
    before=st.booleans(),
)
def test_rank_0_seals_the_trainer_part_only_with_every_shard_there_as_its_rank_wrote_it(
    ranks: list[str], before: bool
) -> None:
    """Rank 0 seals the part only when every rank of replica 0 reported its shard written and finds it on disk
    with the bytes and SHA-256 that rank reported; else CheckpointError naming a rank, and no manifest (an earlier
    write's, `before`, went first): nothing a resume could take."""
    world = len(ranks)
    split = ParallelConfig("trainer", tp=world)
    with tempfile.TemporaryDirectory() as d:
        ckpt = Path(d) / "iter-1"
        if before:
            write_trainer(ckpt, world=world, run=0, version=1, steps=Steps())
        manifest_path(ckpt, "trainer").unlink(missing_ok=True)  # (snapshot_trainer's first step)
        records = []
        for rank, how in enumerate(ranks):
            with patch("rlctl.checkpoint.trainer._rank_world", return_value=(rank, world)):
                rec = _write_shard(ckpt, shard_body(1, 1, rank), optimizers=["policy"], split=split, replicas=[rank])
            if how == "failed":  # as `_write_shard` reports a write that raised
                rec = {"rank": rank, "replicas": [rank], "file": rec["file"], "error": "OSError: [Errno 28]"}
            elif how == "gone":
                (ckpt / rec["file"]).unlink()
            elif how == "other-bytes":  # another process's (a rank that does not share the job dir)
                (ckpt / rec["file"]).write_bytes((ckpt / rec["file"]).read_bytes()[::-1])
            records.append(rec)
        policy = Policy(1, 1, Steps())
        if ranks.count("ok") == world:
            digest = _seal(ckpt, records, model=policy, counters={"version": 1}, split=split, tokenizer_from=None)
            assert (read_manifest(ckpt, "trainer") or {}).get("digest") == digest
            assert whole(ckpt, intended(world, 1, 1).trainer)
        else:
            with pytest.raises(CheckpointError, match=r"rank \d"):
                _seal(ckpt, records, model=policy, counters={"version": 1}, split=split, tokenizer_from=None)
            assert not manifest_path(ckpt, "trainer").exists()


# -- any one byte changed ------------------------------------------------------------------------------------------
@settings(PROPS, max_examples=120)
@given(
    world=st.integers(1, 3),
    which=st.integers(0, 1 << 16),
    where=st.integers(0, 1 << 20),
    xor=st.integers(1, 255),
    cut=st.booleans(),
)
# the controller manifest's (world 1: the first file) `version` 1 read as 3, its `part` as "bontroller": taken before
@example(world=1, which=0, where=400, xor=2, cut=False)
@example(world=1, which=0, where=288, xor=1, cut=False)
def test_any_one_byte_changed_or_a_file_cut_short_is_never_used(
    world: int, which: int, where: int, xor: int, cut: bool
) -> None:
    """One byte of any file of a sealed checkpoint changed, or the file cut short: the launcher refuses it, and so
    does the trainer's load (rank 0 checks every file; a rank its own shard and the policy) for a trainer file. The
    controller's manifest is the one file no other names: a change there is refused, or leaves what it says (the
    files and their SHA-256, the trainer part it names, its part and version) as it was, or leaves a field out (a
    key's name changed: read as a manifest written before it)."""
    with tempfile.TemporaryDirectory() as d:
        sites = Sites(Path(d), shared=True, world=world)
        sites.write(run=0, version=1, steps=Steps())
        files = intended(world, 0, 1)
        names = sorted([*files.trainer, *files.controller])
        name = names[which % len(names)]
        ckpt = sites.c.checkpoint(1)
        before = json.loads((ckpt / "MANIFEST.controller.json").read_text())
        damage(ckpt, [name], "file-cut" if cut else "file-flip", where, xor)
        picked, alone = sites.pick(), latest_complete(sites.c.checkpoints)
        if name != "MANIFEST.controller.json" or cut:
            assert picked is None and alone is None, name
        elif picked is not None or alone is not None:
            after = json.loads((ckpt / "MANIFEST.controller.json").read_text(errors="replace"))
            assert after["files"] == before["files"]
            assert after.get("part", "controller") == "controller" and after.get("version", 1) == 1
            # the launcher: the trainer part it names; `latest_complete` takes one that names none too (a manifest
            # written before the field: its key changed reads so)
            assert after.get("trainer_digest") == before["trainer_digest"] or (
                picked is None and "trainer_digest" not in after
            )
        if name in files.trainer and "MANIFEST" not in name:  # what a trainer rank reads
            for r in range(world):
                reads = name == f"ranks/rank-{r}.pt" or not name.startswith("ranks/")
                if r == 0 or reads:
                    with pytest.raises(CheckpointError):
                        _verified(ckpt, rank=r, reads=lambda _m, r=r: [r], version=1)
                else:
                    assert _verified(ckpt, rank=r, reads=lambda _m, r=r: [r], version=1)["counters"] == {"version": 1}


# -- a reader at every moment of a write ---------------------------------------------------------------------------
@settings(PROPS, max_examples=40)
@given(
    world=st.integers(1, 3),
    shared=st.booleans(),
    before=st.sampled_from(["none", "whole", "cut"]),
    at=st.integers(0, 30),
)
def test_a_reader_at_any_moment_of_a_write_sees_each_part_whole_or_not_at_all(
    world: int, shared: bool, before: str, at: int
) -> None:
    """At every step of a write of checkpoint v2 (over nothing, over another run's whole v2, over a write of it cut
    short), with v1 whole, then of a resume's setting v2 aside: each part either does not verify or holds, byte for
    byte, what one run's whole write holds (`read_manifest`), and the launcher's choice is the documented one."""
    with tempfile.TemporaryDirectory() as d:
        sites = Sites(Path(d), shared=shared, world=world)
        sites.write(run=0, version=1, steps=Steps())
        if before == "whole":
            sites.write(run=0, version=2, steps=Steps())
        elif before == "cut":
            with contextlib.suppress(Crash):
                sites.write(run=0, version=2, steps=Steps(at))
        runs = {1: {0}, 2: {0, 1}}
        seen: list[int | None] = []

        def look() -> None:
            for part, jobdir in (("trainer", sites.t), ("controller", sites.c)):
                if read_manifest(jobdir.checkpoint(2), part) is not None:
                    assert any(whole(jobdir.checkpoint(2), getattr(intended(world, r, 2), part)) for r in (0, 1)), (
                        part,
                        sites.listing(),
                    )
            seen.append(sites.check_choice(runs))

        sites.write(run=1, version=2, steps=Steps(before=look))
        look()
        # v2 once its write is done, v1 from its first step until then (a v2 whole before goes at its first step)
        rest = seen[next((i for i, v in enumerate(seen) if v != seen[0]), len(seen)) :]
        assert seen[-1] == 2 and 1 in seen and rest == sorted(rest), seen
        seen.clear()
        with cut_at(Steps(before=look)):  # a resume from v1 sets v2 aside: v2, then v1, never neither
            set_aside_newer(sites.c.checkpoints, "controller", resumed=1, keep=1)
            set_aside_newer(sites.t.checkpoints, "trainer", resumed=1, keep=1)
        look()
        assert seen[0] == 2 and seen[-1] == 1 and seen == sorted(seen, reverse=True), seen


# -- writes, crashes, resumes and prunes in any order --------------------------------------------------------------
@dataclass
class Job:
    """A job's agents as they write, prune and resume (`rlctl.agents.trainer`, `controller_checkpoints`): what each
    knows complete, the version trained, the run."""

    sites: Sites
    keep: int
    version: int = 0
    run: int = 0
    c_complete: list[int] | None = None
    t_complete: list[int] | None = None

    def step(self, steps: Steps) -> None:
        """The next checkpoint: the trainer's part, the controller's and latest.json, then each side's prune."""
        v = self.version + 1
        sites, keep = self.sites, self.keep
        c_complete, t_complete = list(self.c_complete or []), list(self.t_complete or [])
        with cut_at(steps), patch.object(os, "getpid", return_value=10000 + self.run):  # each run a process
            digest = write_trainer(sites.t.checkpoint(v), world=sites.world, run=self.run, version=v, steps=steps)
            write_controller(sites.c, run=self.run, version=v, trainer_digest=digest)
            self.version = v
            c_complete.append(v)
            prune_controller(sites.c, complete=c_complete, keep=keep)
            self.c_complete = newest_complete(c_complete, keep=keep)
            t_complete.append(v)
            prune(sites.t.checkpoints, "trainer", complete=t_complete, keep=keep)
            self.t_complete = newest_complete(t_complete, keep=keep)

    def resume(self, steps: Steps) -> int:
        """`launch --resume`: the launcher's choice, then each agent sets the newer checkpoints aside."""
        point = self.sites.pick()
        assert point is not None, self.sites.listing()  # crashes alone never leave nothing to resume from
        self.version, self.run = point, self.run + 1
        self.c_complete = self.t_complete = [point] if point else []
        with cut_at(steps), patch.object(os, "getpid", return_value=10000 + self.run):
            set_aside_newer(self.sites.c.checkpoints, "controller", resumed=point, keep=self.keep)
            set_aside_newer(self.sites.t.checkpoints, "trainer", resumed=point, keep=self.keep)
        return point


@functools.cache
def trainer_steps(world: int) -> int:
    """The steps of a trainer part's first write."""
    with tempfile.TemporaryDirectory() as d:
        steps = Steps()
        with cut_at(steps):
            write_trainer(Path(d) / "iter-1", world=world, run=0, version=1, steps=steps)
        return steps.done


def iter_dirs(jobdir: JobDir) -> list[int]:
    return sorted(int(p.name[5:]) for p in jobdir.checkpoints.glob("iter-*") if p.name[5:].isdigit())


def sealed_aside(jobdir: JobDir, part: str) -> int:
    return sum(1 for _ in (jobdir.checkpoints / "abandoned").glob(f"*/MANIFEST.{part}.json"))


@settings(PROPS, max_examples=50)
@given(
    keep=st.integers(0, 3),
    world=st.integers(1, 2),
    shared=st.booleans(),
    plan=st.lists(
        st.tuples(
            st.sampled_from(["step", "step", "step", "crash", "crash", "sealed", "stop"]),
            st.integers(0, 40),
            st.integers(0, 12),
        ),
        min_size=1,
        max_size=9,
    ),
)
@example(keep=3, world=1, shared=False, plan=[("step", 0, 0), ("step", 0, 0), ("crash", 17, 0), ("step", 0, 0)])
@example(keep=1, world=1, shared=False, plan=[("crash", 15, 0), ("step", 0, 0), ("step", 0, 0)])
def test_writes_crashes_resumes_and_prunes_keep_the_newest_whole_checkpoint_and_only_what_keep_allows(
    keep: int, world: int, shared: bool, plan: list[tuple[str, int, int]]
) -> None:
    """A job checkpoints every iteration; it dies at any step of a checkpoint's write, prune or of a resume's
    set-aside, or stops, and resumes. After every one: the launcher's choice is the newest whole checkpoint up to
    latest.json, which names a whole one (pruning never takes it); nothing but iter-N/, abandoned/ and latest.json
    changes in the sites' directories; once a checkpoint is complete and both sides pruned, iter-* holds the
    `keep` newest (`checkpoints_held`: keep, one more while the next is written), and abandoned/ at most `keep`
    sealed parts of each side."""
    with tempfile.TemporaryDirectory() as d:
        sites = Sites(Path(d), shared=shared, world=world)
        job = Job(sites, keep)
        runs: dict[int, set[int]] = {}
        for what, at, resume_at in plan:
            runs.setdefault(job.version + 1, set()).add(job.run)
            if what == "sealed":  # dies as the controller starts its part: the trainer's is sealed, set aside
                what, at = "crash", trainer_steps(world)
            try:
                job.step(Steps(at if what == "crash" else None))
            except Crash:
                what = "crash"
            chosen = sites.check_choice(runs)
            pointer = sites.c.checkpoints / "latest.json"
            if pointer.is_file():
                named = parse_latest(pointer.read_text())
                assert chosen == named and sites.pair_whole(named, runs[named]), (named, sites.listing())
            if what == "step" and keep:
                for jobdir in (sites.c, sites.t):
                    assert len(iter_dirs(jobdir)) <= keep, (keep, iter_dirs(jobdir), sites.listing())
            if what in ("crash", "stop"):
                while True:
                    try:
                        job.resume(Steps(resume_at))
                        break
                    except Crash:
                        resume_at += 3
                    finally:
                        sites.check_choice(runs)
                if keep:
                    assert sealed_aside(sites.c, "controller") <= keep and sealed_aside(sites.t, "trainer") <= keep
            assert sites.others() == sites.outside


# -- the writer thread ----------------------------------------------------------------------------------------------
class WriteFailed(Exception):
    pass


@settings(PROPS, max_examples=100)
@given(ops=st.lists(st.one_of(st.booleans(), st.just("wait")), max_size=12))
def test_the_background_writer_runs_one_write_at_a_time_and_raises_each_failure_once_in_the_training_thread(
    ops: list[bool | str],
) -> None:
    """Submits (of writes that succeed or fail) and waits in any order: a write starts only once the one before it is
    done; a failed write's error is raised once, at the next submit or wait, and a submit that raises it starts
    nothing; wait returns only once the write in progress is done."""
    writer = BackgroundWriter()
    lock = threading.Lock()
    running, overlaps, started, done = [0], [0], [], []
    failed: list[int] = []  # the write whose error the training thread has not seen yet

    def write(n: int, fails: bool) -> Callable[[], None]:
        def run() -> None:
            with lock:
                running[0] += 1
                overlaps[0] += running[0] > 1
                started.append(n)
            for _ in range(200):  # time for another write to start, were it let
                pass
            with lock:
                running[0] -= 1
                done.append(n)
            if fails:
                raise WriteFailed(str(n))

        return run

    for n, op in enumerate([*ops, "wait"]):
        try:
            if op == "wait":
                writer.wait()
                assert not writer.busy() and done == started
            else:
                writer.submit(write(n, op is True))
        except WriteFailed as e:
            assert failed == [int(str(e))]
            failed.clear()
            assert n not in started  # its submit raised: not started
        else:
            assert not failed, failed
            if op != "wait":
                assert n in started or writer.busy()
        if op is True and (n in started or writer.busy()):  # it runs, and will fail
            failed.append(n)
    assert overlaps[0] == 0 and writer.writes == len(started) == len(done)
