"""User datasets (task kind `dataset`): rows → token ids once at launch, read back identically on every site.

    train.jsonl / .parquet ──prepare_dataset (launch, once)──▶ <out_dir>/
      {"prompt": str | [{role, content}],                         prompts.safetensors  tokens int32, offsets int64
       "ground_truth" | "reward_model": {"ground_truth"},         rows.jsonl           ground_truth, data_source,
       "data_source", "extra_info"}                                                    extra_info, source row
                                                                  manifest.json        counts, order, checksum
    every site: load_dataset(out_dir) → PromptDataset (checksum verified)

Bad rows (a missing field, a prompt over `max_prompt_tokens`, invalid JSON) are named `file:line N`
(jsonl, 1-based) or `file:row N` (parquet, 0-based as in pandas), logged and counted; `bad_rows:
refuse` turns them into one ConfigError, `skip` drops them. The data stream is a pure function of the
position: position k is row order(k // N)[k % N], where order(epoch) is the permutation seeded by
(shuffle_seed, epoch); iteration i's n prompts are positions i·n … i·n + n − 1 (prompt ids `p<k>`), so
a resumed job needs no loader state.
"""

from __future__ import annotations

import codecs
import datetime
import decimal
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlctl.config.task import BUILTIN_REWARD_NAMES, DatasetTask
from rlctl.errors import ConfigError
from rlctl.launch.jobdir import refuse_theirs
from rlctl.rl.reward import RewardResult, builtin_scorer_hint, ground_truth_problem
from rlctl.rl.reward_files import copy_reward
from rlctl.rl.reward_pool import LoadTimedOut, RewardPool, check_loads
from rlctl.rl.tokenizer import HFTokenizer, TextTokenizer, decode_output
from rlctl.textutil import is_job_relative, job_relative, not_a_file, one_of

log = logging.getLogger(__name__)

TOKENS_FILE = "prompts.safetensors"
ROWS_FILE = "rows.jsonl"
MANIFEST_FILE = "manifest.json"
VERL_ANSWER_KEY = "reward_model.ground_truth"
SHOWN_BAD_ROWS = 3  # in the refusal's one line
# the prompts drawn in place of dropped groups (dynamic sampling): a region of positions of their own, past any
# iteration's (a job of 2⁵⁰ prompts), REFILL_STRIDE per iteration
REFILL_OFFSET = 2**50
REFILL_STRIDE = 2**20
ORDERS_KEPT = 8  # epochs' row orders a dataset keeps (8 × 8 bytes a row)
LOGGED_BAD_ROWS = 20
# what a JSON file named .jsonl (`json.dump(rows, f)`, pandas' to_json without lines=True) is told
ONE_OBJECT_PER_LINE = "a .jsonl file holds one JSON object per line (pandas: to_json(orient='records', lines=True))"
_MISSING = object()
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


@dataclass(frozen=True)
class DataPrompt:
    prompt_id: str  # p<position in the data stream>
    tokens: list[int]
    ground_truth: Any
    data_source: str
    extra_info: Any
    row: int  # index among the prepared rows
    source_row: str  # "line 3" / "row 2" in the user's file


# ── reading the user's file ───────────────────────────────────────────────────────────────────────


def _read_rows(path: Path) -> Iterator[tuple[str, Any]]:
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


def _lookup(row: dict[str, Any], key: str) -> Any:
    """row[key], or the dotted path `a.b` through nested mappings; _MISSING when absent (None when null)."""
    if key in row:
        value = row[key]
    else:
        value = row
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                return _MISSING
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


