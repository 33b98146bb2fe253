"""What a job starts from, built once at launch in the job directory (then staged to every site):

model/init/   the starting policy: the built-in demo model after its SFT warm-up (cached), or the user's
              Hugging Face checkpoint directory's files (config, weights, tokenizer files), hard-linked where
              the job dir is on the same filesystem, else copied; weight files the loader does not read (a
              Mistral repo's consolidated.safetensors, a .bin beside the safetensors) left out
data/         a dataset task's prompts, tokenized once with the model's tokenizer (rlctl.rl.dataset), so
              every site sees the same token ids
reward/       a dataset task's reward file (`path/to/file.py:name`), copied with the modules beside it that it
              imports; the resolved job names it relative to the job directory, where the trainer loads it
data-heldout/ a dataset task's held-out file (`evaluation.path`), tokenized the same way, rows in file order;
              read where launch evaluates at the end (rlctl.ops.evaluation), not staged
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from rlctl.config.job import Job, JobFile, sft_steps
from rlctl.config.model import HfModel
from rlctl.config.task import DatasetTask, DigitsTask
from rlctl.errors import ConfigError, UsageError
from rlctl.launch.jobdir import JobDir, refuse_theirs
from rlctl.models.weightfiles import INDEX_FILE, SAFETENSORS_FILE, weight_files
from rlctl.rl.reward_files import copy_reward
from rlctl.rl.source import DATA_DIR, HELDOUT_DIR, REWARD_DIR, heldout_task
from rlctl.textutil import job_relative, not_a_file

log = logging.getLogger(__name__)


def _go_on() -> None:
    """The check when there is none: nothing ends the build."""


def resolve_inputs(spec: JobFile, job: Job) -> JobFile:
    """The job with a reward file's path rewritten to its copy in the job directory (see `copy_inputs`)."""
    task = spec.task
    if not isinstance(task, DatasetTask):
        return spec
    target, sep, name = task.reward.rpartition(":")
    if not sep or not target.endswith(".py"):
        return spec  # a built-in or an importable module: nothing to copy
    return spec.model_copy(
        update={"task": task.model_copy(update={"reward": f"{REWARD_DIR}/{Path(target).name}:{name}"})}
    )


def copy_inputs(jobdir: JobDir, spec: JobFile, job: Job, *, check: Callable[[], None] | None = None) -> None:
    """Build model/init (if missing), reward/, data/ and data-heldout/ (each dataset rebuilt only when its file,
    tokenizer or settings changed: a relaunch into the same dir reuses them). `check` (a launch's `rlctl stop`)
    ends it by raising, in the SFT warm-up and the tokenizing too: what it leaves is rebuilt by the next launch."""
    check = check if check is not None else _go_on
    refuse_users_dirs(jobdir, spec, job)  # before anything is built: model/init was, in the user's directory
    # (a missing file was refused once the checkpoint was linked or copied, a held-out one as task.path's)
    _refuse_missing_data(job)
    reward = _reward_file(job)
    if not (jobdir.init_model / "config.json").exists():
        _starting_policy(jobdir, spec, check=check)
    if isinstance(spec.task, DatasetTask):
        if reward is not None:
            copy_reward(reward, jobdir.path / REWARD_DIR)
        check()
        prepare_data(jobdir.path, spec, job, model_dir=jobdir.init_model, check=check)


def _refuse_missing_data(job: Job) -> None:
    """ConfigError, one line naming the field, where a dataset task's data file or held-out file is not there."""
    spec = job.spec
    if not isinstance(spec.task, DatasetTask):
        return
    named = {"task.path": spec.task.path}
    if spec.evaluation.heldout_prompts and spec.evaluation.path:
        named["evaluation.path"] = spec.evaluation.path
    for field, path in named.items():
        if not (job.path.parent / path).is_file():
            where = str(job.path.parent / path)
            raise ConfigError(str(job.path), field, f"{not_a_file(where)} {where!r}{job_relative(path)}")


