"""Preflight of what the job feeds the runtime: the model's context (and a Mistral sliding window) against the longest
request the task sends, a tied model's lm_head against its embedding, the digits task's bounds and prompt numbering,
the weight manifest's chunks, and the held-out evaluation's file and rows.
"""

from __future__ import annotations

import filecmp
import logging
from pathlib import Path

from rlctl.agents.common import job_context
from rlctl.config.job import Job, refills
from rlctl.config.model import HfModel
from rlctl.config.pipeline import MAX_PROMPTS_PER_ITERATION
from rlctl.config.task import DatasetTask, DigitsTask
from rlctl.errors import ConfigError
from rlctl.launch.sitefs import is_remote
from rlctl.models.hf import CONFIG_FILE, PHI3, TinyGPTConfig, read_config
from rlctl.models.hfdir import tied_head_refusal
from rlctl.ops.preflight.base import Problem
from rlctl.planner.context import context_refusal, dataset_request, model_positions
from rlctl.rl.dataset import MANIFEST_FILE, prepared_rows
from rlctl.rl.dataset_scan import RowsChecked
from rlctl.rl.source import heldout_task
from rlctl.rl.tasks import MAX_DIGITS, RL_STRIDE, VOCAB_SIZE
from rlctl.rl.tasks import DigitsTask as Digits
from rlctl.textutil import job_relative, not_a_file
from rlctl.weights import manifest

log = logging.getLogger(__name__)


RUNNABLE_BUILTIN = "tiny-demo"  # the one built-in model with weights (rlctl.models.tinygpt.TinyGPT)


def weight_manifest_problems(job: Job) -> list[Problem]:
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


def tied_head_problems(job: Job) -> list[Problem]:
    """A tied model's checkpoint whose lm_head.weight is not its embedding, refused in the line the loader refuses it
    in at launch (`hfdir.tied_head_refusal`: those two tensors read, where every other check reads the headers)."""
    model = job.spec.model
    if not isinstance(model, HfModel) or (why := tied_head_refusal(model.path)) is None:
        return []
    return [Problem("model.path", why)]


def overlong_problems(job: Job) -> list[Problem]:
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


def dynamic_sampling_problems(job: Job) -> list[Problem]:
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


def job_model_config(job: Job) -> tuple[TinyGPTConfig, str] | None:
    """The config of the model the agents run and where it comes from; None for a model without weights."""
    spec = job.spec
    if spec.model.kind == "hf":
        return read_config(spec.model.path), f"{spec.model.path}/{CONFIG_FILE}"
    if spec.model.kind == "builtin" and spec.model.name == RUNNABLE_BUILTIN:
        return TinyGPTConfig(), f"built-in {RUNNABLE_BUILTIN!r}"
    return None  # no weights: refused in `problems`


def digits_vocab_problems(job: Job) -> list[Problem]:
    """The digits task writes its prompts and reads its answers in its own character ids (rlctl.rl.tasks: VOCAB_SIZE):
    a Hugging Face model whose vocabulary is smaller has no embedding row for the last of them, and the agents would
    index past it at run time. (One of 66 or more ids, a saved tiny-demo checkpoint, runs the task as the built-in.)"""
    if (
        not isinstance(job.spec.task, DigitsTask)
        or job.spec.model.kind != "hf"
        or (model := job_model_config(job)) is None
    ):
        return []
    config, where = model
    if config.vocab_size >= VOCAB_SIZE:
        return []
    return [
        Problem(
            "task.kind",
            f"'digits' writes its prompts in its own {VOCAB_SIZE} character ids, and the model's vocab_size is "
            f"{config.vocab_size} ({where}): ids {config.vocab_size}–{VOCAB_SIZE - 1} are past its embedding; use "
            "kind 'dataset' (prompts in the model's own tokenizer)",
        )
    ]


def context_problems(job: Job) -> list[Problem]:
    """The longest prompt plus the most output tokens a request may ask for must fit the model's context
    (`rlctl.planner.context`: the rule `rlctl plan` refuses a job by, said here in the same line); the digits task's
    bounds first, which its longest prompt assumes."""
    task = job.spec.task
    if isinstance(task, DigitsTask) and model_positions(job) is not None:
        too_many = [
            Problem(f"task.{name}", f"{value}: at most {MAX_DIGITS} (one letter per digit)")
            for name, value in (("num_digits_min", task.num_digits_min), ("num_digits_max", task.num_digits_max))
            if value > MAX_DIGITS
        ]
        if too_many:
            return too_many
    return [] if (refusal := context_refusal(job)) is None else [Problem(*refusal)]