def _parse_row(
    where: str, row: Any, cfg: DatasetTask, tokenizer: TextTokenizer, default_source: str
) -> tuple[list[int], dict[str, Any]] | BadRow:
    if not isinstance(row, dict):
        also = f"; {ONE_OBJECT_PER_LINE}" if isinstance(row, list) else ""
        return BadRow(where, None, f"expected a JSON object, got {type(row).__name__}{also}")
    answer: Any = None
    if cfg.answer_key is not None:
        key, answer = cfg.answer_key, _lookup(row, cfg.answer_key)
        if (answer is _MISSING or answer is None) and key == "ground_truth":
            verl = _lookup(row, VERL_ANSWER_KEY)  # verl's layout works with the default key
            key, answer = (key, answer) if verl is _MISSING else (VERL_ANSWER_KEY, verl)
        if answer is _MISSING:
            return BadRow(where, key, "missing")
        if answer is None:  # there, but no answer: 'missing' and its hint (name the field) sent the user looking
            return BadRow(where, key, NULL_ANSWER)
        try:
            answer = _json_safe(answer, key)
        except ValueError as e:
            return BadRow(where, key, f"not JSON-serialisable: {e}")
        if (problem := ground_truth_problem(cfg.reward, answer)) is not None:  # (a list: every output scored 0)
            return BadRow(where, key, problem)
    source = _lookup(row, cfg.data_source_key)
    if source is _MISSING or source is None:
        source = default_source
    elif not isinstance(source, str):
        return BadRow(where, cfg.data_source_key, f"expected a string, got {type(source).__name__}")
    extra = None if cfg.extra_info_key is None else _lookup(row, cfg.extra_info_key)
    try:
        extra = None if extra is _MISSING else _json_safe(extra, str(cfg.extra_info_key))
    except ValueError as e:
        return BadRow(where, cfg.extra_info_key, f"not JSON-serialisable: {e} (task.extra_info_key: null reads none)")
    prompt = _lookup(row, cfg.prompt_key)
    if prompt is _MISSING or prompt is None:
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


# ── preparing (once, at launch) and loading (every site) ──────────────────────────────────────────

_TOKENIZING_FIELDS = {
    "prompt_key",
    "answer_key",
    "data_source_key",
    "extra_info_key",
    "template_strings",
    "max_prompt_tokens",
    "bad_rows",
}


def _sha256(*files: Path) -> str:
    h = hashlib.sha256()
    for f in files:
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# the rows `check_rows` read and tokenized while `keeping_rows`, by file, with their `_identity`, until
# `prepare_dataset` of that file takes them (or drops them: the file changed since)
_Rows = tuple[list[list[int]], list[dict[str, Any]], list[BadRow]]
_kept: dict[str, tuple[dict[str, Any], _Rows]] = {}
_keeping: ContextVar[bool] = ContextVar("keeping_rows", default=False)


@contextmanager
def keeping_rows() -> Iterator[None]:
    """Inside, `check_rows` keeps the rows it reads and tokenizes (a launch's preflight), and `prepare_dataset` of the
    same file (its SHA-256 then), tokenizer and settings in this process writes them, versus every row read and
    tokenized a second time (a launch's check, then its prepare)."""
    token = _keeping.set(True)
    try:
        yield
    finally:
        _keeping.reset(token)


def _identity(cfg: DatasetTask, data_path: Path, tokenizer: TextTokenizer) -> dict[str, Any]:
    """What a prepared dataset is made of: the file (its SHA-256), the tokenizer, the settings that change it."""
    settings = cfg.model_dump(include=_TOKENIZING_FIELDS)
    if cfg.chat_template_kwargs:  # (only where set: a dataset prepared before the field was is kept as it was)
        settings["chat_template_kwargs"] = cfg.chat_template_kwargs
    return {
        "source": str(data_path.resolve()),  # (relative, a launch from another directory rebuilt it)
        "source_sha256": _sha256(data_path),
        "tokenizer": tokenizer.fingerprint(),
        "settings": settings,
    }


