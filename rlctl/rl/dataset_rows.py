"""A dataset file's rows one at a time: jsonl or parquet read, each row parsed and tokenized into a prompt's tokens
and fields, or a BadRow naming it.

    train.jsonl / .parquet ──read_rows──▶ (label, row) ──parse_row──▶ tokens, {ground_truth, data_source, extra_info}
                                                                      or BadRow(where, field, what)

Bad rows (a missing field, a prompt over `max_prompt_tokens`, invalid JSON) are named `file:line N` (jsonl, 1-based)
or `file:row N` (parquet, 0-based as in pandas); what becomes of them is `task.bad_rows`' (rlctl.rl.dataset_scan).
"""

from __future__ import annotations

import codecs
import datetime
import decimal
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlctl.config.task import DatasetTask
from rlctl.errors import ConfigError
from rlctl.rl.reward import ground_truth_problem
from rlctl.rl.tokenizer import TextTokenizer

VERL_ANSWER_KEY = "reward_model.ground_truth"
# what a JSON file named .jsonl (`json.dump(rows, f)`, pandas' to_json without lines=True) is told
ONE_OBJECT_PER_LINE = "a .jsonl file holds one JSON object per line (pandas: to_json(orient='records', lines=True))"
MISSING = object()
NULL_ANSWER = "null (a row's ground truth is the reward's ground_truth argument)"


@dataclass(frozen=True)
class BadRow:
    where: str  # "data/train.jsonl:line 3"
    field: str | None
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.field}: {self.what}" if self.field else f"{self.where}: {self.what}"


class NoChatTemplate(ConfigError):
    """Prompts that need a chat template (chat messages, or `task.template_strings`), and the model's tokenizer has
    none: the model's to fix (or the prompts' form), not a bad row — every such row would fail alike."""


# ── reading the user's file ───────────────────────────────────────────────────────────────────────


