"""Can `launch` start this job? Every job field is either read by the runtime or refused here, with one
line naming the field and what to do: `rlctl check JOB` and `rlctl launch JOB` both run it, so a check
that passes means launch can start the job on the sites it names.

What is refused here (and why) is what the runtime cannot honour on this installation: an engine or
trainer backend whose package is missing or that the agents do not run, a model or task that only
describes a workload for planning, a field only `rlctl plan` reads, a prompt plus its output longer than
the model's context, a tracker whose package is missing; and, in the plan launch computes from the job
(rlctl.ops.counts.plan_counts: counts, the trainer's tp × pp × dp, each rollout unit's tp), a split the
trainer or the engine would ignore, a site too small for the agents placed on it, and trainer ranks that
write checkpoint shards on several hosts of an SSH site that share no work root.

The driver and the CLI's error are here (`problems`, `preflight`, `refuse`, `problem_lines`); the checks, one module
per concept beside it: `base` (`Problem`), `sites` (the sites' hosts and network: listen addresses, ports),
`data` (the model, the task's prompts and data, the held-out evaluation), `fields` (fields the job's other choices
leave unread, or only `rlctl plan` reads), `backends` (devices, the megatron backend, the trainer's model split and
sharding), `placement` (the plan launch runs, laid out on the sites: SLURM cores, the controller's room),
`memory` (the trainer's and the rollout units' memory), `template` (a dataset task's template_strings and
chat_template_kwargs against its prompts and the model's chat template), `slurmoptions` (a SLURM site's constraint
and reservation against its cluster: `check --reach`).
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from rlctl.config.job import Job
from rlctl.config.model import HfModel
from rlctl.config.task import DatasetTask
from rlctl.errors import ConfigError, JobProblems
from rlctl.launch.backends import kind_of
from rlctl.launch.jobdir import why_not_made
from rlctl.ops.preflight.backends import (
    device_problems,
    lora_problems,
    megatron_problems,
    moe_compile_problems,
    trainer_split_problems,
    vllm_model_problems,
)
from rlctl.ops.preflight.base import Problem
from rlctl.ops.preflight.data import (
    RUNNABLE_BUILTIN,
    context_problems,
    digits_vocab_problems,
    dynamic_sampling_problems,
    evaluation_problems,
    overlong_problems,
    tied_head_problems,
    weight_manifest_problems,
    window_problems,
)
from rlctl.ops.preflight.fields import planning_only_problems, unread_field_problems, warn_past_the_end
from rlctl.ops.preflight.memory import rollout_memory_problems
from rlctl.ops.preflight.placement import placement_problems
from rlctl.ops.preflight.sites import (
    job_sites,
    key_file_problems,
    known_hosts_problems,
    link_problems,
    listen_address_problems,
    metrics_port_problems,
    one_host_address_problems,
    site_problems,
    unbindable_problems,
)
from rlctl.ops.preflight.template import template_problems
from rlctl.planner.plan import idle_gpus
from rlctl.rl.dataset import check_task
from rlctl.rl.dataset_scan import RowsChecked
from rlctl.rl.reward import builtin_scorer_hints
from rlctl.rl.source import DATA_DIR, HELDOUT_DIR
from rlctl.tracking import check_tracking

log = logging.getLogger(__name__)


def _missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None


# the top-level fields the data check reads (the task's file and settings, the held-out file, the model's tokenizer)
DATA_FIELDS = frozenset({"task", "evaluation", "model"})


def problems(
    job: Job,
    *,
    plan: dict[str, Any] | None = None,
    edited: Collection[str] | None = None,
    prepared: Path | None = None,
) -> list[Problem]:
    """Every reason the runtime cannot run `job` as written, first the most fundamental. `plan` is the one
    launch runs (rlctl.ops.counts.plan_counts); without it, it is computed here the same way. `edited`: a resume's
    top-level fields edited since its launch (`rlctl.ops.resumecheck`, which keeps their problems): the data files
    are read (tokenized) only where a field the data check reads was (`DATA_FIELDS`), and no warning is said of a
    field not edited, versus the data read again and each warning said again on every resume after any edit; None:
    every check and warning (`rlctl check`, a launch). `prepared`: a resumed run's job dir, whose tokenized copies of
    the data files (data/, data-heldout/) the run reads: a file gone since the launch is read there."""
    spec = job.spec
    reads_data = edited is None or not DATA_FIELDS.isdisjoint(edited)
    warns_data = edited is None or "task" in edited or "evaluation" in edited  # (the scorer's, the same file's)
    out: list[Problem] = []
    if spec.model.kind == "arch":
        out.append(
            Problem(
                "model",
                f"kind 'arch' ({spec.model.name}) describes a model for planning only; launch needs weights: "
                "kind 'builtin' or kind 'hf' with a local Hugging Face directory",
            )
        )
    if spec.model.kind == "builtin" and spec.model.name != RUNNABLE_BUILTIN:
        out.append(
            Problem(
                "model",
                f"built-in {spec.model.name!r} is an architecture for planning (no weights here); launch runs "
                f"{RUNNABLE_BUILTIN!r} or kind 'hf' with a local Hugging Face directory",
            )
        )
    if spec.task.kind == "lengths":
        out.append(
            Problem(
                "task",
                "kind 'lengths' describes a workload for planning only; launch needs prompts: "
                "kind 'digits' or kind 'dataset'",
            )
        )
    if spec.job_dir is not None and (why := why_not_made(Path(spec.job_dir))) is not None:
        out.append(Problem("job_dir", why, "choose another job_dir"))
    out += site_problems(job.inventory, job_sites(job))
    out += link_problems(job)
    out += key_file_problems(job)
    out += known_hosts_problems(job)
    out += device_problems(job)
    out += listen_address_problems(job)
    out += one_host_address_problems(job)
    out += unbindable_problems(job)
    out += metrics_port_problems(job)
    tp = spec.rollout.tensor_parallel or 1
    for i, r in enumerate(spec.placement.rollout):  # a unit holds tp GPUs: a count's remainder would sit idle
        if r.gpus != "auto" and spec.rollout.tensor_parallel is not None and int(r.gpus) % tp:
            out.append(Problem(f"placement.rollout[{i}].gpus", idle_gpus(int(r.gpus), tp)))
    if spec.rollout.engine == "embedded" and tp > 1:
        out.append(
            Problem(
                "rollout.tensor_parallel",
                f"{tp}: the embedded engine runs one device per unit; use 1, or engine 'vllm' for tensor parallelism",
            )
        )
    if spec.rollout.engine == "vllm":
        out += vllm_model_problems(job)
    if spec.rollout.engine == "embedded":
        out += moe_compile_problems(job)
    if spec.rollout.engine == "vllm" and spec.rollout.compile:
        out.append(
            Problem(
                "rollout.compile",
                "true is the embedded engine's; vLLM compiles its own model (its compilation_config): leave it false",
            )
        )
    if spec.rollout.engine == "vllm" and spec.rollout.group_barrier != "auto":
        out.append(
            Problem(
                "rollout.group_barrier",
                f"{spec.rollout.group_barrier!r} is the embedded engine's; vLLM pages its KV cache and has no "
                "barrier: leave it auto",
            )
        )
    if spec.rollout.engine == "embedded" and spec.rollout.on_new_weights == "recompute":
        out.append(
            Problem(
                "rollout.on_new_weights",
                "'recompute': the embedded engine keeps its running rows' K/V when a version arrives; use 'keep' "
                "(or auto), or engine 'vllm'",
            )
        )
    if spec.trainer.backend == "megatron":
        out += megatron_problems(job)
    out += lora_problems(job)
    out += trainer_split_problems(job)
    if spec.transport.streams != 1:
        out.append(
            Problem(
                "transport.streams",
                f"{spec.transport.streams}: a job's connections are one TCP stream each (the transport's striping, "
                "TcpConfig.num_streams, is not wired to jobs: nothing measured it on a long link); valid: 1",
            )
        )
    if spec.transport.kind == "inproc":
        out.append(
            Problem(
                "transport.kind",
                "'inproc' links agents inside one process (the in-process tests); launch starts each agent as a "
                "process of its own: valid: tcp, ucx",
            )
        )
    if spec.transport.encrypt and spec.transport.kind != "tcp":
        out.append(
            Problem("transport.encrypt", f"true with kind {spec.transport.kind!r}: only tcp encrypts; valid: kind tcp")
        )
    if spec.transport.kind == "ucx" and _missing("ucxx"):
        out.append(
            Problem("transport.kind", "'ucx' needs the ucxx package, which is not installed", "pip install rlctl[ucx]")
        )
    heldout_rows: RowsChecked | None = None  # (the held-out file's and the task's rows as read: `builtin_scorer_hints`)
    if not spec.evaluation.heldout_prompts:
        out += [
            Problem(f"evaluation.{name}", "read only when evaluation.heldout_prompts > 0; set it, or leave it out")
            for name, value in (("path", spec.evaluation.path), ("every_iterations", spec.evaluation.every_iterations))
            if value
        ]
    elif reads_data:  # (else a resume's edit of another field: the held-out file not read again)
        held = prepared / HELDOUT_DIR if prepared is not None else None
        found, heldout_rows = evaluation_problems(job, warn=warns_data, prepared=held)
        out += found
    task, task_rows = spec.task, None
    if isinstance(task, DatasetTask):
        if spec.model.kind != "hf":
            out.append(
                Problem("task", "kind 'dataset' needs model kind 'hf': its tokenizer turns the prompts into tokens")
            )
        if spec.rollout.dispatch == "oracle":
            out.append(
                Problem("rollout.dispatch", "'oracle' needs the true output lengths, which a dataset does not have")
            )
        model_dir = Path(spec.model.path) if isinstance(spec.model, HfModel) else None
        if reads_data:
            try:
                copy = prepared / DATA_DIR if prepared is not None else None
                task_rows = check_task(task, job_file=job.path, model_dir=model_dir, prepared=copy)
            except ConfigError as e:
                out.append(_problem("task", e))
            read = [task_rows, heldout_rows] if spec.evaluation.heldout_prompts else [task_rows]
            out += template_problems(job, task, read)
    if spec.warmup.sft_steps and (isinstance(task, DatasetTask) or spec.model.kind == "hf"):
        out.append(
            Problem(
                "warmup.sft_steps",
                f"{spec.warmup.sft_steps}: the SFT warm-up is the built-in model's on the digits task; "
                "use 0, or leave it out (default 0 here)",
            )
        )
    out += unread_field_problems(job)
    warn_past_the_end(job, edited=edited)
    out += weight_manifest_problems(job)
    out += tied_head_problems(job)
    out += digits_vocab_problems(job)
    out += context_problems(job) or window_problems(job)  # (a context past the model's own is past its window)
    out += rollout_memory_problems(job)
    out += overlong_problems(job)
    out += dynamic_sampling_problems(job)
    out += planning_only_problems(job)
    # the trackers' packages and W&B login are the controller's host's: asked here where it runs here, else on its
    # site by `check --reach` (siteprobe.controller_tracking_problems)
    if kind_of(job.inventory.sites[spec.placement.controller_site or spec.placement.trainer.site]).on_this_machine:
        out += _raised("tracking", lambda: check_tracking(spec.tracking, source=str(job.path)))
    out += placement_problems(job, plan)
    out = _one_no_template(out)
    if isinstance(task, DatasetTask) and warns_data:  # said after every check (one line where both files are one's)
        for hint in builtin_scorer_hints(task.reward, train=task_rows, heldout=heldout_rows):
            log.warning("%s", hint)
    return list(dict.fromkeys(out))  # one line per problem: the plan's refusal of a field may be one said above


def _one_no_template(found: list[Problem]) -> list[Problem]:
    """The model.path lines of a tokenizer without a chat template, for the task's data and the held-out file alike,
    as one line naming both files (where the first was), versus one line each saying the same of the model."""
    from rlctl.rl.dataset_rows import NO_TEMPLATE

    same = [p for p in found if p.field == "model.path" and NO_TEMPLATE in p.message]
    if len(same) < 2:
        return found
    head = same[0].message.partition(NO_TEMPLATE)[0] + NO_TEMPLATE
    rests = [p.message.partition(NO_TEMPLATE)[2] for p in same]
    why = " holds chat messages"
    if all(r.endswith(why) for r in rests):
        said = " and ".join(r.removesuffix(why) for r in rests) + " hold chat messages"
    else:
        said = "; ".join(rests)
    hint = "; ".join(dict.fromkeys(p.hint for p in same if p.hint)) or None
    one = Problem("model.path", head + said, hint)
    return [one if p is same[0] else p for p in found if p is same[0] or p not in same]


def _raised(field: str, check: Callable[[], None]) -> list[Problem]:
    """A check that raises ConfigError, as a Problem (`_problem`)."""
    try:
        check()
    except ConfigError as e:
        return [_problem(field, e)]
    return []


def _problem(field: str, e: ConfigError) -> Problem:
    """A check's ConfigError as a Problem of its field, else `field` (its message already names the file and field)."""
    return Problem(e.field or field, str(e).removeprefix(f"{e.file}: ").removeprefix(f"{e.field}: "), e.hint)


def preflight(job: Job, *, plan: dict[str, Any] | None = None) -> None:
    """Raise a ConfigError (exit 2) naming the problem, or JobProblems with every problem one line each (the user
    fixes them at once: the first and the names of the others' fields sent them round once per problem)."""
    refuse(str(job.path), problems(job, plan=plan))


def refuse(file: str, found: list[Problem]) -> None:
    """`found` (the problems of `file`, or of the files they name) as the CLI's error: a ConfigError for one,
    JobProblems for several, one line each; nothing when there are none."""
    if len(found) == 1:
        p = found[0]
        raise ConfigError(p.file or file, p.field, p.message, hint=p.hint)
    if found:
        each = [ConfigError(p.file or file, p.field, p.message, hint=p.hint) for p in found]
        raise JobProblems(file, [_line(file, p) for p in found], each=each)


def problem_lines(job: Job, found: list[Problem]) -> list[str]:
    """Each problem as the one line the CLI prints: the file, the field, what is wrong (and a hint)."""
    return [_line(str(job.path), p) for p in found]


def _line(file: str, p: Problem) -> str:
    return f"{p.file or file}: {p.field}: {p.message}" + (f" (hint: {p.hint})" if p.hint else "")