def prepare_dataset(
    cfg: DatasetTask,
    *,
    data_path: Path,
    tokenizer: TextTokenizer,
    out_dir: Path,
    check: Callable[[], None] | None = None,
    heldout: bool = False,
) -> PromptDataset:
    """Tokenize `data_path` into `out_dir` (kept when the file, tokenizer and settings are unchanged). `check`,
    called at each row, ends it by raising (a launch's `rlctl stop`), nothing written: the files are written once
    every row is read, the manifest last. `heldout`: the file is evaluation.path (`_scan`)."""
    from safetensors.numpy import save

    if not data_path.is_file():
        field = "evaluation.path" if heldout else "task.path"
        read = " is relative to the job file" if is_job_relative(cfg.path) else ""  # absolute or `~/…`: as written
        raise ConfigError(str(data_path), None, f"{not_a_file(data_path)} ({field}{read})")
    refuse_not_ours(data_path, out_dir)
    identity = _identity(cfg, data_path, tokenizer)
    kept = _kept.pop(str(data_path), None)
    manifest_path = out_dir / MANIFEST_FILE
    if manifest_path.exists():
        old = json.loads(manifest_path.read_text(encoding="utf-8"))
        if all(old.get(k) == v for k, v in identity.items()):
            return load_dataset(out_dir, cfg)
    if kept is not None and kept[0] == identity:  # read and tokenized by this launch's check, the file unchanged
        tokens, rows, bad = kept[1]
        _report_bad_rows(cfg, data_path, bad, len(rows) + len(bad), [], each=True)  # (refused by the check if so)
    else:
        tokens, rows, bad = _rows(cfg, data_path, tokenizer, check=check, heldout=heldout)
    out_dir.mkdir(parents=True, exist_ok=True)
    offsets = np.zeros(len(tokens) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(t) for t in tokens])
    flat = np.fromiter((t for seq in tokens for t in seq), dtype=np.int32, count=int(offsets[-1]))
    _write_atomic(out_dir / TOKENS_FILE, save({"tokens": flat, "offsets": offsets}))
    _write_atomic(out_dir / ROWS_FILE, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode())
    manifest = {
        **identity,
        "num_rows": len(rows),
        "num_bad_rows": len(bad),
        "bad_rows": [str(b) for b in bad[:LOGGED_BAD_ROWS]],
        "checksum": _sha256(out_dir / TOKENS_FILE, out_dir / ROWS_FILE),
    }
    _write_atomic(manifest_path, json.dumps(manifest, indent=1).encode())
    log.info("dataset %s: %d prompts prepared in %s (%d bad rows skipped)", data_path, len(rows), out_dir, len(bad))
    return load_dataset(out_dir, cfg)


def refuse_not_ours(data_path: Path, out_dir: Path) -> None:
    """ConfigError, one line, when `out_dir` holds anything `prepare_dataset` does not write there (a launch into the
    job file's own directory, whose data/ is the user's, holding the data file itself, `refuse_theirs`): nothing of
    the user's is written over or staged to every site as the job's."""
    then = "a launch writes its tokenized prompts here"
    if out_dir.is_dir() and data_path.resolve().is_relative_to(out_dir.resolve()):
        raise ConfigError(
            str(out_dir),
            None,
            f"the data file {data_path} lies in it, which rlctl did not write; {then}",
            hint="launch into another --job-dir (or keep the data file out of that directory)",
        )
    ours = {n + t for n in (TOKENS_FILE, ROWS_FILE, MANIFEST_FILE) for t in ("", ".tmp")}
    refuse_theirs(out_dir, ours=ours, did="write", then=then, hint="launch into another --job-dir")


def _rows(
    cfg: DatasetTask,
    data_path: Path,
    tokenizer: TextTokenizer,
    *,
    check: Callable[[], None] | None = None,
    each: bool = True,
    heldout: bool = False,
) -> tuple[list[list[int]], list[dict[str, Any]], list[BadRow]]:
    """Every row of `data_path` read and tokenized (`_scan`): the good ones' tokens and rows, and the bad ones.
    `check` is called at each good row; `each`: each bad row logged (else one line for all)."""
    tokens: list[list[int]] = []
    rows: list[dict[str, Any]] = []

    def keep(label: str, parsed: tuple[list[int], dict[str, Any]]) -> None:
        if check is not None:
            check()
        tokens.append(parsed[0])
        rows.append({"source_row": label, **parsed[1]})

    _, bad = _scan(cfg, data_path, tokenizer, keep, each=each, heldout=heldout)
    return tokens, rows, bad


