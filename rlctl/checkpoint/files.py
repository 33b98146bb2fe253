"""Atomic, verifiable checkpoints: what each part writes, in what order, and which checkpoint a resume may use.

A checkpoint of version N (the weights after N trained iterations) has two parts, written by the agents
that own the state, each on its own site (sites share no filesystem):

    checkpoints/iter-N/
        model/                    the policy, a Hugging Face directory (trainer rank 0, gathered)
        ranks/rank-R.pt           the optimizer state, other modules and RNG of each rank of data-parallel
                                  replica 0 (that rank; the other replicas hold the same state and restore
                                  the file of their (tp, pp) position)
        MANIFEST.trainer.json     written LAST by trainer rank 0, once every such file is in: every file's
                                  bytes and SHA-256, the counters (version), the split (tp, pp, dp) and each
                                  rank's optimizer digest (`rlctl.checkpoint.trainer`)
        controller/               ledger.json, state.json (iteration, ranker, rebalance window, rows)
        MANIFEST.controller.json  written LAST by the controller; names the trainer manifest's SHA-256
    checkpoints/latest.json       {"version": N}: moved (os.replace) by the controller once it has the
                                  trainer's report that its part of N is complete, and its own part is

Every file goes to a temporary name first and is renamed into place; the manifest is renamed into place
only after every file it lists is. A part without a manifest, or whose files do not match it (size or
SHA-256), is never used: `latest_complete` falls back to the newest older checkpoint that verifies (the rule,
and the check of a manifest, are `rlctl.checkpoint.choose.choose_resume` / `verified_manifest`, which the
launcher applies on each part's site to pick the version a resumed job loads).
Files are read back with `torch.load(weights_only=True)` and JSON only: nothing is unpickled.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rlctl.checkpoint.choose import CHECKPOINT_PARTS as PARTS
from rlctl.checkpoint.choose import LATEST_POINTER as LATEST
from rlctl.checkpoint.choose import choose_resume, manifest_name, verified_manifest
from rlctl.errors import RlctlError
from rlctl.launch.sitefs import LocalFiles

log = logging.getLogger(__name__)

PREFIX = "iter-"
CHUNK = 1 << 22


def manifest_path(ckpt: Path, part: str) -> Path:
    return ckpt / manifest_name(part)


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    """Make the entries of directory `path` (names created, renamed or removed in it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """Make a file, or a directory with every file and directory under it, durable: what a checkpoint's manifest
    lists is on disk before `latest` names it (after a power loss a file never synced may read back empty)."""
    if path.is_file():
        with path.open("rb") as f:
            os.fsync(f.fileno())
        return
    for p in sorted(path.rglob("*")):
        if p.is_file() and not p.is_symlink():
            with p.open("rb") as f:
                os.fsync(f.fileno())
    for d in sorted([path, *(p for p in path.rglob("*") if p.is_dir() and not p.is_symlink())], reverse=True):
        fsync_dir(d)


def _replace(tmp: Path, dst: Path) -> None:
    """Move `tmp` (a file or a directory) to `dst`, replacing what an earlier, failed attempt left there."""
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    os.replace(tmp, dst)


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)  # the rename itself


def write_part(
    ckpt: Path,
    part: str,
    entries: dict[str, Callable[[Path], None]],
    *,
    meta: dict[str, Any] | None = None,
    listed: dict[str, dict[str, Any]] | None = None,
) -> str:
    """Write one part of a checkpoint; returns the SHA-256 of its manifest.

    `entries` maps a top-level name in `ckpt` ("model", "trainer", …) to a function that fills the path it is
    given (a file or a directory) — always a temporary one, renamed into place when the function returns.
    `listed`: files already in place (written by other processes; path relative to `ckpt` → its "bytes" and
    "sha256", checked by the caller), listed in the manifest with the others."""
    ckpt.mkdir(parents=True, exist_ok=True)
    manifest_path(ckpt, part).unlink(missing_ok=True)  # a rewrite of this part is incomplete until it is done
    for name, fill in entries.items():
        tmp = ckpt / f".{name}.tmp-{os.getpid()}"
        if tmp.is_dir():
            shutil.rmtree(tmp)
        fill(tmp)
        fsync_tree(tmp)
        _replace(tmp, ckpt / name)
    fsync_dir(ckpt)
    fsync_dir(ckpt.parent)  # iter-N itself, when this made it
    files = dict(listed or {})
    for name in entries:
        top = ckpt / name
        for p in sorted([top] if top.is_file() else [q for q in top.rglob("*") if q.is_file()]):
            files[str(p.relative_to(ckpt))] = {"bytes": p.stat().st_size, "sha256": file_digest(p)}
    body = {"part": part, "files": files, **(meta or {})}
    write_json_atomic(manifest_path(ckpt, part), body)
    return file_digest(manifest_path(ckpt, part))