def window_problems(job: Job) -> list[Problem]:
    """The job's context (`job_context`: what the engines and the trainer are built for) against a Mistral or Phi3
    `sliding_window` that binds (v0.1's 4096 of 32768 positions, Phi-3-mini-4k's 2047 of 4096): MistralModel (Phi3Model)
    attends to a position's last `window`
    tokens only, rlctl's models to all before it, which tells them apart on a longer sequence alone. The models
    refuse to be built for a longer context too (`hf.window_refusal`), inside the agents, after launch."""
    if (model := job_model_config(job)) is None or (window := model[0].binding_window) is None:
        return []
    (config, where), task = model, job.spec.task
    binds = (
        f"{where}: sliding_window {window} binds (below its max_position_embeddings {config.max_position_embeddings}: "
        f"{config.architecture.removesuffix('ForCausalLM')}Model attends to a position's last {window} tokens only, "
        "rlctl's models to all before it)"
    )
    unbound = "Phi-4" if config.architecture == PHI3 else "Mistral v0.3 and later"
    instead = f"or a model whose sliding_window is null or at least its max_position_embeddings ({unbound})"
    if isinstance(task, DigitsTask) and task.num_digits_min > MAX_DIGITS:
        return []  # refused by `context_problems`
    if (context := job_context(job.spec)) is None:  # kind 'lengths' (refused as such too)
        said = f"kind {task.kind!r} bounds no context to hold to it; use kind 'digits' or 'dataset' within {window}"
        return [Problem("task", f"{binds}, and {said} tokens, {instead}")]
    if context <= window:
        return []
    if isinstance(task, DatasetTask):
        said, valid = f"{dataset_request(task)} = {context} tokens", f"max_prompt_tokens + max_output_tokens ≤ {window}"
    else:  # digits: job_context's prompt is its longest, BOS, MAX_DIGITS digits and '='
        assert isinstance(task, DigitsTask), "kind 'lengths' has no context (job_context)"
        prompt = context - Digits(task).max_new_tokens
        valid = f"max_output_tokens ≤ {window - prompt}" if window > prompt else "a prompt task (kind 'dataset')"
        said = f"{prompt} prompt + {context - prompt} output = {context} tokens"
    return [Problem("task.max_output_tokens", f"{binds}, and the job's context is {said}; use {valid}, {instead}")]


def evaluation_problems(
    job: Job, *, warn: bool = True, prepared: Path | None = None
) -> tuple[list[Problem], RowsChecked | None]:
    """The held-out evaluation decodes digits prompts, or a dataset task's held-out file (read as the launch will
    read it: its rows as read, where they were), and reads the final checkpoint where launch runs
    (rlctl.ops.evaluation). `warn`: say the held-out file is the training file's (a resume that edited neither
    field does not). `prepared`: a resumed run's tokenized copy of the file (its job dir's data-heldout/, what the
    run reads), read in place of a file gone since the launch (`prepared_rows`)."""
    spec, out, task = job.spec, [], job.spec.task
    read: RowsChecked | None = None
    if isinstance(task, DatasetTask):
        path = spec.evaluation.path
        copy = prepared is not None and (prepared / MANIFEST_FILE).is_file()
        if path is None:
            out.append(Problem("evaluation.path", "a dataset task's held-out prompts come from a file: name it"))
        elif not (named := job.path.parent / path).is_file() and copy:
            assert prepared is not None
            try:
                read = prepared_rows(prepared, heldout_task(task, path))
            except ConfigError as e:  # (changed since it was prepared: the run's load refuses it alike)
                out.append(Problem("evaluation.path", str(e), e.hint))
            else:
                out += _heldout_count_problems(job, read)
        elif not named.is_file():
            out.append(Problem("evaluation.path", f"{not_a_file(named)} {str(named)!r}{job_relative(path)}"))
        else:
            if warn:
                _same_as_training(job, task, path)
            if isinstance(spec.model, HfModel) and Path(spec.model.path).is_dir():
                found, read = _heldout_rows(job, heldout_task(task, path), Path(spec.model.path))
                out += found
    elif spec.task.kind != "digits":
        out.append(
            Problem(
                "evaluation.heldout_prompts",
                f"held-out prompts exist for task kinds 'digits' and 'dataset', not {spec.task.kind!r}; use 0",
            )
        )
    elif spec.evaluation.path is not None:
        out.append(Problem("evaluation.path", "the digits task draws its own held-out prompts; leave path out"))
    elif spec.evaluation.heldout_prompts == "all":
        out.append(
            Problem(
                "evaluation.heldout_prompts", "'all' reads every row of a dataset task's held-out file; give a number"
            )
        )
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
    return out, read


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


def _heldout_rows(job: Job, held: DatasetTask, model_dir: Path) -> tuple[list[Problem], RowsChecked | None]:
    """Every row of the held-out file reads and tokenizes as the launch will, and there are at least as many usable
    rows as `heldout_prompts` asks for; the rows as read (None where they could not be)."""
    from rlctl.rl.dataset_rows import NoChatTemplate
    from rlctl.rl.dataset_scan import check_rows
    from rlctl.rl.tokenizer import load_tokenizer

    data = job.path.parent / held.path
    try:
        tokenizer = load_tokenizer(model_dir)
    except ConfigError as e:  # the model directory's, as check_task says it (one line, not one per file read)
        return [Problem("model.path", str(e), e.hint)], None
    try:
        read = check_rows(held, data_path=data, tokenizer=tokenizer, heldout=True)
    except NoChatTemplate as e:  # the model's to fix, or the prompts' form (as check_task says it)
        return [Problem("model.path", f"{e.file}: {e.detail}", e.hint)], None
    except ConfigError as e:
        said = str(e).removeprefix(f"{e.file}: ")
        return [Problem("evaluation.path", f"{data}: {said}", e.hint)], None  # the data's own: a skip helps only some
    return _heldout_count_problems(job, read), read


def _heldout_count_problems(job: Job, read: RowsChecked) -> list[Problem]:
    """At least as many usable held-out rows as `heldout_prompts` asks for, and 'all' no more than are evaluated."""
    asked, good, data = job.spec.evaluation.heldout_prompts, read.good, read.path
    if asked == "all" and good > MAX_PROMPTS_PER_ITERATION:
        return [
            Problem(
                "evaluation.heldout_prompts",
                f"'all' asked, but {data} has {good} usable rows, more than the {MAX_PROMPTS_PER_ITERATION} evaluated "
                f"at most; give a number ≤ {MAX_PROMPTS_PER_ITERATION}, or a smaller file",
            )
        ]
    if asked != "all" and good < asked:
        return [
            Problem("evaluation.heldout_prompts", f"{asked} asked, but {data} has {good} usable rows; use ≤ {good}")
        ]
    return []