@dataclass
class _Unsupported:
    """The good rows of verl's shapes that rlctl reads but does not train as verl would, counted as the rows are read
    and said in one warning line each (they passed unsaid): a reward model's rows, images, and chat messages given as
    a JSON string."""

    reward_model: int = 0  # reward_model.style "model": verl scores them with a reward model, rlctl runs none
    images: int = 0  # an `images` (or `videos`) field: the prompt is tokenized as text alone
    json_messages: int = 0  # a string prompt holding JSON chat messages: tokenized as that text

    def see(self, row: dict[str, Any], cfg: DatasetTask) -> None:
        self.reward_model += _lookup(row, "reward_model.style") == "model"
        self.images += any(row.get(k) for k in ("images", "videos"))
        prompt = _lookup(row, cfg.prompt_key)
        if isinstance(prompt, str) and prompt.lstrip().startswith("[{"):  # (the rest not parsed: no cost)
            try:
                value = json.loads(prompt)
            except json.JSONDecodeError:
                return
            self.json_messages += isinstance(value, list) and all(isinstance(m, dict) and "role" in m for m in value)

    def warn(self, data_path: Path, rows: int, cfg: DatasetTask) -> None:
        if self.reward_model:
            log.warning(
                "dataset %s: %d of %d rows have reward_model.style 'model' (verl scores them with a reward model); "
                "rlctl runs none: task.reward %r scores them",
                data_path,
                self.reward_model,
                rows,
                cfg.reward,
            )
        if self.images:
            log.warning(
                "dataset %s: %d of %d rows have images (or videos); rlctl trains on text: their prompts are "
                "tokenized without them",
                data_path,
                self.images,
                rows,
            )
        if self.json_messages:
            log.warning(
                "dataset %s: %d of %d prompts (task.prompt_key %r) are strings holding JSON chat messages, tokenized "
                "as that text; store them as lists of messages (json.loads the column) for the chat template",
                data_path,
                self.json_messages,
                rows,
                cfg.prompt_key,
            )


def _scan(
    cfg: DatasetTask,
    data_path: Path,
    tokenizer: TextTokenizer,
    keep: Callable[[str, tuple[list[int], dict[str, Any]]], None] | None = None,
    *,
    each: bool | None = None,
    heldout: bool = False,
) -> tuple[int, list[BadRow]]:
    """Read and tokenize every row of `data_path`, one at a time (`keep` gets each good one); the number of good
    rows and the bad rows, after `task.bad_rows` had its say (refuse: ConfigError), and a ConfigError when no row
    is usable. A held-out file (`heldout`) whose rows lack a data_source/extra_info key the job sets is not refused:
    the training file's rows show the key is no typo, and a held-out set drawn from elsewhere may lack it (its rows
    take the defaults, as a training row without it does)."""
    good = 0
    bad: list[BadRow] = []
    fields: list[str] = []  # the first row's: what a key that no row has could have been
    unseen = _optional_keys_set(cfg)  # the optional fields' keys the job names, until a row has one
    unsupported = _Unsupported()
    for label, raw in _read_rows(data_path):
        if not fields and isinstance(raw, dict):
            fields = [str(k) for k in raw]
        if unseen and isinstance(raw, dict):
            unseen = {s: k for s, k in unseen.items() if _lookup(raw, k) is _MISSING}
        parsed = (
            raw if isinstance(raw, BadRow) else _parse_row(f"{data_path}:{label}", raw, cfg, tokenizer, data_path.stem)
        )
        if isinstance(parsed, BadRow):
            bad.append(parsed)
            continue
        good += 1
        unsupported.see(raw, cfg)
        if keep is not None:
            keep(label, parsed)
    each = keep is not None if each is None else each
    _report_bad_rows(cfg, data_path, bad, good + len(bad), fields, each=each, heldout=heldout)
    unsupported.warn(data_path, good, cfg)
    if good and unseen and fields and not heldout:  # (no row read as an object: its own refusal says why)
        setting, key = next(iter(unseen.items()))
        raise ConfigError(
            str(data_path),
            None,
            f"no row has {key!r} (task.{setting}); the first row's fields: {one_of(fields)}",
            hint=f"name the field that holds it, or leave task.{setting} out",
        )
    if not good:  # (bad rows of one kind, or any with `refuse`, were refused above, saying why)
        first = f"; the first: {str(bad[0]).removeprefix(f'{data_path}:')}" if bad else ""
        what = f"no usable rows ({len(bad)} read, {len(bad)} bad{first})" if bad else "no rows: the file holds none"
        raise ConfigError(str(data_path), None, what)
    return good, bad


