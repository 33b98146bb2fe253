"""A resumed job's trainer rank judged against its GPU again, with the job as job.json has it then
(`judge_memory`): by `launch --resume` before its run starts, and by the launcher before each automatic resume
(`rlctl.ops.autoresume.Runs`), as `rlctl check` and `--trainer-split` judge a split."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.errors import RlctlError, UsageError
from rlctl.launch.jobdir import JOB_LAUNCHED, MEMORY_FIELDS, job_field

if TYPE_CHECKING:
    from rlctl.config.job import JobFile
    from rlctl.launch.jobdir import JobDir

__all__ = ["MEMORY_FIELDS", "job_dir_model", "judge_memory", "resumed_job"]


def judge_memory(jd: JobDir, plan: dict[str, Any], *, edited: list[str]) -> str | None:
    """A trainer rank at the plan's split judged against its site's GPUs with the job as job.json has it now
    (`trainer_memory_refusal`, as `rlctl check` and `--trainer-split` judge a split). None: it fits.

    Where a rank does not fit and job.json was edited since the launch in a field a rank's memory is priced on
    (`MEMORY_FIELDS` among `edited`), the job as launched (those fields as job.json's `job_launched` keeps them) is
    priced too, by this rlctl, at the same split: where the edit raised a rank's need (a larger
    batch.train_micro_batch_tokens or _samples, longer task rows, trainer.activation_checkpointing off), UsageError,
    one line naming those fields, the need before and after and what a GPU holds. Otherwise — unedited there, an edit
    that did not raise the need (a cut lowered, though not far enough; algorithm.lr), or a job.json of an rlctl that
    kept no `job_launched` (nothing to tell an edit's effect by: never refused on memory) — the job, which ran at this
    split, is not refused where this rlctl prices it otherwise than the one that launched it (Qwen3's q/k norms, a
    tied head, activations: priced since); the warning line the resume says before its run starts is returned, with
    the figures and what to change should a rank run out of memory. Before, any edit of those fields was refused
    where a rank did not fit, though it lowered the need or changed none (the warning's advice, taken, refused)."""
    from rlctl.launch.backends import read_sites
    from rlctl.launch.layout import trainer_parallel
    from rlctl.ops.preflight.memory import trainer_memory

    name = str(plan["trainer"]["site"])
    if (site := read_sites(jd.path, required=True).get(name)) is None:
        return None  # refused as the run lays its agents out
    split = trainer_parallel(plan)
    job = resumed_job(jd)
    now = trainer_memory(job, name, site, split, arch=job.model.arch)
    if now is None or now.fits:
        return None
    if edited := [field for field in edited if field in MEMORY_FIELDS]:
        launched = _launched_job(jd)
        before = None if launched is None else trainer_memory(launched, name, site, split, arch=launched.model.arch)
        if before is None:
            unsure = f"{jd.job_json} keeps no launch record of the fields edited since ({', '.join(edited)})"
        elif now.need_gb > before.need_gb:
            raise UsageError(
                f"{jd.job_json} was edited since the launch ({', '.join(edited)}), which raised a rank's need from "
                f"{before.need_gb:.1f} to {now.need_gb:.1f} GB, past {now.usable_gb:.1f} GB usable: with the job as "
                f"edited {now.why}",
                hint="undo the edit, or resume at a split that fits it: --trainer-split tp=T,pp=P,dp=D",
            )
        else:
            unsure = (
                f"its edit since the launch ({', '.join(edited)}) did not raise a rank's need ({before.need_gb:.1f} "
                "GB as launched)"
            )
    else:
        unsure = "the rlctl that launched it may have priced it otherwise"
    return (
        f"warning: as this rlctl prices the job, on site {name!r} {now.why}; resumed at the split it was launched at "
        f"(not refused: {unsure}), a rank may run out of GPU memory: if one does, lower "
        f"batch.train_micro_batch_tokens in {jd.job_json}, or resume on more ranks (--trainer-split tp=T,pp=P,dp=D, "
        "checked by --dry-run)"
    )


def _launched_job(jd: JobDir) -> JobFile | None:
    """The job as launched in what a rank's memory is priced on: job.json's job with `MEMORY_FIELDS` as its
    `job_launched` keeps them (an HF model's path the job dir's copy, as `resumed_job`'s). None for a job.json
    without it (an rlctl before it), or one that this rlctl's job model does not read."""
    data = jd.read_json(jd.job_json)
    record = data.get(JOB_LAUNCHED) if isinstance(data, dict) else None
    if not isinstance(record, dict) or not isinstance(data.get("job"), dict):
        return None
    launched = {**data["job"], **{k: v for k, v in record.items() if k in MEMORY_FIELDS}}
    try:
        return job_dir_model(jd, jd.job_of({**data, "job": launched}))
    except RlctlError:
        return None


def resumed_job(jd: JobDir) -> JobFile:
    """The job a resume runs (job.json), an HF model's path the job dir's copy."""
    return job_dir_model(jd, jd.read_job())


def job_dir_model(jd: JobDir, job: JobFile) -> JobFile:
    """`job` with an HF model's path the job dir's copy (`resumed_job`)."""
    from rlctl.config.model import HfModel

    if isinstance(job.model, HfModel):
        # the job dir's copy, the model the run trains, for the split's checks and the planner's figures alike,
        # under the name the launch's plan gave it (the folder's, which a named profile is matched by); versus the
        # planner reading the folder the job was launched from, gone since (its figures dropped) or holding another
        # model (priced for that one)
        # (the folder the launch copied it from: model.path edited since to where it moved, under another name, is
        # read by no resume, `jobchanges._model_path_unread`, versus the planner's name taken from the edit)
        data = jd.read_json(jd.job_json)
        record = data.get(JOB_LAUNCHED) if isinstance(data, dict) else None
        launched = job_field(record, "model.path") if isinstance(record, dict) else None
        path = launched if isinstance(launched, str) else job.model.path
        name = job.model.name or Path(path).resolve().name
        copy = job.model.model_copy(update={"path": str(jd.init_model), "name": name})
        job = job.model_copy(update={"model": copy})
    return job