def read_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(label, row) for each row: label `line N` (jsonl) or `row N` (parquet); a bad row is a BadRow."""
    if path.suffix.lower() == ".parquet":  # (train.PARQUET was read as JSON lines: a decode error at its first bytes)
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            n = 0
            for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
                # a map column (Spark's map<string,string>) as a dict, as verl's reward gets it, versus a list of
                # (key, value) pairs (pyarrow's own form)
                for row in batch.to_pylist(maps_as_pydicts="lossy"):
                    yield f"row {n}", row
                    n += 1
        except (OSError, pa.ArrowException) as e:
            raise ConfigError(str(path), None, f"cannot read parquet: {e}") from e
        return
    try:
        first = True
        for i, line in enumerate(_text_lines(path), start=1):
            if isinstance(line, BadRow):
                yield f"line {i}", line
                continue
            if not line.strip():
                continue
            first, at_first = False, first
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                what = f"invalid JSON: {e.msg} (column {e.colno})"
                if at_first and line.strip() in ("[", "{"):  # an indented JSON document
                    what += f"; {ONE_OBJECT_PER_LINE}"
                yield f"line {i}", BadRow(f"{path}:line {i}", None, what)
                continue
            yield f"line {i}", row
    except OSError as e:
        raise ConfigError(str(path), None, f"cannot read: {e}") from e


def _text_lines(path: Path) -> Iterator[str | BadRow]:
    """The lines of a text file as Python's text mode splits them (LF, CRLF, CR; a leading byte-order mark, which
    some editors write, dropped), each decoded on its own: a line that is not UTF-8 is a BadRow naming its byte and
    column, versus the whole file refused at the decoder's offset into its buffer ('position 2690'), under
    `bad_rows: skip` too."""
    with path.open("rb") as f:
        n = 0
        for chunk in f:
            if n == 0:
                chunk = chunk.removeprefix(codecs.BOM_UTF8)
            for raw in chunk.splitlines(keepends=True):
                n += 1
                try:
                    yield raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    column = len(raw[: e.start].decode("utf-8")) + 1
                    what = f"not UTF-8 at byte 0x{raw[e.start]:02x} (column {column})"
                    yield BadRow(f"{path}:line {n}", None, what)


def lookup(row: dict[str, Any], key: str) -> Any:
    """row[key], or the dotted path `a.b` through nested mappings; MISSING when absent (None when null)."""
    if key in row:
        value = row[key]
    else:
        value = row
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                return MISSING
            value = value[part]
    return value


def _json_safe(value: Any, key: str) -> Any:
    """`value` (the row's field `key`) as a prepared row holds it (JSON): a parquet date, time or timestamp as its ISO
    string, a decimal as a float (the number a reward computes with), each as the reward sees it from a row read
    back; anything else that is not JSON (bytes: no text a reward could tell from a string) a ValueError saying where:
    `meta.blob is of type bytes`. Such a value refused the whole file ('not JSON-serialisable'), with no way around."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        pass
    else:
        return value  # (the rows as they are, most of them: no walk)
    if isinstance(value, dict):  # (a parquet map's keys too: map<date32, …> or map<binary, …>)
        return {_json_key(k, key): _json_safe(v, f"{key}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, datetime.date | datetime.time):  # (datetime.datetime is a date)
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    raise ValueError(f"{key} is of type {type(value).__name__}")  # (no article before it: it would say "is a int64")


def _json_key(k: Any, key: str) -> Any:
    """A dict's key `k` (of the row's field `key`) as a JSON object's: a date or time its ISO string, as a value is;
    one JSON has no key for (bytes) a ValueError saying where, as a value of that type is."""
    if k is None or isinstance(k, str | int | float | bool):
        return k
    if isinstance(k, datetime.date | datetime.time):
        return k.isoformat()
    raise ValueError(f"{key} has a key of type {type(k).__name__}")


# what a NoChatTemplate says before the row that needs one (`rlctl check` says the task's and the held-out file's once)
NO_TEMPLATE = (
    "the tokenizer has no chat template (no chat_template.jinja, nor chat_template in tokenizer_config.json), and "
)


def _no_template(tokenizer: TextTokenizer, where: str, why: str, fix: str) -> NoChatTemplate:
    return NoChatTemplate(
        str(tokenizer.model_dir),
        None,
        f"{NO_TEMPLATE}{where} {why}",
        hint=f"use a model whose tokenizer has one, add a chat_template.jinja to its directory, or {fix}",
    )


def _prompt_tokens(prompt: Any, cfg: DatasetTask, tokenizer: TextTokenizer, where: str) -> list[int] | str:
    """Token ids of one prompt (the row at `where`), or what is wrong with it; NoChatTemplate when it needs the
    template the tokenizer lacks."""
    if isinstance(prompt, str):
        if not prompt.strip():  # (whitespace tokenized to BOS alone: nothing asked, and trained on)
            return f"empty prompt (whitespace only: {prompt!r:.20})" if prompt else "empty prompt"
        if cfg.template_strings:
            if not tokenizer.has_chat_template:
                why = "is a string prompt, which task.template_strings renders through one"
                raise _no_template(tokenizer, where, why, "set task.template_strings: false")
            return tokenizer.encode_chat(
                [{"role": "user", "content": prompt}], template_kwargs=cfg.chat_template_kwargs
            )
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and prompt:
        for i, m in enumerate(prompt):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
                return f"message [{i}] is not a {{role, content}} mapping"
            content = m["content"]
            parts = isinstance(content, list) and all(isinstance(c, dict) and "type" in c for c in content)
            if not (isinstance(content, str) or parts):  # what chat templates render: text, or typed parts
                return f"message [{i}] content: expected a string or a list of {{type, …}} parts, got {content!r:.40}"
        # (each rendered to the template's headers alone, a prompt that asks nothing; an empty system message, a
        # placeholder some datasets carry, is no harm where a user's says something)
        if all(_blank(m["content"]) for m in prompt):
            return "empty prompt (every message's content is empty)"
        said = [j for j, m in enumerate(prompt) if m["role"] == "user" and _blank(m["content"])]
        if said:
            return f"message [{said[0]}]: empty prompt (a user message with no content)"
        if not tokenizer.has_chat_template:
            raise _no_template(tokenizer, where, "holds chat messages", "give the prompts as strings")
        return tokenizer.encode_chat(prompt, template_kwargs=cfg.chat_template_kwargs)
    return f"expected a string or a non-empty list of chat messages [{{role, content}}], got {prompt!r:.60}"


def _blank(content: str | list[dict[str, Any]]) -> bool:
    """A message's content says nothing: a blank string, or text parts alone and each blank (an image part says
    something)."""
    if isinstance(content, str):
        return not content.strip()
    return all(c.get("type") == "text" and not str(c.get("text") or "").strip() for c in content)


def parse_row(
    where: str, row: Any, cfg: DatasetTask, tokenizer: TextTokenizer, default_source: str
) -> tuple[list[int], dict[str, Any]] | BadRow:
    if not isinstance(row, dict):
        also = f"; {ONE_OBJECT_PER_LINE}" if isinstance(row, list) else ""
        return BadRow(where, None, f"expected a JSON object, got {type(row).__name__}{also}")
    answer: Any = None
    if cfg.answer_key is not None:
        key, answer = cfg.answer_key, lookup(row, cfg.answer_key)
        if (answer is MISSING or answer is None) and key == "ground_truth":
            verl = lookup(row, VERL_ANSWER_KEY)  # verl's layout works with the default key
            key, answer = (key, answer) if verl is MISSING else (VERL_ANSWER_KEY, verl)
        if answer is MISSING:
            return BadRow(where, key, "missing")
        if answer is None:  # there, but no answer: 'missing' and its hint (name the field) sent the user looking
            return BadRow(where, key, NULL_ANSWER)
        try:
            answer = _json_safe(answer, key)
        except ValueError as e:
            return BadRow(where, key, f"not JSON-serialisable: {e}")
        if (problem := ground_truth_problem(cfg.reward, answer)) is not None:  # (a list: every output scored 0)
            return BadRow(where, key, problem)
    source = lookup(row, cfg.data_source_key)
    if source is MISSING or source is None:
        source = default_source
    elif not isinstance(source, str):
        return BadRow(where, cfg.data_source_key, f"expected a string, got {type(source).__name__}")
    extra = None if cfg.extra_info_key is None else lookup(row, cfg.extra_info_key)
    try:
        extra = None if extra is MISSING else _json_safe(extra, str(cfg.extra_info_key))
    except ValueError as e:
        return BadRow(where, cfg.extra_info_key, f"not JSON-serialisable: {e} (task.extra_info_key: null reads none)")
    prompt = lookup(row, cfg.prompt_key)
    if prompt is MISSING or prompt is None:
        return BadRow(where, cfg.prompt_key, "missing")
    try:
        tokens = _prompt_tokens(prompt, cfg, tokenizer, where)
    except ValueError as e:  # the chat template refused the messages (raise_exception) or failed on them
        return BadRow(where, cfg.prompt_key, str(e))
    if isinstance(tokens, str):
        return BadRow(where, cfg.prompt_key, tokens)
    if not tokens:  # whitespace the tokenizer drops: nothing to condition the first token on
        return BadRow(where, cfg.prompt_key, "no tokens (the tokenizer makes nothing of it)")
    if len(tokens) > cfg.max_prompt_tokens:
        return BadRow(where, cfg.prompt_key, f"{len(tokens)} tokens, over max_prompt_tokens {cfg.max_prompt_tokens}")
    return tokens, {"ground_truth": answer, "data_source": source, "extra_info": extra}