def _optional_keys_set(cfg: DatasetTask) -> dict[str, str]:
    """The optional fields' keys the job changed from their defaults: a row without data_source takes the file's name
    and one without extra_info None, but a key that no row has is a typo (`data_source_key: sorce`), which gave every
    row the file's name (a reward dispatching on data_source then failed each call, unsaid by check)."""
    return {
        setting: key
        for setting in ("data_source_key", "extra_info_key")
        if (key := getattr(cfg, setting)) not in (None, DatasetTask.model_fields[setting].default)
    }


def check_rows(cfg: DatasetTask, *, data_path: Path, tokenizer: TextTokenizer, heldout: bool = False) -> int:
    """What `rlctl check` does with the rows: every one read and tokenized as the launch will (streaming, nothing
    kept or written, unless `keeping_rows`), refused as the launch would; the number of usable rows (what the launch
    will prepare). `heldout`: the file is evaluation.path (what a skip of its bad rows leaves is evaluated)."""
    sources: set[str] = set()  # the rows' data_source: a dataset a built-in reward scores is said (warned of)

    def source(_: str, row: tuple[list[int], dict[str, Any]]) -> None:
        sources.add(row[1]["data_source"])

    if not _keeping.get() or not data_path.is_file():
        good, _ = _scan(cfg, data_path, tokenizer, source, each=False, heldout=heldout)
    else:
        identity = _identity(cfg, data_path, tokenizer)  # (the file's digest before its rows are read)
        kept = _rows(cfg, data_path, tokenizer, each=False, heldout=heldout)
        _kept[str(data_path)] = (identity, kept)
        good, sources = len(kept[1]), {row["data_source"] for row in kept[1]}
    # (the held-out file's too: the held-out evaluation calls the same reward, its figures 0 where the rows say so)
    if (hint := builtin_scorer_hint(cfg.reward, sources, heldout=heldout)) is not None:
        log.warning("%s", hint)
    return good