def _reward_file(job: Job) -> Path | None:
    """A dataset task's reward file as the job names it (None for a built-in or a module); ConfigError, one line,
    where there is no such file."""
    task = job.spec.task
    if not isinstance(task, DatasetTask):
        return None
    target, sep, _ = task.reward.rpartition(":")
    if not sep or not target.endswith(".py"):
        return None
    named = job.path.parent / target
    if not named.resolve().is_file():
        shown = str(named.resolve())
        raise ConfigError(str(job.path), "task.reward", f"{not_a_file(shown)} {shown!r}{job_relative(target)}")
    return named


def refuse_users_dirs(jobdir: JobDir, spec: JobFile, job: Job) -> None:
    """ConfigError, one line, when the job dir's model/, data/, data-heldout/ or reward/ is the user's (a launch into
    the job file's own directory): asked before anything is built there, by `copy_inputs` and by `launch --detach`
    before it writes the rows its check kept (`prepare_data`), which it wrote into the user's directory first."""
    _refuse_users_model_dir(jobdir)
    _refuse_users_dirs(jobdir, spec, job)


def _refuse_users_dirs(jobdir: JobDir, spec: JobFile, job: Job) -> None:
    """ConfigError, one line, when the job dir's data/, data-heldout/ or reward/ is the user's (`refuse_not_ours`,
    `refuse_replacing_theirs`: a launch into the job file's own directory), before the launch builds anything there:
    asked only as each was built, the starting policy (model/init/, the SFT warm-up's or the user's checkpoint linked
    or copied) and reward/ were made in the user's directory first, and left there by the refusal."""
    task = spec.task
    if not isinstance(task, DatasetTask):
        return
    from rlctl.rl.dataset import refuse_not_ours
    from rlctl.rl.reward_files import refuse_replacing_theirs

    base = job.path.parent
    refuse_not_ours(base / task.path, jobdir.path / DATA_DIR)
    if spec.evaluation.heldout_prompts and spec.evaluation.path:
        refuse_not_ours(base / spec.evaluation.path, jobdir.path / HELDOUT_DIR)
    original = job.spec.task
    assert isinstance(original, DatasetTask)
    target, sep, _ = original.reward.rpartition(":")
    if sep and target.endswith(".py") and (base / target).is_file():  # (one that is not: refused as it is copied)
        refuse_replacing_theirs(base / target, jobdir.path / REWARD_DIR)


def _refuse_users_model_dir(jobdir: JobDir) -> None:
    """ConfigError, one line, when the job dir's model/ holds anything but the init/ a launch puts there (a launch
    into the job file's own directory, whose model/ is the user's: the checkpoint model.path names, say): the starting
    policy was linked into the user's directory, and all it held was staged to every site as the job's."""
    refuse_theirs(
        jobdir.init_model.parent,
        ours={jobdir.init_model.name},
        did="put there",
        then=f"a launch puts the starting policy in its {jobdir.init_model.name}/ and stages the whole directory to "
        "every site",
        hint="launch into another --job-dir (or move that directory, and model.path with it)",
    )


def prepare_data(
    job_dir: Path, spec: JobFile, job: Job, *, model_dir: Path, check: Callable[[], None] | None = None
) -> None:
    """A dataset task's data/ and data-heldout/ in `job_dir`, tokenized with `model_dir`'s tokenizer (each kept when
    its file, tokenizer and settings are unchanged; the rows a check read under `keeping_rows` written, not read
    again). Nothing for another task. `launch --detach` calls it after its check, with the model's own directory
    (the same tokenizer files as the job's model/init), so that the launcher it starts reads no row again."""
    task = spec.task
    if not isinstance(task, DatasetTask):
        return
    from rlctl.rl.dataset import prepare_dataset
    from rlctl.rl.tokenizer import load_tokenizer

    base = job.path.parent
    tokenizer = load_tokenizer(model_dir)
    prepare_dataset(task, data_path=base / task.path, tokenizer=tokenizer, out_dir=job_dir / DATA_DIR, check=check)
    if spec.evaluation.heldout_prompts and spec.evaluation.path:  # its rows in file order
        prepare_dataset(
            heldout_task(task, spec.evaluation.path),
            data_path=base / spec.evaluation.path,
            tokenizer=tokenizer,
            out_dir=job_dir / HELDOUT_DIR,
            check=check,
            heldout=True,
        )


