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
    checkpoints/abandoned/iter-N.<key>/   a checkpoint newer than the one a run resumed from: each agent moves
                                  its part there when the resumed run starts, if sealed (`set_aside_newer`;
                                  <key>: the trainer manifest's SHA-256, so one checkpoint's two parts share a
                                  directory); the `checkpoint.keep` newest are kept there (0: all)

Every file goes to a temporary name first and is renamed into place; the manifest is renamed into place
only after every file it lists is. A part without a manifest, whose files do not match it (size or SHA-256),
or whose manifest names another part or version than its own (or, a controller part's, no trainer part), is never
used: `latest_complete` falls back to the newest older checkpoint that verifies (the rule, and the check of a
manifest, are `rlctl.checkpoint.choose.choose_resume` / `verified_manifest`, which the launcher applies on each
part's site to pick the version a resumed job loads).
A resumed run abandons the checkpoints newer than the one it resumes from; their sealed parts are moved aside
(a part never sealed is removed: nothing can resume from it), so that `iter-*` holds one lineage: a resume that
finds no `latest.json`, or a damaged one, takes the newest checkpoint that verifies, which then is this lineage's
— never one of the abandoned run's, nor its part of a version beside the part this run rewrote (the controller's
part names its trainer part's manifest, too).
Files are read back with `torch.load(weights_only=True)` and JSON only: nothing is unpickled.
"""

from __future__ import annotations

import contextlib
import errno
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
from rlctl.checkpoint.choose import (
    choose_resume,
    manifest_fields,
    manifest_name,
    parts_problem,
    verified_manifest,
)
from rlctl.errors import RlctlError
from rlctl.launch.sitefs import LocalFiles, Survey

log = logging.getLogger(__name__)

PREFIX = "iter-"
ABANDONED = "abandoned"  # in checkpoints/: the parts of checkpoints newer than the one a run resumed from
CHUNK = 1 << 22
PRUNED = "checkpoints_pruned"  # the controller's event: the versions `checkpoint.keep` let go (`prune`'s list)


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


def read_manifest(ckpt: Path, part: str, *, version: int | None = None) -> dict[str, Any] | None:
    """The part's manifest when every file it lists is there with its size and SHA-256 (and it is of checkpoint
    `version`, given: `verified_manifest`); else None (logged)."""
    try:
        return verified_manifest(LocalFiles(), str(ckpt), part, version=version)
    except (OSError, ValueError) as e:
        log.warning("checkpoint %s: the %s part is not usable: %s", ckpt.name, part, e)
        return None


def checkpoint_dirs(root: Path) -> list[tuple[int, Path]]:
    """(version, directory) of every `iter-N` under `root` (N in ASCII digits, as the writers name it), newest first.
    Versus every name `int` reads: `iter-1_0` was version 10, `iter- 7` 7 and `iter--3` −3, beside the launcher's
    `stored_checkpoints`, which takes digits only."""
    out = []
    for p in root.glob(f"{PREFIX}*"):
        n = p.name[len(PREFIX) :]
        if n.isascii() and n.isdigit():
            out.append((int(n), p))
    return sorted(out, reverse=True)


PART_ENTRIES = {"trainer": ("model", "ranks"), "controller": ("controller",)}  # what each part writes in iter-N


def prune(root: Path, part: str, *, complete: Iterable[int], keep: int) -> list[int]:
    """Remove `part` of every checkpoint under `root` older than the `keep` newest of `complete` (`prunable`). The
    versions pruned, oldest first."""
    pruned = prunable(root, part, complete=complete, keep=keep)
    remove_parts(root, part, pruned, keep=keep)
    return pruned


def prunable(root: Path, part: str, *, complete: Iterable[int], keep: int) -> list[int]:
    """The versions of the checkpoints under `root` older than the `keep` newest of `complete` (the versions whose
    every part is known written: a checkpoint `latest` moved to, the one a run resumed from) and of the checkpoints
    older than all of those whose `part` is sealed here (a resumed run's: the ones the runs before it kept), oldest
    first; none when `keep` is 0 (everything kept) or fewer than `keep` are counted, so the newest complete one is
    never among them. (Counting only `complete`, a run resumed with `keep` ≥ 3 held the `keep` − 1 older ones
    until it had sealed `keep` − 1 of its own: up to 2·`keep` − 1 on disk, where `checkpoints_held` counts
    `keep` + 1.)"""
    done = set(complete)
    if keep <= 0 or not done:
        return []
    on_disk = sorted(checkpoint_dirs(root))
    done |= {version for version, ckpt in on_disk if version < min(done) and manifest_path(ckpt, part).is_file()}
    if len(done) < keep:
        return []
    floor = sorted(done)[-keep]
    return [version for version, _ in on_disk if version < floor]


def newest_complete(complete: Iterable[int], *, keep: int) -> list[int]:
    """Of the versions of complete checkpoints `complete`, those a later prune reads (`prunable`): the `keep` newest,
    the newest alone for `keep` 0 (nothing pruned). Held so, a job of weeks holds a few versions, versus one for
    every checkpoint it took (the controller's and each trainer rank's list)."""
    return sorted(set(complete))[-max(keep, 1) :]


def remove_parts(root: Path, part: str, versions: list[int], *, keep: int) -> None:
    """Remove `part` of checkpoints `versions` under `root` (`prunable`'s, for `keep`: logged)."""
    for version, ckpt in sorted(checkpoint_dirs(root)):  # (its directory as named: `iter-007` is v7 too)
        if version in versions:
            remove_part(ckpt, part)
    if versions:
        log.info("checkpoints %s: removed the %s part of v%s (keep %d)", root, part, versions, keep)


def _part_paths(ckpt: Path, part: str) -> list[Path]:
    """What of checkpoint `ckpt` belongs to `part`, its manifest first: the top entries the manifest lists and the
    part's usual ones (a part whose manifest is gone or damaged still has those), and a crashed write's
    temporaries, its manifest's too (left there, the directory outlived every prune). Only paths that exist."""
    manifest = manifest_path(ckpt, part)
    try:
        listed = {str(f).split("/")[0] for f in json.loads(manifest.read_text()).get("files", {})}
    except (OSError, ValueError, AttributeError):
        listed = set()
    listed = {n for n in listed if n not in ("", ".", "..") and not n.startswith(("MANIFEST.", LATEST))}
    paths = [manifest, *sorted(ckpt.glob(f".{manifest.name}.tmp-*"))]
    for name in sorted(listed | set(PART_ENTRIES.get(part, ()))):
        paths += [ckpt / name, *sorted(ckpt.glob(f".{name}.tmp-*"))]
    return [p for p in paths if p.exists() or p.is_symlink()]


def remove_part(ckpt: Path, part: str) -> None:
    """One part of checkpoint `ckpt`: its manifest first (what is left is never read as that part), then the rest
    of it (`_part_paths`); the directory too once no part is left in it."""
    for p in _part_paths(ckpt, part):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # the other part (same site), or something not ours, is still there
        ckpt.rmdir()


def _lineage_key(ckpt: Path, part: str) -> str:
    """What names a checkpoint across its two parts: the SHA-256 of its trainer manifest (the controller's part
    names it), short; "unkeyed" for a manifest that names none (unreadable, or a controller part written before the
    key). Two parts of one checkpoint set aside on one site land in one directory; parts of two lineages never do."""
    manifest = manifest_path(ckpt, part)
    try:
        digest = file_digest(manifest) if part == "trainer" else str(json.loads(manifest.read_text())["trainer_digest"])
    except (OSError, ValueError, KeyError, TypeError):
        return "unkeyed"
    return digest[:12] if digest.isalnum() else "unkeyed"


def set_aside_newer(root: Path, part: str, *, resumed: int, keep: int) -> list[int]:
    """A run that resumes from checkpoint `resumed` (0: from none) abandons every checkpoint newer than it. `part` of
    each that is sealed (its manifest there) moves, manifest first, to `root/abandoned/iter-N.<key>/`
    (`_lineage_key`); one never sealed (a write cut short: the checkpoint being written when the run died, what
    most auto-resumes leave) is removed — no resume can use it, and set aside it took a checkpoint's disk per
    resume. So what stays under `root/iter-*` is one lineage — the run's own checkpoints and the ones it descends
    from — and a resume without `latest.json` (the newest that verifies) can take neither an abandoned checkpoint
    nor a part of one beside a part this run rewrote. Then `abandoned/` is bounded as `checkpoint.keep` bounds
    `iter-*` (`_bound_abandoned`: `part` of the `keep` newest sealed there is kept; 0: all). The versions moved,
    oldest first; a log line for each of what was moved and what was removed."""
    moved, removed = [], []
    for version, ckpt in sorted(checkpoint_dirs(root)):
        paths = _part_paths(ckpt, part) if version > resumed else []
        if not paths:
            continue
        if not manifest_path(ckpt, part).exists():
            remove_part(ckpt, part)
            removed.append(version)
            continue
        name = f"{ckpt.name}.{_lineage_key(ckpt, part)}"
        dest, n = root / ABANDONED / name, 1
        while any((dest / p.name).exists() for p in paths):  # this version's part set aside by an earlier resume
            n += 1
            dest = root / ABANDONED / f"{name}.{n}"
        dest.mkdir(parents=True, exist_ok=True)
        for p in paths:
            os.replace(p, dest / p.name)
        fsync_dir(dest)
        fsync_dir(ckpt)
        with contextlib.suppress(OSError):  # the other part (same site) is set aside by its own agent
            ckpt.rmdir()
        moved.append(version)
    if moved:
        fsync_dir(root / ABANDONED)
        log.warning(
            "checkpoints %s: set aside the %s part of v%s in %s/: newer than v%d, which this run resumes from, so "
            "of an abandoned lineage (no resume continues it)",
            root,
            part,
            moved,
            ABANDONED,
            resumed,
        )
    if removed:
        log.warning(
            "checkpoints %s: removed the %s part of v%s: newer than v%d, which this run resumes from, and never "
            "sealed (a write cut short: no resume can use it)",
            root,
            part,
            removed,
            resumed,
        )
    _bound_abandoned(root / ABANDONED, part, keep=keep)
    return moved


def _bound_abandoned(aside: Path, part: str, *, keep: int) -> list[str]:
    """Remove `part` of the checkpoints set aside in `aside` but the `keep` newest sealed ones (by when that part was
    sealed: its manifest's time, which a move keeps; 0: keep every one), and any of it there without a manifest
    (set aside by an rlctl that moved unsealed parts too). The directories it was removed from, oldest first."""
    if not aside.is_dir():
        return []
    sealed, gone = [], []
    for d in sorted(p for p in aside.iterdir() if p.is_dir()):
        manifest = manifest_path(d, part)
        if manifest.exists():
            sealed.append((manifest.stat().st_mtime, d.name, d))
        elif _part_paths(d, part):
            remove_part(d, part)
            gone.append(d.name)
    past = sorted(sealed)[: max(0, len(sealed) - keep)] if keep > 0 else []
    for _, name, d in past:
        remove_part(d, part)
        gone.append(name)
    if gone:
        log.warning(
            "checkpoints %s: removed the %s part of %s in %s/ (never sealed, or not among the checkpoint.keep: %d "
            "newest sealed there)",
            aside.parent,
            part,
            gone,
            ABANDONED,
            keep,
        )
    return gone


def sized_manifest(seen: Survey, ckpt: str, part: str, *, version: int) -> dict[str, Any]:
    """The manifest of one part of checkpoint directory `ckpt` (relative to the directory `seen` looked at:
    `HostFiles.survey`, here or on a site's host over SSH, one look for every checkpoint), checked without reading any
    file it lists: `manifest_fields`, and every file it lists there at its size. Cheap (sizes only: no SHA-256 of a
    model's gigabytes), so it misses a file changed in place at the same size, which only `verified_manifest` finds (a
    resume, a pull). Plus "digest": the manifest's own SHA-256, as `verified_manifest` gives it (a small file).
    ValueError saying what is wrong."""
    name = manifest_name(part)
    raw = seen.texts.get(f"{ckpt}/{name}")
    if raw is None and f"{ckpt}/{name}" in seen.sizes:  # (a manifest this user cannot read)
        raise ValueError(f"{name} cannot be read")
    body, want = manifest_fields(None if raw is None else raw.decode(errors="replace"), part, version=version)
    for rel, (size, _) in sorted(want.items()):
        got = seen.sizes.get(f"{ckpt}/{rel}")
        if got is None:
            raise ValueError(f"{rel} is missing")
        if got != size:
            raise ValueError(f"{rel} does not match {name}: {got} bytes, {size} listed")
    assert raw is not None  # (manifest_fields refused none)
    body["digest"] = hashlib.sha256(raw).hexdigest()
    return dict(body)


def set_latest(root: Path, version: int) -> None:
    write_json_atomic(root / LATEST, {"version": version})


def latest_complete(root: Path, parts: Iterable[str] = PARTS) -> int | None:
    """The newest version whose every part in `parts` verifies here: the `latest` pointer's when it does, else
    the newest older one (a pointer moved past a checkpoint that was later damaged is not trusted; a damaged
    pointer is not read as "none"), whose controller part names its trainer part. Without a pointer the newest
    `iter-N` is the current lineage's: a resumed run set the newer ones aside (`set_aside_newer`). None when no
    checkpoint verifies. Logs what it used and skipped."""
    wanted = tuple(parts)

    def problem(version: int) -> str | None:
        ckpt = str(root / f"{PREFIX}{version}")
        return parts_problem(wanted, lambda part: verified_manifest(LocalFiles(), ckpt, part, version=version))

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


def no_space(directory: Path, e: BaseException, *, needed_bytes: int | None = None) -> str | None:
    """'the disk is full: 1,024 B free in DIR (the write needs 551,872 B)' when the write into `directory` that
    raised `e` failed for want of space: ENOSPC (in `e` or what it came from), or fewer bytes free there than it
    needed (torch.save says only `unexpected pos 551872 vs 551764`); None when neither (or `directory` is gone)."""
    chain: BaseException | None = e
    enospc = False
    while chain is not None and not enospc:
        enospc = isinstance(chain, OSError) and chain.errno == errno.ENOSPC
        # a library's own error that carries the OS's (safetensors: `No space left on device (os error 28)`)
        enospc = enospc or f"(os error {errno.ENOSPC})" in str(chain) or os.strerror(errno.ENOSPC) in str(chain)
        chain = chain.__cause__ or chain.__context__
    where = next((p for p in (directory, *directory.parents) if p.is_dir()), None)
    if where is None:
        return None
    free = shutil.disk_usage(where).free
    if not enospc and (needed_bytes is None or free >= needed_bytes):
        return None
    needs = f" (the write needs {needed_bytes:,} B)" if needed_bytes is not None else ""
    return f"the disk is full: {free:,} B free in {where}{needs}"