def _report_bad_rows(
    cfg: DatasetTask,
    data_path: Path,
    bad: list[BadRow],
    total: int,
    fields: list[str],
    *,
    each: bool = True,
    heldout: bool = False,
) -> None:
    """Refuse the bad rows (`task.bad_rows: refuse`, or every row bad alike), else log them: `each` one (the launch's
    prepare) or, for a check that reads them before it (`check_rows`), one line for all (a launch logged each
    skipped row twice, its check's and its prepare's)."""
    if not bad:
        return
    if len(bad) == total and len({(b.field, b.what) for b in bad}) == 1:  # one mistake, every row: said once
        first = bad[0]
        keys = {cfg.prompt_key: "prompt_key", cfg.answer_key: "answer_key"}
        missing = first.what == "missing" and first.field in keys
        has = f"; the first row's fields: {one_of(fields)}" if missing and fields else ""
        rows = f"all {total} rows" if total > 1 else "its one row"
        hint = f"name the field that holds it: task.{keys[first.field]}" if missing and first.field else None
        if first.what == NULL_ANSWER:  # (a built-in reward compares with it: answer_key null is refused for it)
            hint = (
                f"give the rows their ground truth (reward {cfg.reward!r} compares each output with it)"
                if cfg.reward in BUILTIN_REWARD_NAMES
                else "give the rows their ground truth, or set task.answer_key: null for a reward that reads none"
            )
        raise ConfigError(
            str(data_path), None, f"{rows}: {str(first).removeprefix(f'{first.where}: ')}{has}", hint=hint
        )
    if cfg.bad_rows == "refuse":
        skip_does = "evaluate" if heldout else "train on"  # (a held-out file's skip was said to train on its rows)
        shown = "; ".join(str(b).removeprefix(f"{data_path}:") for b in bad[:SHOWN_BAD_ROWS])
        more = f"; … {len(bad) - SHOWN_BAD_ROWS} more" if len(bad) > SHOWN_BAD_ROWS else ""
        raise ConfigError(
            str(data_path),
            None,
            f"{len(bad)} of {total} rows are bad: {shown}{more}",
            hint="fix the rows"
            + (f", or set `task.bad_rows: skip` to {skip_does} the others" if len(bad) < total else ""),
        )
    if not each:
        shown = str(bad[0]).removeprefix(f"{data_path}:")
        log.warning(
            "dataset %s: %d of %d rows will be skipped (task.bad_rows: skip); the first: %s",
            data_path,
            len(bad),
            total,
            shown,
        )
        return
    for b in bad[:LOGGED_BAD_ROWS]:
        log.warning("skipped bad row %s", b)
    if len(bad) > LOGGED_BAD_ROWS:
        log.warning("skipped %d more bad rows of %s", len(bad) - LOGGED_BAD_ROWS, data_path)
    log.warning("dataset %s: skipped %d of %d rows (task.bad_rows: skip)", data_path, len(bad), total)


def load_dataset(out_dir: Path, cfg: DatasetTask) -> PromptDataset:
    """The prepared dataset in `out_dir`, its checksum verified (what every site calls)."""
    from safetensors.numpy import load_file

    manifest_path = out_dir / MANIFEST_FILE
    if not manifest_path.exists():
        raise ConfigError(str(manifest_path), None, "no prepared dataset here; the launch prepares it first")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    if _sha256(out_dir / TOKENS_FILE, out_dir / ROWS_FILE) != manifest["checksum"]:
        raise ConfigError(
            str(out_dir), None, f"{TOKENS_FILE} or {ROWS_FILE} changed since they were prepared (checksum mismatch)"
        )
    arrays = load_file(str(out_dir / TOKENS_FILE))
    with (out_dir / ROWS_FILE).open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return PromptDataset(arrays["tokens"], arrays["offsets"], rows, cfg, manifest)