def warmup_line(spec: JobFile) -> str | None:
    """The launch's line before the job's SFT warm-up (None: it has none): '(cached after the first run)' only where
    the warm-up's result is in the cache or the cache can be written, versus said before the warning that it was not
    cached (RLCTL_CACHE_DIR a file, a cache directory this user cannot write)."""
    steps = sft_steps(spec)
    if not steps or not isinstance(spec.task, DigitsTask):
        return None
    from rlctl.rl import sft
    from rlctl.rl.tasks import DigitsTask as Digits

    cached = sft.will_be_cached(Digits(spec.task), steps=steps, seed=spec.seed)
    return f"SFT warm-up: {steps} steps" + (" (cached after the first run)" if cached else "")


def _starting_policy(jobdir: JobDir, spec: JobFile, *, check: Callable[[], None] = _go_on) -> None:
    if isinstance(spec.model, HfModel):
        src = Path(spec.model.path)
        jobdir.init_model.mkdir(parents=True, exist_ok=True)
        unread = unread_weights(src)
        if unread:  # staged to every host of every site otherwise (a Mistral repo's second copy: ~14 GB at 7B)
            size = sum(f.stat().st_size for f in unread)
            log.info(
                "%s: %s not taken into the job (%.1f GB): weights in another format than the one the model is "
                "read from (%s)",
                src,
                ", ".join(sorted(f.name for f in unread)),
                size / 1e9,
                ", ".join(f.name for f in weight_files(src)),
            )
        for f in sorted(src.iterdir()):
            if f.is_file() and f not in unread:
                reference(f, jobdir.init_model / f.name)
        return
    if not isinstance(spec.task, DigitsTask) or spec.model.kind != "builtin":
        raise UsageError(
            f"the built-in model learns the digits task only; this job pairs model {spec.model.kind!r} "
            f"with task {spec.task.kind!r}",
            hint="use model kind 'hf' (a local Hugging Face checkpoint) for a dataset task",
        )
    from rlctl.models.tinygpt import TinyGPT
    from rlctl.rl import sft
    from rlctl.rl.tasks import DigitsTask as Digits

    model = TinyGPT()
    steps = sft_steps(spec)
    if steps:
        t0 = time.monotonic()
        model.load_state_dict(sft.warmup(Digits(spec.task), steps=steps, seed=spec.seed, check=check))
        jobdir.event("sft_warmup", steps=steps, seconds=round(time.monotonic() - t0, 2))
    model.save_pretrained(jobdir.init_model)


# files of model weights by suffix: those the loader does not read (`weightfiles.weight_files`) are not the model's
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt", ".ckpt", ".gguf", ".h5", ".msgpack")


def unread_weights(src: Path) -> set[Path]:
    """The files of checkpoint directory `src` that hold weights the model is not read from: a Mistral repo's
    consolidated.safetensors, a pytorch_model.bin beside the safetensors, a .pth/.gguf export; none where the
    directory's weights cannot be told (`weightfiles.weight_files` refuses it: said where the job's model is checked). A
    model.safetensors.index.json beside the model.safetensors read goes with its shards: vLLM reads an index's shards
    alone where the directory has one (and would find none)."""
    try:
        read = set(weight_files(src))
    except ConfigError:
        return set()
    unread = {f for f in src.iterdir() if f.is_file() and f.suffix in WEIGHT_SUFFIXES and f not in read}
    if (src / SAFETENSORS_FILE) in read and (src / INDEX_FILE).is_file():
        unread.add(src / INDEX_FILE)
    return unread


def reference(src: Path, dst: Path) -> str:
    """`dst` holds `src`'s bytes: a hard link where both are on one filesystem (no copy of a 15 GB checkpoint,
    no second copy on disk; it outlives `src`'s removal), else a copy. Staging records the starting model's
    checksums at the first launch and refuses a later launch of the job when they changed (`stage.INIT_RECORD`).
    Returns "linked" or "copied"."""
    try:
        os.link(src, dst)
        return "linked"
    except OSError:  # another filesystem, or links not allowed there
        shutil.copy2(src, dst)
        return "copied"
