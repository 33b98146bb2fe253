"""`rlctl check` of a dataset task's task.template_strings and task.chat_template_kwargs, on the hf-demo builder's
model and rows (chat messages) with a Qwen3-style template (it reads enable_thinking): each is refused in one line
where no prompt of the job's files reads it, and a kwarg the template never reads is refused naming what it reads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.gpu_check import hf_demo_builder
from rlctl.config import load_job
from rlctl.ops.preflight import problems
from rlctl.rl.tokenizer import load_tokenizer, template_variables
from tests.conftest import ROOT, run_cli

from .test_preflight import only_line

# the hf-demo template, whose assistant header gains ' =' at enable_thinking false (as Qwen3's gains an empty think)
THINKING_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %} <|{{ m['role'] }}|> {{ m['content'] }} <|end|>{% endfor %}"
    "{% if add_generation_prompt %} <|assistant|>"
    "{% if enable_thinking is defined and enable_thinking is false %} ={% endif %}{% endif %}"
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The hf-demo model (no SFT) with THINKING_TEMPLATE, its 8 rows of chat messages (data.jsonl), and the same
    rows with their prompts as strings (strings.jsonl)."""
    out = tmp_path_factory.mktemp("hf-demo")
    hf_demo_builder().build(out, rows=8, sft_steps=0)
    (out / "model/chat_template.jinja").write_text(THINKING_TEMPLATE)  # (wins over tokenizer_config.json's)
    rows = [json.loads(line) for line in (out / "data.jsonl").read_text().splitlines()]
    strings = [{**r, "prompt": r["prompt"][0]["content"]} for r in rows]
    (out / "strings.jsonl").write_text("".join(json.dumps(r) + "\n" for r in strings))
    return out


def job_in(built: Path, tmp: Path, *, data: str = "data.jsonl", heldout: str | None = None, **task: Any) -> Path:
    """tmp/job.yaml: the shipped hf-demo job on this machine's local site, on `built`'s model and `data`, its task's
    fields `task` replaced; `heldout`: evaluation.path, 4 of its rows evaluated."""
    for name in ("model", "data.jsonl", "strings.jsonl"):
        if not (tmp / name).exists():
            (tmp / name).symlink_to(built / name, target_is_directory=name == "model")
    job = yaml.safe_load((ROOT / "jobs/hf-demo.yaml").read_text())
    job.update(inventory=[str(ROOT / "clusters/local.yaml")], model={"kind": "hf", "path": "model"}, tracking=[])
    reward = f"{ROOT / 'jobs/hf-demo/reward.py'}:compute_score"
    job["task"] = {**job["task"], "path": data, "reward": reward, **task}
    if heldout is not None:
        job["evaluation"] = {"heldout_prompts": 4, "path": heldout}
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def lines(job: Path) -> list[str]:
    return [f"{p.field}: {p.message}" for p in problems(load_job(job))]


def test_template_strings_where_every_prompt_is_chat_messages_is_refused_in_one_line(
    built: Path, tmp_path: Path
) -> None:
    """It renders string prompts alone (rlctl.rl.dataset_rows): set on a dataset of chat messages it changed nothing,
    and check passed it."""
    job = job_in(built, tmp_path, template_strings=True)
    assert only_line(run_cli("check", str(job))) == (
        f"rlctl: error: {job}: task.template_strings: true renders string prompts through the chat template, and "
        f"every prompt of {tmp_path / 'data.jsonl'} (8 rows) is chat messages, which it renders as they are; leave "
        "it out (false)"
    )
    # a held-out file of string prompts reads it (its rows through the template): nothing refused
    assert lines(job_in(built, tmp_path, template_strings=True, heldout="strings.jsonl")) == []
    assert lines(job_in(built, tmp_path, data="strings.jsonl", template_strings=True)) == []


def test_chat_template_kwargs_where_every_prompt_is_a_string_tokenized_as_it_is_are_refused(
    built: Path, tmp_path: Path
) -> None:
    """String prompts without template_strings never reach the template: its kwargs were read by nothing."""
    kwargs = {"enable_thinking": False}
    job = job_in(built, tmp_path, data="strings.jsonl", chat_template_kwargs=kwargs)
    assert lines(job) == [
        f"task.chat_template_kwargs: enable_thinking: variables of the chat template, and every prompt of "
        f"{tmp_path / 'strings.jsonl'} (8 rows) is a string, tokenized as it is (task.template_strings: false), not "
        "through the template; set template_strings: true to render each as one user message, or leave "
        "chat_template_kwargs out"
    ]
    # rendered: through template_strings, or a held-out file of chat messages
    assert (
        lines(job_in(built, tmp_path, data="strings.jsonl", chat_template_kwargs=kwargs, template_strings=True)) == []
    )
    assert lines(job_in(built, tmp_path, data="strings.jsonl", chat_template_kwargs=kwargs, heldout="data.jsonl")) == []


def test_a_chat_template_kwarg_the_template_never_reads_is_refused_naming_what_it_reads(
    built: Path, tmp_path: Path
) -> None:
    """A typo (enable_thinkng) rendered every prompt without it, unsaid (transformers and vLLM drop a kwarg the
    template does not read); the one it reads changes the prompts' tokens."""
    job = job_in(built, tmp_path, chat_template_kwargs={"enable_thinkng": False, "enable_thinking": False})
    assert lines(job) == [
        f"task.chat_template_kwargs: enable_thinkng: not a variable of the chat template of {tmp_path / 'model'}, "
        "which never reads it (transformers and vLLM drop it); it reads bos_token, enable_thinking (did you mean "
        "'enable_thinking'?)"
    ]
    tok = load_tokenizer(tmp_path / "model")
    messages = [{"role": "user", "content": "1 2 ="}]
    assert tok.encode_chat(messages, template_kwargs={"enable_thinking": False}) == [
        *tok.encode_chat(messages),
        tok.encode("=", add_special_tokens=False)[0],
    ]
    assert lines(job_in(built, tmp_path, chat_template_kwargs={"enable_thinking": False})) == []
    # the hf-demo's own template reads no variable of the job's
    shutil.copytree(built / "model", tmp_path / "plain", ignore=shutil.ignore_patterns("chat_template.jinja"))
    plain = yaml.safe_load(job.read_text())
    plain["model"]["path"] = "plain"
    plain["task"]["chat_template_kwargs"] = {"enable_thinking": False}
    job.write_text(yaml.safe_dump(plain))
    assert lines(job) == [
        f"task.chat_template_kwargs: enable_thinking: not a variable of the chat template of {tmp_path / 'plain'}, "
        "which never reads it (transformers and vLLM drop it); it reads bos_token"
    ]


@pytest.mark.parametrize(
    ("template", "reads"),
    [
        ("{%- if enable_thinking is defined and enable_thinking is false %}x{% endif %}", {"enable_thinking"}),
        ("{% set enable_thinking = enable_thinking | default(true) %}{{ enable_thinking }}", {"enable_thinking"}),
        ("{% set today = 'x' %}{{ today }}", set()),  # set before it is read: a value passed is never read
        ("{% macro m(a) %}{{ a }}{{ date_string }}{% endmacro %}{{ m(1) }}", {"date_string"}),
        (  # the environment's functions and the generation tag, as transformers renders them
            "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
            "{{ raise_exception('no') if x }}{{ strftime_now('%d') }}",
            {"messages", "x"},
        ),
    ],
)
def test_template_variables_are_those_the_template_reads_from_its_caller(template: str, reads: set[str]) -> None:
    assert template_variables(template) == reads
