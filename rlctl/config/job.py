"""Job files (`jobs/*.yaml`, kind: Job): what to train, where, and how the pipeline runs.

    apiVersion: rlctl/v1
    kind: Job
    name: demo
    inventory: [../clusters/local.yaml]      # relative to this file
    model: {kind: builtin, name: tiny-demo}
    task: {kind: digits}
    placement: {trainer: {site: local, gpus: 1}, rollout: [{site: local, gpus: 2}]}
    pipeline: {mode: async}

Everything else has defaults; `rlctl plan` fills `gpus: auto`.

The sections' models live beside this file: `model.py`, `task.py`, `algorithm.py`, `pipeline.py` (batch, pipeline,
placement, planning, rebalance), `runtime.py` (rollout, trainer, transport, weight_sync, metrics) and `lifecycle.py`
(checkpoint, warmup, evaluation); this one ties them into `JobFile` and loads it (`load_job`).
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from rlctl.config.algorithm import Algorithm, GrpoAlgorithm
from rlctl.config.base import KINDS, NAME_RE, Strict, check_header, read_yaml, validate
from rlctl.config.inventory import Inventory, load_inventory
from rlctl.config.lifecycle import DEMO_SFT_STEPS, Checkpoint, Evaluation, Warmup
from rlctl.config.model import HfModel, Model
from rlctl.config.pipeline import MAX_SAMPLES_AHEAD, Batch, Pipeline, Placement, Planning, Rebalance, rounds_ahead
from rlctl.config.runtime import Metrics, Rollout, Trainer, Transport, WeightSync
from rlctl.config.task import DatasetTask, DigitsTask, Task
from rlctl.config.tracking import Tracking
from rlctl.errors import ConfigError
from rlctl.textutil import did_you_mean, home_expanded, job_relative, not_a_file, one_of

# A job's iterations: a billion is decades at one a second. Past 2^64 the controller's first message failed (msgpack
# takes no larger int: `OverflowError`, the job failed at its start), and iteration × samples must stay in an int64.
MAX_ITERATIONS = 10**9


def _inventory_path(v: str) -> str:
    """An inventory file's path: `''` was the job file's own directory joined with nothing, said as '<dir> is a
    directory', and a URL was joined to it as a path ('no such file 'https:/x/h20.yaml'')."""
    if not v:
        raise ValueError("the path is empty; give an inventory file (clusters/*.yaml, relative to the job file)")
    if "://" in v:
        raise ValueError(f"{v!r} is a URL; rlctl reads inventory files of this machine: give one's path")
    return v


class JobFile(Strict):
    api_version: str = Field(alias="apiVersion")
    kind: Literal["Job"]
    name: Annotated[str, Field(pattern=NAME_RE)]
    inventory: list[Annotated[str, AfterValidator(_inventory_path)]] = Field(min_length=1)
    model: Model
    task: Task
    placement: Placement
    algorithm: Algorithm = GrpoAlgorithm(kind="grpo")
    iterations: Annotated[int, Field(gt=0, le=MAX_ITERATIONS)] = 100
    batch: Batch = Batch()
    pipeline: Pipeline = Pipeline()
    rollout: Rollout = Rollout()
    trainer: Trainer = Trainer()
    transport: Transport = Transport()
    weight_sync: WeightSync = WeightSync()
    metrics: Metrics = Metrics()
    checkpoint: Checkpoint = Checkpoint()
    planning: Planning = Planning()
    rebalance: Rebalance = Rebalance()
    warmup: Warmup = Warmup()
    evaluation: Evaluation = Evaluation()
    tracking: Tracking = Tracking()
    job_dir: str | None = Field(
        None,
        min_length=1,
        description="where the job's directory goes, relative to the job file as its other paths are; default: "
        "runs/<name>-<time> in the directory rlctl is run from ($RLCTL_HOME/runs/<name>-<time> when RLCTL_HOME is "
        "set), not the job file's; `launch --job-dir` overrides it",
    )
    # below 2^32: vLLM seeds numpy's global generator with it, which takes no more
    seed: int = Field(0, ge=0, le=2**32 - 1)


def sft_steps(spec: JobFile) -> int:
    """The SFT warm-up steps the launch runs: the job's `warmup.sft_steps`, else the built-in model's default on the
    digits task and none for any other (a Hugging Face model, a dataset task: `rlctl check` refuses a non-zero value
    set for them)."""
    if spec.warmup.sft_steps is not None:
        return spec.warmup.sft_steps
    return DEMO_SFT_STEPS if spec.model.kind == "builtin" and isinstance(spec.task, DigitsTask) else 0


def refills(spec: JobFile) -> int:
    """Groups the controller may draw per iteration in place of dropped ones (dynamic sampling; 0: off)."""
    algo = spec.algorithm
    if not isinstance(algo, GrpoAlgorithm) or not algo.dynamic_sampling:
        return 0
    return algo.max_refills if algo.max_refills is not None else spec.batch.prompts_per_iteration


