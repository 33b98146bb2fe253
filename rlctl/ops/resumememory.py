"""A resumed job's trainer rank judged against its GPU again, with the job as job.json has it then
(`judge_memory`): by `launch --resume` before its run starts, and by the launcher before each automatic resume
(`rlctl.ops.autoresume.Runs`), as `rlctl check` and `--trainer-split` judge a split."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.errors import UsageError

if TYPE_CHECKING:
    from rlctl.config.job import JobFile
    from rlctl.launch.jobdir import JobDir

# job.json's fields a trainer rank's memory is priced on (`trainer_memory_refusal`): the model's figures, its task's
# rows, the batch's cuts, the trainer's backend, checkpointing and LoRA, the algorithm's reference policy, critic and
# mini-batches
MEMORY_FIELDS = ("algorithm", "batch", "model", "task", "trainer")


def judge_memory(jd: JobDir, plan: dict[str, Any], *, edited: list[str]) -> str | None:
    """A trainer rank at the plan's split judged against its site's GPUs with the job as job.json has it now
    (`trainer_memory_refusal`, as `rlctl check` and `--trainer-split` judge a split). Where job.json was edited since
    the launch in a field a rank's memory is priced on (`MEMORY_FIELDS` among `edited`: a larger
    batch.train_micro_batch_tokens or _samples, longer task rows, trainer.activation_checkpointing off) and a rank no
    longer fits: UsageError, one line naming those fields alone. Unedited there, the job as launched, which ran at this
    split, is not refused where this rlctl prices it otherwise than the one that launched it (Qwen3's q/k norms, a
    tied head, activations: priced since); the warning line the resume says before its run starts is returned, with
    the figures and what to change should a rank run out of memory; versus resumed with no word. None: it fits."""
    from rlctl.launch.backends import read_sites
    from rlctl.launch.layout import trainer_parallel
    from rlctl.ops.preflight.memory import trainer_memory_refusal

    name = str(plan["trainer"]["site"])
    if (site := read_sites(jd.path, required=True).get(name)) is None:
        return None  # refused as the run lays its agents out
    job, split = resumed_job(jd), trainer_parallel(plan)
    if (why := trainer_memory_refusal(job, name, site, split, arch=job.model.arch)) is None:
        return None
    if edited := [field for field in edited if field in MEMORY_FIELDS]:
        raise UsageError(
            f"{jd.job_json} was edited since the launch ({', '.join(edited)}), and with the job as edited {why}",
            hint="undo the edit, or resume at a split that fits it: --trainer-split tp=T,pp=P,dp=D",
        )
    return (
        f"warning: as this rlctl prices the job, on site {name!r} {why}; resumed at the split it was launched at (not "
        "refused: the rlctl that launched it may have priced it otherwise), a rank may run out of GPU memory: if one "
        "does, lower "
        f"batch.train_micro_batch_tokens in {jd.job_json}, or resume on more ranks (--trainer-split tp=T,pp=P,dp=D, "
        "checked by --dry-run)"
    )


def resumed_job(jd: JobDir) -> JobFile:
    """The job a resume runs (job.json), an HF model's path the job dir's copy."""
    from rlctl.config.model import HfModel

    job = jd.read_job()
    if isinstance(job.model, HfModel):
        # the job dir's copy, the model the run trains, for the split's checks and the planner's figures alike,
        # under the name the launch's plan gave it (the folder's, which a named profile is matched by); versus the
        # planner reading the folder the job was launched from, gone since (its figures dropped) or holding another
        # model (priced for that one)
        name = job.model.name or Path(job.model.path).resolve().name
        copy = job.model.model_copy(update={"path": str(jd.init_model), "name": name})
        job = job.model_copy(update={"model": copy})
    return job
