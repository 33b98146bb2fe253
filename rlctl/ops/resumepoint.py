"""The checkpoint a resume continues from (`pick_checkpoint`): the newest whose controller part (on the
controller's site) and trainer part (on the trainer's) both verify and belong together, or the one
`--checkpoint V` names; the versions stored on the controller's site (`stored_checkpoints`); a job dir on this machine
whose events record completed checkpoints its checkpoints/ directory lost refused (`refuse_lost_checkpoints`)."""

from __future__ import annotations

import logging

from rlctl.checkpoint.choose import (
    LATEST_POINTER,
    ResumePoint,
    choose_resume,
    manifest_name,
    split_problem,
    verified_manifest,
)
from rlctl.checkpoint.files import PREFIX
from rlctl.errors import UsageError
from rlctl.launch.agentenv import ParallelConfig
from rlctl.launch.jobdir import JobDir
from rlctl.launch.sitefs import HostFiles, LocalFiles
from rlctl.ops.extend import completed_checkpoints

log = logging.getLogger(__name__)


def pick_checkpoint(
    controller: tuple[HostFiles, JobDir],
    trainer: tuple[HostFiles, JobDir],
    *,
    split: ParallelConfig | None = None,
    only: int | None = None,
    start_over: str = "rlctl launch JOB.yaml",
) -> ResumePoint:
    """The checkpoint a resume continues from (choose_resume), each part read through its own site's view of that site's
    job dir: the controller's part and `latest.json` on the controller's site, the trainer's part on the trainer's; the
    trainer part must be the one the controller part names (its manifest's SHA-256). The checkpoints whose controller
    manifest is there (the controller writes its part last) are tried, newest first: those on disk, not those the job's
    `checkpoint.every_iterations` makes now (a count edited in job.json since left the ones written before out).
    `split`: the trainer's tp × pp × dp, which may be another than the checkpoint's (each rank rebuilds its state:
    `rlctl.checkpoint.resplit`; FSDP's sharded state at another dp, sharded or not: `refsdp`) unless the state is
    sharded by FSDP at a tp × pp other than 1 × 1 (`split_problem`), else UsageError. `only`: that
    checkpoint or a UsageError saying why not (a roll-back the operator named). RlctlError where none verifies, naming
    the directories its parts were read in and, in its hint, the command `start_over` that launches the job anew."""
    c_fs, c_dir = controller
    t_fs, t_dir = trainer
    on_disk = stored_checkpoints(c_fs, c_dir)

    def problem(version: int) -> str | None:
        try:
            c = verified_manifest(c_fs, str(c_dir.checkpoint(version)), "controller", version=version)
        except ValueError as e:
            return f"controller part: {e}"
        try:
            t = verified_manifest(t_fs, str(t_dir.checkpoint(version)), "trainer", version=version)
        except ValueError as e:
            return f"trainer part: {e}"
        if c.get("trainer_digest") != t["digest"]:
            return "its trainer part is not the one its controller part was written with"
        why = split_problem(t, split) if split is not None else None
        if why is not None:  # not a damaged checkpoint: an older one would not fit either
            old = "no split" in why  # written before the trainer's ranks kept their shards: nothing can load it
            raise UsageError(
                f"{t_dir.checkpoint(version)}: {why}",
                hint="start the job anew with `rlctl launch JOB.yaml`"
                if old
                else "resume the job with the plan it was trained with (its plan.json), or start it anew",
            )
        return None

    if only is not None:
        why = problem(only) if only in on_disk else f"not on the controller's site ({c_dir.checkpoint(only)})"
        if why is not None:
            raise UsageError(f"--checkpoint v{only}: {why}", hint="name another with --checkpoint, or leave it out")
        return ResumePoint(only, f"--checkpoint v{only}")
    pointer = c_fs.read_text(str(c_dir.path / "checkpoints" / LATEST_POINTER))
    c_at, t_at = str(c_dir.checkpoints), str(t_dir.checkpoints)  # (each its own site's: a path there)
    where = f" in {c_at}" if c_at == t_at else f" in {c_at} (controller parts) and {t_at} (trainer parts)"
    return choose_resume(pointer, on_disk, problem, where=where, start_over=start_over)


def stored_checkpoints(fs: HostFiles, jobdir: JobDir) -> list[int]:
    """The versions whose controller part's manifest is in `jobdir`'s checkpoints/iter-N (as `fs` sees it), newest
    first (a resume's set aside in abandoned/ are not)."""
    name = manifest_name("controller")
    found = set()
    for rel in fs.list_files(str(jobdir.checkpoints)):
        top, _, rest = rel.partition("/")
        if rest == name and top.startswith(PREFIX) and top[len(PREFIX) :].isascii() and top[len(PREFIX) :].isdigit():
            found.add(int(top[len(PREFIX) :]))
    return sorted(found, reverse=True)


def refuse_lost_checkpoints(jobdir: JobDir, *, start_over: str = "rlctl launch JOB.yaml") -> None:
    """UsageError where `jobdir` (this machine's: the controller's site job dir, where the controller parts are) holds
    no checkpoint's controller part while its events record completed ones (`completed_checkpoints`): its checkpoints/
    directory missing, a file, or emptied. A resume would take it for a job that completed none and start it over
    from iteration 0 (its metrics and samples set aside as discarded), versus the one line naming the directory. A
    controller on another site keeps them there (`pick_checkpoint` reads them on it): not called for one."""
    if stored_checkpoints(LocalFiles(), jobdir) or not (held := completed_checkpoints(jobdir)):
        return
    path = jobdir.checkpoints
    if not path.exists():
        state = "is missing"
    elif not path.is_dir():
        state = "is not a directory"
    else:
        state = "holds no checkpoint's controller part (MANIFEST.controller.json in iter-N)"
    count = f"{len(held)} completed checkpoint{'s' if len(held) > 1 else ''} (v{held[0]}" + (
        f"…v{held[-1]})" if len(held) > 1 else ")"
    )
    raise UsageError(
        f"{path} {state}, but {jobdir.events.name} records {count}: not resumed (it would start the job over "
        "from iteration 0)",
        hint=f"put the checkpoints back in {path} and resume again, or `{start_over}` starts the job over in a new "
        "directory",
    )