class Job:
    """A validated job together with the inventory it runs on."""

    def __init__(
        self, spec: JobFile, inventory: Inventory, path: Path, *, mapping: dict[str, Any] | None = None
    ) -> None:
        self.spec = spec
        self.inventory = inventory
        self.path = path
        self.mapping = mapping  # the job file's mapping as it was read (as JSON reads it back): what a resume compares

    @property
    def name(self) -> str:
        return self.spec.name


def _home(path: Path, field: str, written: str) -> str:
    """`written`, the job file's `field`, with a leading `~` or `~user` expanded (`home_expanded`, the one rule): a
    home this machine does not know is refused naming the file and field, where os.path left `~nosuchuser/x` as
    written and it was read as a folder `~nosuchuser` beside the job file (a job_dir made there)."""
    try:
        return home_expanded(written)
    except ValueError as e:
        raise ConfigError(str(path), field, f"{written!r}: {e}", hint="give the path as ~/… or in full") from e


def _home_expanded(path: Path, spec: JobFile) -> JobFile:
    """The dataset task's data and reward files and the held-out file with a leading `~` expanded (`_home`), as
    model.path, inventory, job_dir and planning.profile are (each is read relative to the job file:
    `~/data/train.jsonl` was refused as no such file, `~` taken for a directory beside the job file)."""
    task, evaluation = spec.task, spec.evaluation
    if isinstance(task, DatasetTask):
        target, sep, name = task.reward.rpartition(":")
        reward = f"{_home(path, 'task.reward', target)}:{name}" if sep else task.reward
        task = task.model_copy(update={"path": _home(path, "task.path", task.path), "reward": reward})
    if evaluation.path is not None:
        evaluation = evaluation.model_copy(update={"path": _home(path, "evaluation.path", evaluation.path)})
    return spec.model_copy(update={"task": task, "evaluation": evaluation})


def _inventories(path: Path, spec: JobFile, inv_paths: list[Path]) -> Inventory:
    """The job's inventories; one that is a file of another kind of rlctl's (a job file, a profile) is refused naming
    the job's field, versus in the inventory file's own line `kind: must be 'Inventory' for this command, got 'Job'`
    (of `rlctl check JOB`, which reads job files)."""
    try:
        return load_inventory(inv_paths)
    except ConfigError as e:
        i = next((i for i, p in enumerate(inv_paths) if str(p) == e.file), None)
        if e.field != "kind" or i is None or (kind := read_yaml(inv_paths[i]).get("kind")) not in KINDS:
            raise
        raise ConfigError(
            str(path),
            f"inventory[{i}]",
            f"{e.file!r} is a file of kind {kind!r}, not an inventory; give an inventory file (kind: Inventory)"
            + job_relative(spec.inventory[i]),
        ) from e


def load_job(path: Path, *, profile_must_exist: bool = True) -> Job:
    """The job file at `path`, validated, with the inventories it names; its paths resolved against it.
    `profile_must_exist=False`: a `planning.profile` not written yet is resolved but not refused (`rlctl profile` is
    what writes it, and `rlctl plan --profile` prices the job with another)."""
    data = read_yaml(path)
    check_header(path, data, "Job")
    spec = _home_expanded(path, validate(path, data, JobFile))
    inv_paths = [  # as model.path
        Path(os.path.normpath(path.parent / _home(path, f"inventory[{i}]", p))) for i, p in enumerate(spec.inventory)
    ]
    for i, p in enumerate(inv_paths):
        try:
            p.stat()
        except (FileNotFoundError, NotADirectoryError) as e:
            missing = f"no such file {str(p)!r}{job_relative(spec.inventory[i])}"
            raise ConfigError(str(path), f"inventory[{i}]", missing) from e
        except OSError as e:  # e.g. a directory on the way this user may not enter
            raise ConfigError(str(path), f"inventory[{i}]", f"cannot read {str(p)!r}: {e.strerror or e}") from e
        if p.is_dir():  # read_yaml would name the directory alone ('' is the job file's own: 'jobs: is a directory')
            raise ConfigError(
                str(path),
                f"inventory[{i}]",
                f"{str(p)!r} is a directory; give an inventory file" + job_relative(spec.inventory[i]),
            )
        # else each of its sites was said to be defined twice, in that one file (or the file 'given twice', by a link)
        if (same := next((j for j, q in enumerate(inv_paths[:i]) if q.resolve() == p.resolve()), None)) is not None:
            raise ConfigError(
                str(path),
                f"inventory[{i}]",
                f"{str(p)!r} is inventory[{same}] too; list each inventory file once",
            )
    inventory = _inventories(path, spec, inv_paths)
    if isinstance(spec.model, HfModel):  # resolve against the job file, check it once, here
        from rlctl.models.hfdir import check_hf_dir

        model_dir = Path(os.path.normpath(path.parent / _home(path, "model.path", spec.model.path)))
        try:
            check_hf_dir(model_dir, name=spec.model.name)
        except ConfigError as e:
            from rlctl.models.hfdir import hub_id_hint

            hint = hub_id_hint(spec.model.path, model_dir)
            raise ConfigError(str(path), "model.path", str(e), hint=hint) from e
        except OSError as e:  # e.g. a directory this user may not read
            raise ConfigError(str(path), "model.path", f"cannot read {str(model_dir)!r}: {e.strerror or e}") from e
        spec = spec.model_copy(update={"model": spec.model.model_copy(update={"path": str(model_dir)})})
    if (profile := spec.planning.profile) is not None:  # resolved against the job file, as model.path
        where = Path(os.path.normpath(path.absolute().parent / _home(path, "planning.profile", profile)))
        if profile_must_exist and not where.is_file():
            raise ConfigError(
                str(path),
                "planning.profile",
                f"{not_a_file(where)} {str(where)!r}{job_relative(profile)}",
                hint=f"write it with `rlctl profile --job {shlex.quote(str(path))} -o {shlex.quote(str(where))}`",
            )
        spec = spec.model_copy(update={"planning": spec.planning.model_copy(update={"profile": str(where)})})
    if errors := cross_field_errors(path, spec, inventory):
        raise errors[0]
    if spec.job_dir is not None:  # like every path of the job file: the same job dir from wherever it is launched
        job_dir = os.path.normpath(path.absolute().parent / _home(path, "job_dir", spec.job_dir))
        spec = spec.model_copy(update={"job_dir": job_dir})
    return Job(spec, inventory, path, mapping=json.loads(json.dumps(data, default=str)))


