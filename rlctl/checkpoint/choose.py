"""Which checkpoint a resume continues from, and the files that say so.

    checkpoints/latest.json   {"version": N}: moved by the controller once both parts of iter-N are complete
    checkpoints/iter-N/MANIFEST.<part>.json   one per part (trainer, controller): every file's bytes and SHA-256

Which checkpoint a resume uses (the launcher decides once, reading each part on its own site):

    latest.json ─▶ v ≤ that ─▶ newest first: both parts' manifests verify, trainer's digest = the one the
    (damaged: no bound)        controller's part names?  yes ─▶ use it   no ─▶ log why, try the next older
    none verifies ─▶ RlctlError (one line); no pointer and no checkpoint at all ─▶ 0 (nothing to lose)

Without a pointer (or with a damaged one) the newest `iter-N` that verifies is the current lineage's: when a
resumed run starts, its controller and trainer move their parts of every checkpoint newer than the one it
continues from to `checkpoints/abandoned/` (`rlctl.checkpoint.files.set_aside_newer`), so no checkpoint of a
run a resume abandoned, nor a part of one beside a part the new run wrote, is ever taken.

The launcher passes the choice to the agents as RLCTL_RESUME_VERSION (`rlctl.launch.agentenv`); they read it
back with `resume_version`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlctl.config.job import JobFile
from rlctl.errors import RlctlError
from rlctl.launch.agentenv import ENV_RESUME, ParallelConfig
from rlctl.profiler.traincost import trained_params

if TYPE_CHECKING:
    from rlctl.launch.sitefs import HostFiles

LATEST_POINTER = "latest.json"  # in the job's checkpoints/: {"version": N}, moved by the controller


CHECKPOINT_PARTS = ("trainer", "controller")  # who writes each part of `checkpoints/iter-N/`, on its own site
SHA256_HEX = re.compile(r"[0-9a-f]{64}")  # a manifest's digest (`trainer_digest`: the trainer's, as hashlib writes it)


def manifest_name(part: str) -> str:
    return f"MANIFEST.{part}.json"


def parse_latest(text: str) -> int:
    """The version a `latest.json` pointer names. ValueError for one that does not parse: it is replaced
    atomically, so that is a damaged file — never read as "no checkpoint" (that would start the job over)."""
    try:
        version = json.loads(text)["version"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"not a checkpoint pointer: {text[:40]!r}") from e
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise ValueError(f"not a checkpoint version: {version!r}")
    return version


def named_version(text: str) -> int | None:
    """The version a command line names (`--checkpoint`): `20`, or `v20` as rlctl's messages name checkpoints; None
    for neither."""
    m = re.fullmatch(r"[vV]?(\d+)", text)
    return int(m[1]) if m else None


def checkpoints_at(job: JobFile, version: int) -> bool:
    """Whether the trainer checkpoints `version` (one of `checkpoint_versions`): each `checkpoint.every_iterations`,
    and the last."""
    every = job.checkpoint.every_iterations
    return version == job.iterations or (0 < version < job.iterations and every > 0 and version % every == 0)


def checkpoint_versions(job: JobFile, *, earlier: Iterable[int] = ()) -> list[int]:
    """Every version the trainer checkpoints (each `checkpoint.every_iterations`, and the last), newest first;
    with the last of each `earlier` iteration count the job had (`launch --resume --iterations`: a finished job's
    last checkpoint, which the new count may not checkpoint at)."""
    every = job.checkpoint.every_iterations
    last = {job.iterations, *(n for n in earlier if n < job.iterations)}
    return sorted({*last, *(range(every, job.iterations + 1, every) if every else ())}, reverse=True)


# a checkpoint's bytes per parameter of each trained model: its fp32 weights (the policy's HF directory, a PPO
# critic's shard) and AdamW's two fp32 moments
CHECKPOINT_BYTES_PER_PARAM = 12


def checkpoint_bytes(job: JobFile) -> float:
    """About what one checkpoint of `job` takes on the trainer's site (RNG states and manifests aside)."""
    return CHECKPOINT_BYTES_PER_PARAM * trained_params(job.model.arch, job.algorithm.kind)


def checkpoints_held(job: JobFile) -> int:
    """The most checkpoints of `job` on disk at once: all it writes with `checkpoint.keep` 0; else `keep`, and one
    more while the newest is written (the older go once it is complete)."""
    written = len(checkpoint_versions(job))
    keep = job.checkpoint.keep
    return written if keep == 0 else min(written, keep + 1)


def checkpoints_set_aside(job: JobFile) -> int:
    """The most sealed checkpoints of `job` in `checkpoints/abandoned/` at once, beside `checkpoints_held`: the ones
    resumes passed over (`rlctl.checkpoint.files.set_aside_newer`), of which the `checkpoint.keep` set aside last
    stay there — whatever the job writes, as each resume sets aside its own copy of a version. With keep 0 every one
    stays, and how many resumes will pass over is not known up front: 0 counted (the caller says so)."""
    return job.checkpoint.keep