def read_manifest(ckpt: Path, part: str) -> dict[str, Any] | None:
    """The part's manifest when every file it lists is there with its size and SHA-256; else None (logged)."""
    try:
        return verified_manifest(LocalFiles(), str(ckpt), part)
    except (OSError, ValueError) as e:
        log.warning("checkpoint %s: the %s part is not usable: %s", ckpt.name, part, e)
        return None


def checkpoint_dirs(root: Path) -> list[tuple[int, Path]]:
    """(version, directory) of every `iter-N` under `root`, newest first."""
    out = []
    for p in root.glob(f"{PREFIX}*"):
        try:
            out.append((int(p.name[len(PREFIX) :]), p))
        except ValueError:
            continue
    return sorted(out, reverse=True)


PART_ENTRIES = {"trainer": ("model", "ranks"), "controller": ("controller",)}  # what each part writes in iter-N


def prune(root: Path, part: str, *, complete: Iterable[int], keep: int) -> list[int]:
    """Remove `part` of every checkpoint under `root` older than the `keep` newest of `complete` (the versions
    whose every part is known written: a checkpoint `latest` moved to); 0 keeps everything, and nothing goes
    before `keep` are complete, so the newest complete one is never removed. The versions pruned, oldest first."""
    done = sorted(set(complete))
    if keep <= 0 or len(done) < keep:
        return []
    floor = done[-keep]
    pruned = []
    for version, ckpt in sorted(checkpoint_dirs(root)):
        if version < floor:
            remove_part(ckpt, part)
            pruned.append(version)
    if pruned:
        log.info("checkpoints %s: removed the %s part of v%s (keep %d)", root, part, pruned, keep)
    return pruned


def remove_part(ckpt: Path, part: str) -> None:
    """One part of checkpoint `ckpt`: its manifest first (what is left is never read as that part), then the top
    entries it lists and the part's usual ones (and a crashed write's temporaries); the directory too once no
    part is left in it."""
    manifest = manifest_path(ckpt, part)
    try:
        listed = {str(f).split("/")[0] for f in json.loads(manifest.read_text()).get("files", {})}
    except (OSError, ValueError, AttributeError):
        listed = set()
    listed = {n for n in listed if n not in ("", ".", "..") and not n.startswith(("MANIFEST.", LATEST))}
    manifest.unlink(missing_ok=True)
    for name in sorted(listed | set(PART_ENTRIES.get(part, ()))):
        for p in [ckpt / name, *ckpt.glob(f".{name}.tmp-*")]:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # the other part (same site), or something not ours, is still there
        ckpt.rmdir()


def set_latest(root: Path, version: int) -> None:
    write_json_atomic(root / LATEST, {"version": version})


def latest_complete(root: Path, parts: Iterable[str] = PARTS) -> int | None:
    """The newest version whose every part in `parts` verifies here: the `latest` pointer's when it does, else
    the newest older one (a pointer moved past a checkpoint that was later damaged is not trusted; a damaged
    pointer is not read as "none"). None when no checkpoint verifies. Logs what it used and skipped."""
    wanted = tuple(parts)

    def problem(version: int) -> str | None:
        for part in wanted:
            try:
                verified_manifest(LocalFiles(), str(root / f"{PREFIX}{version}"), part)
            except (OSError, ValueError) as e:
                return f"{part} part: {e}"
        return None

    pointer = root / LATEST
    try:
        point = choose_resume(
            pointer.read_text() if pointer.is_file() else None, [v for v, _ in checkpoint_dirs(root)], problem
        )
    except RlctlError as e:
        log.warning("%s: %s", root, e)
        return None
    for version, why in point.skipped:
        log.warning("%s: checkpoint v%d not used: %s", root, version, why)
    log.info("%s: latest complete checkpoint v%d (%s)", root, point.version, point.pointer)
    return point.version or None
