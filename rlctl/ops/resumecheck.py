"""A resume's check of job.json where it was edited since the launch (`edit_problems`): the job as edited validated
the way a job file is, and `rlctl check`'s problems of it (`preflight.problems`, those that reach no site), each one
in a field edited since said in one line naming job.json and the field; `launch --resume` refuses them before it
starts or writes anything, an automatic resume (`rlctl.ops.autoresume.Runs`) ends the run with them.

    job.json ──edited_fields──▶ none ─────────────────────────────────────▶ nothing (read as launched: `RECORDED`)
                               └▶ some ──JobFile, as a job file's (no RECORDED)──▶ an error in an edited field ─▶ it
                                         └▶ valid ──cross_field_errors (load_job's: the sites as launched)──▶ an
                                                      edited field's (or one its bound reads: iterations) ─▶ them
                                                    └▶ none ──problems(job as edited)──▶ an edited field's ─▶ them

Why: job.json is read with a job's record's leniency (`JobDir.job_of`, `inventory.RECORDED`), so that a job an older
rlctl launched resumes past checks added since; an edit went through it unchecked (`algorithm: {off_policy:
decoupled, is_cap: 0.8}` ran as `tis` at 0.8, `algorithm.clip_eps: 1.5`, `transport.streams: 4`, `rollout.
on_new_weights: recompute` with the embedded engine all ran where a job file is refused). A field not edited since
is not judged: the job ran with it, and a check this rlctl added since is no reason to stop its resume. A trainer
rank's memory is `resumememory.judge_memory`'s (it tells an edit that raised the need from the pricing that changed).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from rlctl.config.base import first_error
from rlctl.config.job import Job, JobFile, cross_field_errors
from rlctl.config.task import DatasetTask
from rlctl.errors import ConfigError
from rlctl.ops.jobchanges import launched_inventory
from rlctl.ops.preflight import problems
from rlctl.ops.preflight.base import Problem
from rlctl.ops.preflight.memory import trainer_memory_problems

if TYPE_CHECKING:
    from rlctl.launch.jobdir import JobDir


def edit_problems(
    jd: JobDir, plan: dict[str, Any], *, edited: list[str], iterations: int | None = None
) -> list[Problem]:
    """What `rlctl check` refuses of job.json's job as edited, in the top-level fields `edited` since the launch
    (`jobchanges.edited_fields`), each a Problem of job.json naming `job.<field>`; `plan`: the one the run places
    its agents by; `iterations`: the count `--iterations` gives, in place of job.json's. Nothing where none was
    edited. LaunchError (ConfigError) for a job.json or sites.json that does not read."""
    if not edited:
        return []
    data = jd.read_json(jd.job_json)
    if not isinstance(data, dict) or not isinstance(data.get("job"), dict):
        return []  # (said by what reads the job next: `JobDir.job_of`)
    mapping = data["job"] if iterations is None else {**data["job"], "iterations": iterations}
    try:
        JobFile.model_validate(mapping)  # as a job file is validated: no `RECORDED` leniency
    except ValidationError as e:
        if ours := [err for err in e.errors(include_url=False) if _top_of_error(err) in edited]:
            field, msg = first_error(e, only=lambda err: err in ours)
            return [_edited(jd, Problem(field, msg))]
    # the fields edited read as a job file's (valid so, `RECORDED` reads them alike), those not edited as launched
    # (a value this rlctl's check refuses since, `JobDir.job_of`): the edited ones' problems are still judged
    spec = jd.job_of({**data, "job": mapping})
    inventory = launched_inventory(jd, plan)
    # what `load_job` refuses of a job file once its sites are read, against the sites as launched: an edit of
    # placement to a site the job has not (else a KeyError traceback below), a staleness past the iterations
    bound = [Problem(e.field or "", e.detail, e.hint) for e in cross_field_errors(jd.job_json, spec, inventory)]
    if broken := [p for p in bound if _judged(p.field, edited)]:
        return [_edited(jd, p) for p in broken]
    job = Job(_as_launched(jd, spec, data), inventory, jd.job_json)
    try:
        # (no data read, no warning, of a field not edited; a data file gone since: the job dir's copy read)
        found = problems(job, plan=plan, edited=edited, prepared=jd.path)
    except ConfigError as e:  # (a check that raises: its field's, as `preflight._problem` takes one)
        found = [Problem(e.field or "", e.detail, e.hint)]
    judged = set(trainer_memory_problems(job, plan)) if "trainer" in plan else set()  # (`judge_memory`'s)
    # (a problem of another file, a site's inventory file: of the sites as launched, not of the edit)
    return [_edited(jd, p) for p in found if p.file is None and p not in judged and _top(p.field) in edited]


def _edited(jd: JobDir, p: Problem) -> Problem:
    """`p` as a problem of job.json's job (`job.<field>`), said as edited since the launch."""
    undo = "or undo the edit (job.json's `job` section)"
    hint = f"{p.hint}; {undo}" if p.hint else f"edit job.{p.field} in {jd.job_json.name} to a valid value, {undo}"
    return Problem(
        f"job.{p.field}", f"{p.message} (edited since the launch; `rlctl check` refuses it in a job file)", hint
    )


# the top-level fields besides its own a bound of `cross_field_errors` reads: an edit of either breaks it
BOUND_BY = {"batch.samples_per_prompt": ("algorithm",), "pipeline.staleness": ("iterations", "batch")}


def _judged(field: str, edited: list[str]) -> bool:
    """`field`'s problem is one of the edit's: its top-level field, or another its bound reads, edited."""
    return any(top in edited for top in (_top(field), *BOUND_BY.get(field, ())))


def _top(field: str) -> str:
    """The top-level field of a dotted one (`placement.rollout[0].gpus` → `placement`)."""
    return re.split(r"[.\[]", field, maxsplit=1)[0]


def _top_of_error(err: ErrorDetails) -> str:
    """The top-level field a validation error is in; a key at the top level (unknown, a boolean for a number)
    is named by its context."""
    if err["loc"]:
        return str(err["loc"][0])
    return str((err.get("ctx") or {}).get("key", ""))


def _as_launched(jd: JobDir, spec: JobFile, data: dict[str, Any]) -> JobFile:
    """`spec` with its files where the run reads them: an HF model the job dir's copy (`job_dir_model`), a dataset
    task's reward the job dir's copy (`inputs.resolve_inputs` names it relative to the job dir), its data and held-out
    files relative to the job file the launch read (job.json's `source_file`), as `rlctl check` read them (one
    gone since: the job dir's tokenized copy, what the run reads, `problems`' `prepared`)."""
    from rlctl.ops.resumememory import job_dir_model

    spec = job_dir_model(jd, spec)
    source = data.get("source_file")
    launched = Path(source["path"]).parent if isinstance(source, dict) and isinstance(source.get("path"), str) else None
    base = launched if launched is not None else jd.path
    task, evaluation = spec.task, spec.evaluation
    if isinstance(task, DatasetTask):
        target, sep, name = task.reward.rpartition(":")
        reward = f"{jd.path / target}:{name}" if sep and target.endswith(".py") else task.reward
        task = task.model_copy(update={"path": str(base / task.path), "reward": reward})
    if evaluation.path is not None:
        evaluation = evaluation.model_copy(update={"path": str(base / evaluation.path)})
    return spec.model_copy(update={"task": task, "evaluation": evaluation})