def parsed_manifest(
    files: HostFiles, ckpt: str, part: str, *, version: int | None = None
) -> tuple[dict[str, Any], dict[str, tuple[int, str]]]:
    """(the manifest, every file it lists: its bytes and SHA-256) of one part of checkpoint directory `ckpt`, read and
    checked as `verified_manifest` checks it before any file it lists (it parses; it names `part` and, given,
    `version`, where it names them); ValueError saying what is wrong."""
    return manifest_fields(files.read_text(f"{ckpt}/{manifest_name(part)}"), part, version=version)


def manifest_fields(
    text: str | None, part: str, *, version: int | None = None
) -> tuple[dict[str, Any], dict[str, tuple[int, str]]]:
    """`parsed_manifest` of the text of one part's manifest (None: there is none), however it was read."""
    name = manifest_name(part)
    if text is None:
        raise ValueError(f"no {name}")
    try:
        body = json.loads(text)
        want = {str(rel): (int(w["bytes"]), str(w["sha256"])) for rel, w in body["files"].items()}
        named = body.get("version", body.get("counters", {}).get("version", version))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{name} does not parse ({type(e).__name__}: {e})") from e
    if "part" in body and body["part"] != part:
        raise ValueError(f"{name} is of part {body['part']!r}, not {part!r}")
    if version is not None and (type(named) is not int or named != version):
        raise ValueError(f"{name} is of checkpoint version {named!r}, not v{version} (its directory's)")
    trainer = body.get("trainer_digest")
    if part == "controller" and not (isinstance(trainer, str) and SHA256_HEX.fullmatch(trainer)):
        # every controller part rlctl wrote names its trainer part (`save_controller`): one that names none is damaged,
        # versus taken by `status --checkpoints` and a pull, refused by a resume and a KeyError in `load_controller`
        said = f"trainer_digest {trainer!r:.40} is not a SHA-256" if "trainer_digest" in body else "no trainer_digest"
        raise ValueError(f"{name} names no trainer part ({said})")
    return body, want


def parts_problem(parts: Iterable[str], read: Callable[[str], dict[str, Any]]) -> str | None:
    """Why one checkpoint's `parts` (in this order) are not usable together, or None: the first whose manifest `read`
    refuses (ValueError or OSError naming what is wrong; else its manifest, with "digest"), or a controller part that
    names another trainer part (`trainer_digest`) than the one there (one that names none, or no SHA-256, its manifest's
    read refuses: `manifest_fields`, as for a resume and `load_controller`). The rule a resume's `latest_complete`
    applies with every byte verified and `status --checkpoints` (and a pull of the best) with sizes alone."""
    seen: dict[str, dict[str, Any]] = {}
    for part in parts:
        try:
            seen[part] = read(part)
        except (OSError, ValueError) as e:
            return f"{part} part: {e}"
    named = seen.get("controller", {}).get("trainer_digest")
    if "trainer" in seen and "controller" in seen and named != seen["trainer"]["digest"]:
        return "its trainer part is not the one its controller part was written with"  # as pick_checkpoint
    return None


def verified_manifest(
    files: HostFiles,
    ckpt: str,
    part: str,
    *,
    version: int | None = None,
    only: Callable[[str], bool] | None = None,
) -> dict[str, Any]:
    """The manifest of one part of checkpoint directory `ckpt` (as `files` sees it) when every file it lists is
    there with its size and SHA-256 (`only`: the listed files it accepts, by path relative to `ckpt`), plus
    "digest": the manifest's own SHA-256. ValueError saying what is wrong. The part and the version its writer
    names in it (`write_part`; the controller's "version", `save_controller`; the trainer's counters' "version",
    the one its ranks resume at) must be `part` and, given, `version` (the N of its iter-N): a manifest of another
    part or checkpoint copied or renamed there, or one byte of those fields changed (the controller's manifest is
    the one file no digest covers), is refused, versus those fields read by nothing and such a part taken; a
    manifest that names neither (written before them) is taken. A controller's must name its trainer part
    (`trainer_digest`, a SHA-256, as every one rlctl wrote does: `manifest_fields`)."""
    name = manifest_name(part)
    body, want = parsed_manifest(files, ckpt, part, version=version)
    if only is not None:
        want = {rel: w for rel, w in want.items() if only(rel)}
    have = files.states(ckpt, [*want, name])
    if name not in have:  # there when read, gone now: the part is being rewritten or removed
        raise ValueError(f"{name} went as it was read (the part rewritten or removed meanwhile)")
    for rel, (size, sha) in sorted(want.items()):
        got = have.get(rel)
        if got is None:
            raise ValueError(f"{rel} is missing")
        if got.size != size:
            raise ValueError(f"{rel} does not match {name}: {got.size} bytes, {size} listed")
        if got.sha256 != sha:
            raise ValueError(f"{rel} does not match {name}: SHA-256 {got.sha256[:12]}…, {sha[:12]}… listed")
    body["digest"] = have[name].sha256
    return dict(body)


