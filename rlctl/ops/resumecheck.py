"""A resume's check of job.json where it was edited since the launch (`edit_problems`): the job as edited validated
the way a job file is, and `rlctl check`'s problems of it (`preflight.problems`, those that reach no site), each one
in a field edited since (a leaf that differs from job.json's whole job as launched, `job_launched`; a top-level section
for a job.json an rlctl before that record wrote) and not one the job as launched had too, said in one line naming
job.json and the field; `launch --resume` refuses them before it starts or writes anything, an automatic resume
(`rlctl.ops.autoresume.Runs`) ends the run with them.

    job.json ──edited_fields──▶ none ─────────────────────────────────────▶ nothing (read as launched: `RECORDED`)
                               └▶ some ──JobFile, as a job file's (no RECORDED)──▶ an error in an edited leaf, not
                                         │                                        the launch's too ─▶ it
                                         └▶ valid ──cross_field_errors (load_job's: the sites as launched)──▶ an
                                                      edited leaf's (or one its bound reads, `BOUND_BY`), not the
                                                      launch's too ─▶ them
                                                    └▶ none ──problems(job as edited)──▶ an edited leaf's ─▶ them

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
from rlctl.errors import ConfigError, RlctlError
from rlctl.launch.jobdir import JOB_LAUNCHED, MEMORY_FIELDS, launched_job
from rlctl.ops.jobchanges import changed_fields, launched_inventory
from rlctl.ops.preflight import problems
from rlctl.ops.preflight.base import Problem
from rlctl.ops.preflight.memory import trainer_memory_problems

if TYPE_CHECKING:
    from rlctl.launch.jobdir import JobDir


def edit_problems(
    jd: JobDir, plan: dict[str, Any], *, edited: list[str], iterations: int | None = None
) -> list[Problem]:
    """What `rlctl check` refuses of job.json's job as edited, in the fields edited since the launch (the leaves that
    differ from job.json's whole job as launched, `jobdir.launched_job`, under the top-level fields `edited`,
    `jobchanges.edited_fields`; those top-level fields themselves for a job.json an rlctl before that record wrote)
    and not refused so of the job as launched too, each a Problem of job.json naming `job.<field>`; `plan`: the one
    the run places its agents by; `iterations`: the count `--iterations` gives, in place of job.json's. Nothing where
    none was edited. LaunchError (ConfigError) for a job.json or sites.json that does not read."""
    if not edited:
        return []
    data = jd.read_json(jd.job_json)
    if not isinstance(data, dict) or not isinstance(data.get("job"), dict):
        return []  # (said by what reads the job next: `JobDir.job_of`)
    mapping = data["job"] if iterations is None else {**data["job"], "iterations": iterations}
    record = launched_job(data)
    # a problem is judged where it is in (or read with) a top-level field edited since the launch, and is not one the
    # job as launched had too (`had`, `had_bound`); the leaves edited word it (a check of one field may say its problem
    # in another of the section: trainer.backend edited to torch, said of trainer.tensor_parallel; versus judged by
    # the leaves alone, which let that edit run, and any edit made in job_launched too)
    leaves = [] if record is None else [f for f in changed_fields(record, data["job"]) if _top(f) in edited]
    # the job as launched, whose own problems are not the edit's
    before: dict[str, Any] | None = record
    if record is None:
        before = _older_launched(data, edited)
    elif any(all(_top(f) != top for f in leaves) for top in edited):
        # a section edited (its digest not the launch's) with no leaf other than the record's: the record edited too
        # (the same value written in both), not the launch's: nothing tells what the launch had (versus every
        # problem of the edit taken for the launch's own, and run)
        before, leaves = None, []

    def said(p: Problem, *, bound: bool = False) -> Problem:
        if leaf := _edit_of(p.field, leaves, bound=bound):
            return _said(jd, p, leaf)
        return _said_by_section(jd, p, _edit_of(p.field, edited, bound=bound))

    try:
        JobFile.model_validate(mapping)  # as a job file is validated: no `RECORDED` leniency
    except ValidationError as e:
        had = {(err["loc"], err["msg"]) for err in _validation_errors(before)}
        ours = [
            err
            for err in e.errors(include_url=False)
            if (err["loc"], err["msg"]) not in had and _edit_of(_error_field(err, mapping), edited)
        ]
        if ours:
            field, msg = first_error(e, only=lambda err: err in ours)
            return [said(Problem(field, msg))]
    # the fields edited read as a job file's (valid so, `RECORDED` reads them alike), those not edited as launched
    # (a value this rlctl's check refuses since, `JobDir.job_of`): the edited ones' problems are still judged
    spec = jd.job_of({**data, "job": mapping})
    inventory = launched_inventory(jd, plan)
    # what `load_job` refuses of a job file once its sites are read, against the sites as launched: an edit of
    # placement to a site the job has not (else a KeyError traceback below), a staleness past the iterations; one the
    # job as launched had too is not the edit's (a staleness past the rounds ahead where only a micro-batch was cut)
    bound = [Problem(e.field or "", e.detail, e.hint) for e in cross_field_errors(jd.job_json, spec, inventory)]
    had_bound = set(_bound_problems(jd, data, before, inventory))
    if broken := [p for p in bound if p not in had_bound and _edit_of(p.field, edited, bound=True)]:
        return [said(p, bound=True) for p in broken]
    job = Job(_as_launched(jd, spec, data), inventory, jd.job_json)
    try:
        # (no data read, no warning, of a field not edited; a data file gone since: the job dir's copy read)
        found = problems(job, plan=plan, edited=edited, prepared=jd.path)
    except ConfigError as e:  # (a check that raises: its field's, as `preflight._problem` takes one)
        found = [Problem(e.field or "", e.detail, e.hint)]
    judged = set(trainer_memory_problems(job, plan)) if "trainer" in plan else set()  # (`judge_memory`'s)
    # (a problem of another file, a site's inventory file: of the sites as launched, not of the edit)
    return [said(p) for p in found if p.file is None and p not in judged and _edit_of(p.field, edited)]


def _said(jd: JobDir, p: Problem, leaf: str) -> Problem:
    """`p` as a problem of job.json's job (`job.<field>`), said as edited since the launch (its field, one under it or
    one it is under the `leaf` edited), or read with `leaf`, edited since."""
    mine = _within(p.field, leaf) or _within(leaf, p.field)
    return _edited(jd, p, "edited since the launch" if mine else f"read with `{leaf}`, edited since the launch")


def _said_by_section(jd: JobDir, p: Problem, by: str | None) -> Problem:
    """`p` said as in, or read with, `by`, a top-level section edited since the launch, where no leaf edited tells more
    (job.json keeps no whole job as launched to tell its leaves edited by, or the problem is said in a field of the
    section other than the one edited): versus said edited itself, which it may not be."""
    where = "in" if by == _top(p.field) else "read with"
    return _edited(jd, p, f"{where} `{by}`, a section edited since the launch")


def _edited(jd: JobDir, p: Problem, how: str) -> Problem:
    """`p` as a problem of job.json's job (`job.<field>`), said `how` it is the edit's."""
    undo = "or undo the edit (job.json's `job` section)"
    hint = f"{p.hint}; {undo}" if p.hint else f"edit job.{p.field} in {jd.job_json.name} to a valid value, {undo}"
    return Problem(f"job.{p.field}", f"{p.message} ({how}; `rlctl check` refuses it in a job file)", hint)


# the fields besides its own a bound of `cross_field_errors` reads: an edit of one may break it (the rounds ahead
# of a staleness read the prompts and samples of an iteration, its count the iterations)
BOUND_BY = {
    "batch.samples_per_prompt": ("algorithm.kind",),
    "pipeline.staleness": ("iterations", "batch.prompts_per_iteration", "batch.samples_per_prompt"),
}


def _edit_of(field: str, leaves: list[str], *, bound: bool = False) -> str | None:
    """The edited field (of `leaves`) `field`'s problem is in, holds, or, `bound`, one its bound reads
    (`BOUND_BY`); None where none is."""
    reads = (field, *BOUND_BY.get(field, ())) if bound else (field,)
    return next((leaf for leaf in leaves for f in reads if _within(f, leaf) or _within(leaf, f)), None)


def _within(field: str, outer: str) -> bool:
    """`field` is `outer` or a field under it (`algorithm.clip_eps` in `algorithm`, `placement.rollout[0]` in
    `placement.rollout`)."""
    return field == outer or (field.startswith(outer) and field[len(outer)] in ".[")


def _older_launched(data: dict[str, Any], edited: list[str]) -> dict[str, Any] | None:
    """The job as launched from a job.json of an rlctl that kept `MEMORY_FIELDS` alone in `job_launched`: the job with
    those as launched, where no other top-level field was edited; None where nothing tells it."""
    kept = data.get(JOB_LAUNCHED)
    if not isinstance(kept, dict) or not set(edited) <= kept.keys():
        return None
    return {**data["job"], **{k: v for k, v in kept.items() if k in MEMORY_FIELDS}}


def _validation_errors(mapping: dict[str, Any] | None) -> list[ErrorDetails]:
    """What a job file of `mapping` is refused for (none for None)."""
    try:
        JobFile.model_validate(mapping) if mapping is not None else None
    except ValidationError as e:
        return e.errors(include_url=False)
    return []


def _bound_problems(jd: JobDir, data: dict[str, Any], launched: dict[str, Any] | None, inventory: Any) -> list[Problem]:
    """`cross_field_errors`' problems of the job as launched (none where it is not known or does not read)."""
    if launched is None:
        return []
    try:
        spec = jd.job_of({**data, "job": launched})
    except RlctlError:
        return []
    return [Problem(e.field or "", e.detail, e.hint) for e in cross_field_errors(jd.job_json, spec, inventory)]


def _error_field(err: ErrorDetails, mapping: dict[str, Any]) -> str:
    """The dotted field a validation error is in (`algorithm.clip_eps`, `placement.rollout[1]`): its loc without a
    union's tags (a step the mapping has not: `algorithm.grpo.clip_eps`), a key refused at it (unknown, a boolean
    for a number) named by its context."""
    steps: list[str | int] = []
    at: Any = mapping
    for step in err["loc"]:
        listed = isinstance(at, list) and isinstance(step, int) and step < len(at)
        if not (listed or (isinstance(at, dict) and step in at)):
            continue  # (a union's tag)
        at = at[step]
        steps.append(step)
    if key := (err.get("ctx") or {}).get("key"):
        steps.append(str(key))
    return "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in steps).lstrip(".")


def _top(field: str) -> str:
    """The top-level field of a dotted one (`placement.rollout[0].gpus` → `placement`)."""
    return re.split(r"[.\[]", field, maxsplit=1)[0]


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
