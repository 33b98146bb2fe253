"""The counts a launch runs, from the job file and (for `gpus: auto`) the planner: trainer ranks and their
tp × pp × dp (FSDP2 or not), rollout units per site and their tp. Shared by `rlctl launch` (`ops.run`) and
`rlctl check` (`ops.preflight`), which stays free of the runtime's modules (torch among them) this way.

    resolve_job (command-line overrides) ─▶ plan_counts ─▶ plan.json's counts (`ops.jobprep.prepare`)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.config.job import Job, JobFile
from rlctl.config.pipeline import Pipeline
from rlctl.errors import ConfigError, PlanError
from rlctl.planner.split import trainer_sharding

if TYPE_CHECKING:
    from rlctl.profiler.profile import ProfileFile

log = logging.getLogger(__name__)


def resolve_job(job: Job, *, iterations: int | None = None, mode: str | None = None) -> JobFile:
    """The job with command-line overrides applied (a new mode takes that mode's default η)."""
    spec = job.spec
    update: dict[str, Any] = {}
    if iterations is not None:
        update["iterations"] = iterations
    if mode is not None and mode != spec.pipeline.mode:
        update["pipeline"] = Pipeline(mode=mode)
    return spec.model_copy(update=update) if update else spec


def job_profile(job: Job, path: Path | None = None) -> tuple[ProfileFile | None, str]:
    """The profile that prices `job`: `path` (`rlctl plan --profile`), else the job's `planning.profile`, else None
    (the planner's analytical profile of the inventory's GPU specs); with the file's name. ConfigError naming the
    profile file when it is not a profile, or has no generation curve for a site the job generates on."""
    from rlctl.profiler.profile import load_profile, refuse_empty_generation, refuse_empty_training

    if path is None and job.spec.planning.profile is not None:
        path = Path(job.spec.planning.profile)
    if path is None:
        return None, "profile"
    profile = load_profile(path)
    refuse_empty_generation(profile, [r.site for r in job.spec.placement.rollout], path=str(path))
    refuse_empty_training(profile, job.spec.placement.trainer.site, path=str(path))
    return profile, str(path)


def plan_counts(job: Job, spec: JobFile, *, noted: bool = False) -> dict[str, Any]:
    """Trainer ranks and rollout units per site: the job's explicit counts, or the planner's for `auto`. `noted`:
    the planner's advisory note was said already (by the `launch --detach` that started this launcher, for the same
    job file): logged at DEBUG, versus its warning line twice on the terminal that launched it."""
    placement = spec.placement
    auto = placement.trainer.gpus == "auto" or any(r.gpus == "auto" for r in placement.rollout)
    planned: dict[str, Any] | None = None
    note = ""
    profile, profile_file = job_profile(job)  # the one the job names: a bad one is refused, not an advisory note
    try:
        planned = launch_plan(job, profile, profile_file=profile_file)
    except Exception as e:  # the planner is advisory when the job gives explicit counts
        if isinstance(e, ConfigError) and profile is not None and e.file == profile_file:
            raise  # the profile the job names cannot price it (another model, GPU, algorithm): refused, not a note
        if auto and isinstance(e, ConfigError):  # a job field the planner cannot plan with: exit 2, in check's words
            raise
        if auto:
            raise PlanError(
                f"{job.path}: 'gpus: auto' needs the planner, which failed: {e}",
                hint="give explicit GPU counts in placement",
            ) from e
        note = f"planner unavailable for this job: {type(e).__name__}: {e}"
        # a field of the job file the planner refuses, `rlctl check` (hence launch's preflight) refuses in its own
        # line: said once, there, not in a warning line before it; so the inventory's `links` that join no path
        # from the trainer's datacenter to a rollout site's (`preflight.sites.link_problems`, in plan's line)
        said = noted or (isinstance(e, ConfigError) and (e.file == str(job.path) or e.field == "links"))
        log.log(logging.DEBUG if said else logging.WARNING, "%s", note)
    alloc = planned["allocation"] if planned is not None else []
    planned_tp = {a["site"]: int(a["config"]["tp"]) for a in alloc if a["role"] == "rollout" and a.get("config")}
    t_config = next((a.get("config") for a in alloc if a["role"] == "trainer"), None)

    def tp_of(site: str) -> int:
        """GPUs per rollout unit: the job's tensor_parallel; else, when the planner chose the counts, its TP."""
        return spec.rollout.tensor_parallel or (planned_tp.get(site, 1) if auto else 1)

    if auto:
        trainer = int(next(a["gpus_used"] for a in alloc if a["role"] == "trainer"))
        rollout = [
            {"site": a["site"], "units": int(a["instances"]), "tp": tp_of(a["site"])}
            for a in alloc
            if a["role"] == "rollout"
        ]
        source = "planner"
    else:
        trainer = int(placement.trainer.gpus)
        rollout = [
            {"site": r.site, "units": max(1, int(r.gpus) // tp_of(r.site)), "tp": tp_of(r.site)}
            for r in placement.rollout
        ]
        source = "job"
    parallel = {"tp": 1, "pp": 1, "dp": trainer}
    if (split := spec.trainer.model_split) is not None:  # the job's trainer.tensor/pipeline_parallel
        tp, pp = split
        if trainer % (tp * pp):
            raise ConfigError(
                str(job.path),
                spec.trainer.split_field,
                f"tp {tp} × pp {pp} does not divide placement.trainer.gpus {trainer} (GPUs = tp × pp × dp)",
            )
        parallel = {"tp": tp, "pp": pp, "dp": trainer // (tp * pp)}
    elif t_config and int(t_config["tp"]) * int(t_config["pp"]) * int(t_config["dp"]) == trainer:
        parallel = {k: int(t_config[k]) for k in ("tp", "pp", "dp")}
    parallel |= trainer_sharding(job, tp=parallel["tp"], pp=parallel["pp"], dp=parallel["dp"])
    out: dict[str, Any] = {
        "source": source,
        "trainer": {"site": placement.trainer.site, "ranks": trainer, "parallel": parallel},
        "rollout": rollout,
        "controller_site": placement.controller_site or placement.trainer.site,
    }
    if profile is not None:
        out["profile"] = profile_file  # what priced the plan (the analytical profile of the GPU specs when absent)
    if planned is not None:
        out["planner"] = planner_section(planned)
    if note:
        out["note"] = note
    return out


def launch_plan(job: Job, profile: ProfileFile | None, *, profile_file: str) -> dict[str, Any]:
    """The planner's plan of `job` as a launch (and a resume at another trainer split, `ops.trainersplit`) makes it:
    `rlctl plan`'s options, its stage curves left out."""
    from rlctl.planner.inputs import PlanOptions
    from rlctl.planner.plan import make_plan

    # `rlctl plan`'s options: other simulated batches choose another allocation than the one it printed
    return make_plan(job, profile, options=PlanOptions(curves_in_output=False), profile_file=profile_file)


def planner_section(planned: dict[str, Any]) -> dict[str, Any]:
    """What plan.json keeps of the planner's plan (its `planner` section): the allocation rows (the controller reads
    a rollout site's decode cost there, `agents.placement.Placement.decode_cost`), the predicted times and the
    rebalance advice."""
    return {k: planned.get(k) for k in ("allocation", "predicted", "rebalance") if k in planned}