def split_problem(manifest: dict[str, Any], trainer: ParallelConfig) -> str | None:
    """Why a trainer split as `trainer` (tp × pp × dp) cannot load the trainer part whose manifest this is, or
    None. Data-parallel replica 0 wrote a shard per (tp, pp) position at the part's split
    (`ParallelConfig.first_replica_ranks`); a trainer at another tp × pp × dp rebuilds each rank's optimizer
    state from them (`rlctl.checkpoint.resplit`). FSDP's sharded state (each rank its own part of the replica) is
    rebuilt at another dp, and from or into a split that is not sharded (`rlctl.checkpoint.refsdp`), at tp 1 pp 1
    on both sides (the torch trainer's); not at another tp × pp."""
    split = manifest.get("split")
    if not isinstance(split, dict) or "ranks" not in manifest:
        return "written before checkpoints kept every trainer rank's state (no split in MANIFEST.trainer.json)"
    have = tuple(int(split.get(k, 0)) for k in ("tp", "pp", "dp"))
    sharded = bool(split.get("fsdp"))
    if not sharded and not trainer.fsdp:
        return None
    if have[:2] == (1, 1) == (trainer.tp, trainer.pp):
        return None
    if have == (trainer.tp, trainer.pp, trainer.dp) and sharded == bool(trainer.fsdp):
        return None  # (each rank restores its own shard as it is)
    return written_at(manifest, trainer) + ": FSDP's sharded state is rebuilt at another dp alone, at tp 1 pp 1"


SPLIT_REFUSED = "which this trainer"  # `written_at`'s words: the launcher's hint tells a split's refusal by them


def written_at(manifest: dict[str, Any], trainer: ParallelConfig) -> str:
    """ "written by a trainer at tp 2 pp 1 dp 1, which this trainer (tp 1 pp 2 dp 1) cannot load": the start of
    the line that refuses a trainer part at another split (the reason follows)."""
    split = manifest["split"]
    have = tuple(int(split.get(k, 0)) for k in ("tp", "pp", "dp"))
    fsdp = " fsdp" if split.get("fsdp") else ""
    return (
        f"written by a trainer at tp {have[0]} pp {have[1]} dp {have[2]}{fsdp}, {SPLIT_REFUSED} "
        f"(tp {trainer.tp} pp {trainer.pp} dp {trainer.dp}{' fsdp' if trainer.fsdp else ''}) cannot load"
    )


@dataclass(frozen=True)
class ResumePoint:
    version: int  # 0: the job never completed a checkpoint (it starts over)
    pointer: str  # what latest.json said, for the log
    skipped: tuple[tuple[int, str], ...] = ()  # newer checkpoints not used, and why


def choose_resume(
    pointer: str | None,
    versions: Iterable[int],
    problem: Callable[[int], str | None],
    *,
    where: str = "",
    start_over: str = "rlctl launch JOB.yaml",
) -> ResumePoint:
    """The checkpoint a resume continues from: the newest of `versions` (checkpoints on disk) no newer than the
    one `latest.json` names (its text; None: no pointer) for which `problem(v)` finds nothing wrong, trying
    older ones in turn. A damaged pointer bounds nothing: every checkpoint is tried. RlctlError when there are
    checkpoints, or a pointer, but none verifies: resuming must never silently start the job over; it names
    `where` they were looked for (" in DIR") and, in its hint, the command `start_over` that launches the job anew."""
    named: int | None = None
    if pointer is None:
        said = "no latest.json"
    else:
        try:
            named = parse_latest(pointer)
            said = f"latest.json names v{named}"
        except ValueError as e:
            said = f"latest.json is damaged ({e})"
    skipped: list[tuple[int, str]] = []
    for v in sorted({*versions, *([named] if named else [])}, reverse=True):
        if named is not None and v > named:
            skipped.append((v, f"newer than latest.json (v{named}): its other part may be missing"))
            continue
        why = problem(v)
        if why is None:
            return ResumePoint(v, said, tuple(skipped))
        skipped.append((v, why))
    if not skipped and (pointer is None or named == 0):
        return ResumePoint(0, said)
    tried = "; ".join(f"v{v}: {why}" for v, why in skipped[:3]) or "no checkpoint on disk"
    more = f"; {len(skipped) - 3} more" if len(skipped) > 3 else ""
    raise RlctlError(
        f"no complete checkpoint to resume from{where} ({said}; {tried}{more})",
        hint=f"`{start_over}` starts the job over in a new directory",
    )


def resume_version() -> int | None:
    """The checkpoint version this agent continues from (`launch --resume`), or None for a fresh start."""
    value = os.environ.get(ENV_RESUME)
    return int(value) if value else None