class PromptDataset:
    """Prepared prompts and their deterministic per-epoch order (see the module docstring)."""

    def __init__(
        self, tokens: np.ndarray, offsets: np.ndarray, rows: list[dict[str, Any]], cfg: DatasetTask, manifest: dict
    ) -> None:
        assert len(offsets) == len(rows) + 1
        self._tokens = tokens
        self._offsets = offsets
        self._rows = rows
        self.cfg = cfg
        self.checksum: str = manifest["checksum"]
        self.num_bad_rows: int = manifest["num_bad_rows"]
        self._orders: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def max_prompt_tokens(self) -> int:
        return int(np.diff(self._offsets).max())

    @property
    def max_new_tokens(self) -> int:
        return self.cfg.max_output_tokens

    def tokens(self, row: int) -> list[int]:
        return list(self._tokens[self._offsets[row] : self._offsets[row + 1]].tolist())

    def order(self, epoch: int) -> np.ndarray:
        """The row order of `epoch`: a permutation seeded by (shuffle_seed, epoch), or file order. The last
        ORDERS_KEPT used are kept: the rounds in flight read their own epoch and, with dynamic sampling, each its
        refills' (REFILL_STRIDE positions a round: another epoch but for datasets of 2²⁰ rows or more)."""
        got = self._orders.pop(epoch, None)
        if got is None:
            if len(self._orders) >= ORDERS_KEPT:
                del self._orders[next(iter(self._orders))]  # the least recently used
            n = len(self._rows)
            rng = np.random.default_rng([self.cfg.shuffle_seed, epoch])
            got = rng.permutation(n) if self.cfg.shuffle else np.arange(n)
        self._orders[epoch] = got  # most recently used last
        return got

    def row_at(self, position: int) -> int:
        epoch, i = divmod(position, len(self._rows))
        return int(self.order(epoch)[i])

    def prompt(self, position: int) -> DataPrompt:
        """The prompt at `position` of the data stream (id `p<position>`)."""
        row = self.row_at(position)
        r = self._rows[row]
        return DataPrompt(
            f"p{position}", self.tokens(row), r["ground_truth"], r["data_source"], r["extra_info"], row, r["source_row"]
        )

    def prompt_ids_for(self, iteration: int, n: int) -> list[str]:
        return [f"p{k}" for k in range(iteration * n, (iteration + 1) * n)]

    def rl_prompts(self, iteration: int, n: int) -> list[DataPrompt]:
        """The n prompts of RL iteration `iteration`: positions iteration·n … iteration·n + n − 1."""
        return [self.prompt(k) for k in range(iteration * n, (iteration + 1) * n)]

    def refill_prompt(self, iteration: int, j: int) -> DataPrompt:
        """The j-th prompt drawn for RL iteration `iteration` in place of a dropped group (dynamic sampling):
        position REFILL_OFFSET + iteration·REFILL_STRIDE + j, past any iteration's own (the rows of other epochs'
        orders: a prompt the iterations draw too, as more of the data stream would be)."""
        assert 0 <= j < REFILL_STRIDE, j
        return self.prompt(REFILL_OFFSET + iteration * REFILL_STRIDE + j)


# ── glue for the trainer and `rlctl check` ────────────────────────────────────────────────────────


def submit_reward(
    pool: RewardPool,
    tokenizer: TextTokenizer,
    *,
    sample_id: str,
    prompt: DataPrompt,
    output_tokens: Sequence[int],
    data_path: str | None = None,
) -> Future[RewardResult]:
    """Decode the output (cut at the first EOS) and queue its reward call; returns at once. A failed call is logged
    naming the prompt's row of `data_path` (the user's file)."""
    text = decode_output(tokenizer, output_tokens)
    origin = f"{data_path} {prompt.source_row}" if data_path is not None else prompt.source_row
    return pool.submit(sample_id, prompt.data_source, text, prompt.ground_truth, prompt.extra_info, origin=origin)


