"""Preflight of what a dataset task asks of the chat template: `task.template_strings` and `task.chat_template_kwargs`
against the prompts `rlctl check` read (task.path's and evaluation.path's, `RowsChecked`) and against the variables
the model's template reads (`tokenizer.template_variables`). Each is read only where a prompt goes through the
template (rlctl.rl.dataset_rows `_prompt_tokens`):

    string prompt ── template_strings: true ──▶ chat template, as one user message ┐
                  └─ false ──────────────────▶ tokenized as it is                  ├ chat_template_kwargs: the
    chat messages ────────────────────────────▶ chat template (template_strings    │ template's variables (one it
                                                 unread)                            ┘ never reads: dropped)

The prompts are token ids once prepared, on either engine (vLLM's requests carry prompt_token_ids), so this is
every place the two fields are read; vLLM's own resolve_chat_template_kwargs keeps a kwarg to the same
find_undeclared_variables and drops the rest unsaid, as rendering here did.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlctl.config.job import Job
from rlctl.config.model import HfModel
from rlctl.config.task import TEMPLATE_ARGUMENTS, DatasetTask
from rlctl.errors import ConfigError
from rlctl.ops.preflight.base import Problem
from rlctl.rl.dataset_scan import RowsChecked
from rlctl.rl.tokenizer import chat_template_of, template_variables
from rlctl.textutil import did_you_mean


def template_problems(job: Job, task: DatasetTask, read: Sequence[RowsChecked | None]) -> list[Problem]:
    """`read`: each file the job's prompts come from as check read it (None: it could not be read, and its own line
    says why; what its prompts are is not known then, and the two fields are not judged by them)."""
    kwargs, out = task.chat_template_kwargs, []
    files = {f.path.resolve(): f for f in read if f is not None}  # (the held-out file may be the task's)
    if files and None not in read and not any(f.prepared for f in files.values()):  # (a copy keeps no form)
        strings = sum(f.string_prompts for f in files.values())
        chats = sum(f.chat_prompts for f in files.values())
        named = " and ".join(str(f.path) for f in files.values())
        if task.template_strings and not strings:
            out.append(
                Problem(
                    "task.template_strings",
                    f"true renders string prompts through the chat template, and every prompt of {named} "
                    f"({_rows(chats)}) is chat messages, which it renders as they are; leave it out (false)",
                )
            )
        if kwargs and not task.template_strings and not chats:  # (nothing renders: the template is not asked)
            why = (
                f"{', '.join(kwargs)}: variables of the chat template, and every prompt of {named} "
                f"({_rows(strings)}) is a string, tokenized as it is (task.template_strings: false), not through the "
                "template; set template_strings: true to render each as one user message, or leave "
                "chat_template_kwargs out"
            )
            return [*out, Problem("task.chat_template_kwargs", why)]
    model = job.spec.model
    if kwargs and isinstance(model, HfModel) and Path(model.path).is_dir():
        out += _unread_kwargs(list(kwargs), Path(model.path))
    return out


def _unread_kwargs(names: list[str], model_dir: Path) -> list[Problem]:
    """The chat_template_kwargs the model's chat template never reads: a typo (enable_thinkng) rendered every prompt
    without it, unsaid, as transformers and vLLM drop it."""
    try:
        template = chat_template_of(model_dir)
    except ConfigError:  # (tokenizer_config.json unreadable: model.path's own line says so)
        return []
    if template is None:  # (a prompt that needs one is refused as such; strings alone: the fields are unread above)
        return []
    try:
        reads = template_variables(template)
    except ValueError:  # (it does not parse: every row it renders is refused saying so)
        return []
    settable = sorted(reads - TEMPLATE_ARGUMENTS)
    said = f"it reads {', '.join(settable)}" if settable else "it reads none but rlctl's own (messages, …)"
    return [
        Problem(
            "task.chat_template_kwargs",
            f"{name}: not a variable of the chat template of {model_dir}, which never reads it (transformers and vLLM "
            f"drop it); {said}{did_you_mean(name, settable)}",
        )
        for name in names
        if name not in reads
    ]


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"