def cross_field_errors(path: Path, spec: JobFile, inventory: Inventory) -> list[ConfigError]:
    """What a job file `path` is refused for beyond each field's own validation, its sites once its inventory is read
    (a placement's site unknown or too small for its GPUs, a rollout site twice, an unknown controller site) and
    fields bound by others (GRPO's group of 1, a pipeline.staleness past the iterations or the rounds the controller
    creates), in the order `load_job` raises the first; a resume's check of an edited job.json says those of the
    fields edited (`rlctl.ops.resumecheck`), against the sites as launched and the resume's iteration count."""
    out: list[ConfigError] = []
    roles = [("placement.trainer", spec.placement.trainer)] + [
        (f"placement.rollout[{i}]", r) for i, r in enumerate(spec.placement.rollout)
    ]
    for field, role in roles:
        if role.site not in inventory.sites:
            known = f"unknown site {role.site!r}; known: {one_of(inventory.sites)}"
            out.append(ConfigError(str(path), f"{field}.site", known + did_you_mean(role.site, inventory.sites)))
        elif role.gpus != "auto" and role.gpus > (has := inventory.sites[role.site].total_gpus):
            out.append(
                ConfigError(str(path), f"{field}.gpus", f"{role.gpus} GPUs asked but site {role.site!r} has {has}")
            )
    if isinstance(spec.algorithm, GrpoAlgorithm) and spec.batch.samples_per_prompt < 2:
        why = (
            "GRPO's advantage compares a prompt's samples with each other: a group of 1 has advantage 0 and trains "
            "nothing; use 2 or more (or algorithm.kind 'ppo')"
        )
        out.append(ConfigError(str(path), "batch.samples_per_prompt", why))
    eta = spec.pipeline.staleness
    if eta is not None and eta > spec.iterations:  # a typo's extra zeros: refused, not planned or buffered
        why = (
            f"{eta} is more than the job's {spec.iterations} iterations; use at most {spec.iterations} (a bound of "
            f"{max(spec.iterations - 1, 0)} already lets every iteration be generated from the first weights)"
        )
        out.append(ConfigError(str(path), "pipeline.staleness", why))
    per_round = spec.batch.samples_per_iteration
    # (the controller ran it at `most` rounds ahead, said at INFO only)
    if eta is not None and (most := rounds_ahead(eta, per_round)) < eta:
        why = (
            f"{eta}: the controller creates rounds at most {MAX_SAMPLES_AHEAD:,} samples ahead of the trainer "
            f"(MAX_SAMPLES_AHEAD), {most} iterations of {per_round:,} (batch.prompts_per_iteration "
            f"{spec.batch.prompts_per_iteration} × samples_per_prompt {spec.batch.samples_per_prompt}); use at most "
            f"{most}, or fewer samples an iteration"
        )
        out.append(ConfigError(str(path), "pipeline.staleness", why))
    sites = [r.site for r in spec.placement.rollout]
    if len(set(sites)) != len(sites):
        out.append(ConfigError(str(path), "placement.rollout", "each rollout site may appear once"))
    cs = spec.placement.controller_site
    if cs is not None and cs not in inventory.sites:
        known = f"unknown site {cs!r}; known: {one_of(inventory.sites)}"
        out.append(ConfigError(str(path), "placement.controller_site", known))
    return out