def _check_reward_loads(cfg: DatasetTask, base: Path) -> None:
    """The reward loads; a reward file from the copy the launch makes in the job (`copy_reward`: the file and the
    modules beside it that it imports), versus where it is: one that read another file beside it (`__file__`) passed,
    and every site's copy of the job failed at its start. Raises ValueError: the loader's line, or (the file loads
    where it is) one saying what the copy holds."""

    def load(spec: str, at: Path) -> None:
        check_loads(spec, at, timeout_s=cfg.reward_timeout_s, load_timeout_s=cfg.reward_load_timeout_s)

    target, sep, name = cfg.reward.rpartition(":")
    src = (base / target).resolve()
    if not sep or not target.endswith(".py") or not src.is_file():
        load(cfg.reward, base)
        return
    copied = Path(target).name  # the name the launch gives its copy (a link's own, not its target's)
    with tempfile.TemporaryDirectory(prefix="rlctl-check-") as tmp:
        copy_reward(base / target, Path(tmp) / "reward")
        try:
            load(f"reward/{copied}:{name}", Path(tmp))
        except LoadTimedOut as e:  # a slow (or hung) import, nothing the copy lacks: said as the job names it
            raise ValueError(str(e).replace(f"reward/{copied}:{name}", cfg.reward, 1)) from e
        except ValueError as e:
            load(cfg.reward, base)  # the file's own error, as it is named
            error = str(e).replace(f"{tmp}/reward", "<job dir>/reward").removeprefix(f"reward/{copied}: ")
            raise ValueError(
                f"{target} loads here, but not from the job's copy of it, which holds the file and the modules and "
                "packages beside it that it imports (a package whole; not a module named as a standard library one), "
                f"nothing else: {error}; put a file it reads in such a package, or read it by a path every site has"
            ) from e


def _tokens_fit_the_model(tokenizer: HFTokenizer, model_dir: Path) -> None:
    """Every id the tokenizer gives has a row of the model's embedding: one past `vocab_size` (a tokenizer of more
    tokens than the checkpoint embeds) passed check and crashed every rollout unit on its first prompt with that
    token ('IndexError: index out of range in self'), until the job failed for want of rollout agents."""
    from rlctl.models.hf import CONFIG_FILE, read_config

    if not (model_dir / CONFIG_FILE).is_file():  # (a job's model.path has one: load_job's check_hf_dir read it)
        return
    embedded = read_config(model_dir).vocab_size
    if tokenizer.vocab_size > embedded:
        raise ConfigError(
            str(model_dir / "tokenizer.json"),
            None,
            f"{tokenizer.vocab_size} tokens, more than the model's vocab_size {embedded} (config.json): ids "
            f"{embedded}–{tokenizer.vocab_size - 1} have no embedding",
            hint="use the checkpoint's own tokenizer, or resize the model's embeddings to the tokenizer "
            "(transformers: resize_token_embeddings) and save it again",
        )


def check_task(cfg: DatasetTask, *, job_file: Path, model_dir: Path | None = None) -> None:
    """What `rlctl check` verifies: the data file exists, the reward function loads, and — given the model's
    directory (its tokenizer) — every row reads and tokenizes as the launch will (`check_rows`)."""
    base = job_file.parent
    data = base / cfg.path
    if not data.is_file():
        raise ConfigError(str(job_file), "task.path", f"{not_a_file(data)} {str(data)!r}{job_relative(cfg.path)}")
    try:  # in a reward worker, within its deadline: never the user's module's import in this process
        _check_reward_loads(cfg, base)
    except ValueError as e:
        raise ConfigError(str(job_file), "task.reward", str(e)) from e
    except ConfigError as e:  # a module of it that cannot be copied into the job (`copy_reward`), named
        raise ConfigError(str(job_file), "task.reward", f"{e.file}: {e.detail}", hint=e.hint) from e
    if model_dir is None or not model_dir.is_dir():
        return
    from rlctl.rl.tokenizer import load_tokenizer

    try:  # the tokenizer is the model directory's: a missing or bad one is model.path's, not the data's
        tokenizer = load_tokenizer(model_dir)
        _tokens_fit_the_model(tokenizer, model_dir)
    except ConfigError as e:
        raise ConfigError(str(job_file), "model.path", str(e), hint=e.hint) from e
    try:
        check_rows(cfg, data_path=data, tokenizer=tokenizer)
    except NoChatTemplate as e:  # the model's to fix, or the prompts' form: not the data file's rows
        raise ConfigError(str(job_file), "model.path", f"{e.file}: {e.detail}", hint=e.hint) from e
    except ConfigError as e:
        message = str(e).removeprefix(f"{e.file}: ")
        raise ConfigError(str(job_file), "task.path", f"{e.file}: {message}", hint=e.hint) from e
