"""A whole dataset file read under the task's rules: every row parsed (rlctl.rl.dataset_rows), the bad ones refused
or logged as `task.bad_rows` says, verl's shapes rlctl trains otherwise warned of; `check_rows` (`rlctl check`'s read)
and the rows a launch's check keeps for its prepare (`keeping_rows`).

`bad_rows: refuse` turns the bad rows into one ConfigError, `skip` drops them: each logged by a launch's prepare, one
line for all by a check.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlctl.config.task import BUILTIN_REWARD_NAMES, DatasetTask
from rlctl.errors import ConfigError
from rlctl.rl.dataset_rows import MISSING, NULL_ANSWER, BadRow, lookup, parse_row, read_rows
from rlctl.rl.tokenizer import TextTokenizer
from rlctl.textutil import one_of

log = logging.getLogger(__name__)

SHOWN_BAD_ROWS = 3  # in the refusal's one line
LOGGED_BAD_ROWS = 20
_TOKENIZING_FIELDS = {
    "prompt_key",
    "answer_key",
    "data_source_key",
    "extra_info_key",
    "template_strings",
    "max_prompt_tokens",
    "bad_rows",
}


def sha256_of(*files: Path) -> str:
    h = hashlib.sha256()
    for f in files:
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


# the rows `check_rows` read and tokenized while `keeping_rows`, by file, with their `identity_of`, until
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


def take_kept(data_path: Path) -> tuple[dict[str, Any], _Rows] | None:
    """The rows of `data_path` a check kept (`keeping_rows`) with their `identity_of`, handed over once: the prepare of
    that file writes them where the file, tokenizer and settings are still the same."""
    return _kept.pop(str(data_path), None)


def identity_of(cfg: DatasetTask, data_path: Path, tokenizer: TextTokenizer) -> dict[str, Any]:
    """What a prepared dataset is made of: the file (its SHA-256), the tokenizer, the settings that change it."""
    settings = cfg.model_dump(include=_TOKENIZING_FIELDS)
    if cfg.chat_template_kwargs:  # (only where set: a dataset prepared before the field was is kept as it was)
        settings["chat_template_kwargs"] = cfg.chat_template_kwargs
    return {
        "source": str(data_path.resolve()),  # (relative, a launch from another directory rebuilt it)
        "source_sha256": sha256_of(data_path),
        "tokenizer": tokenizer.fingerprint(),
        "settings": settings,
    }


def tokenized_rows(
    cfg: DatasetTask,
    data_path: Path,
    tokenizer: TextTokenizer,
    *,
    check: Callable[[], None] | None = None,
    each: bool = True,
    heldout: bool = False,
    forms: Counter[str] | None = None,
) -> tuple[list[list[int]], list[dict[str, Any]], list[BadRow]]:
    """Every row of `data_path` read and tokenized (`_scan`): the good ones' tokens and rows, and the bad ones.
    `check` is called at each good row; `each`: each bad row logged (else one line for all); `forms`: counts the
    good rows' prompts by form (`_prompt_form`)."""
    tokens: list[list[int]] = []
    rows: list[dict[str, Any]] = []

    def keep(label: str, parsed: tuple[list[int], dict[str, Any]]) -> None:
        if check is not None:
            check()
        tokens.append(parsed[0])
        rows.append({"source_row": label, **parsed[1]})

    _, bad = _scan(cfg, data_path, tokenizer, keep, each=each, heldout=heldout, forms=forms)
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
        self.reward_model += lookup(row, "reward_model.style") == "model"
        self.images += any(row.get(k) for k in ("images", "videos"))
        prompt = lookup(row, cfg.prompt_key)
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
    forms: Counter[str] | None = None,
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
    for label, raw in read_rows(data_path):
        if not fields and isinstance(raw, dict):
            fields = [str(k) for k in raw]
        if unseen and isinstance(raw, dict):
            unseen = {s: k for s, k in unseen.items() if lookup(raw, k) is MISSING}
        parsed = (
            raw if isinstance(raw, BadRow) else parse_row(f"{data_path}:{label}", raw, cfg, tokenizer, data_path.stem)
        )
        if isinstance(parsed, BadRow):
            bad.append(parsed)
            continue
        good += 1
        unsupported.see(raw, cfg)
        if forms is not None:
            forms[_prompt_form(lookup(raw, cfg.prompt_key))] += 1
        if keep is not None:
            keep(label, parsed)
    each = keep is not None if each is None else each
    report_bad_rows(cfg, data_path, bad, good + len(bad), fields, each=each, heldout=heldout)
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


def _prompt_form(prompt: Any) -> str:
    """A good row's prompt: "string" (rendered through the chat template with task.template_strings alone) or "chat"
    (messages: always rendered through it, with task.chat_template_kwargs)."""
    return "string" if isinstance(prompt, str) else "chat"


@dataclass(frozen=True)
class RowsChecked:
    """What `check_rows` read of a file: its usable rows (what the launch will prepare), and their data_sources (a
    dataset a built-in reward scores is warned of: `rlctl.rl.reward.builtin_scorer_hints`), and how many of them
    have a string prompt (the rest: chat messages; what reads task.template_strings and chat_template_kwargs).
    `prepared`: read of a job dir's tokenized copy (`dataset.prepared_rows`), which keeps no prompt's form."""

    good: int
    data_sources: frozenset[str]
    path: Path
    string_prompts: int
    prepared: bool = False

    @property
    def chat_prompts(self) -> int:
        return self.good - self.string_prompts


def check_rows(cfg: DatasetTask, *, data_path: Path, tokenizer: TextTokenizer, heldout: bool = False) -> RowsChecked:
    """What `rlctl check` does with the rows: every one read and tokenized as the launch will (streaming, nothing
    kept or written, unless `keeping_rows`), refused as the launch would; the usable rows and their data_sources.
    `heldout`: the file is evaluation.path (what a skip of its bad rows leaves is evaluated)."""
    sources: set[str] = set()
    forms: Counter[str] = Counter()

    def source(_: str, row: tuple[list[int], dict[str, Any]]) -> None:
        sources.add(row[1]["data_source"])

    if not _keeping.get() or not data_path.is_file():
        good, _ = _scan(cfg, data_path, tokenizer, source, each=False, heldout=heldout, forms=forms)
    else:
        identity = identity_of(cfg, data_path, tokenizer)  # (the file's digest before its rows are read)
        kept = tokenized_rows(cfg, data_path, tokenizer, each=False, heldout=heldout, forms=forms)
        _kept[str(data_path)] = (identity, kept)
        good, sources = len(kept[1]), {row["data_source"] for row in kept[1]}
    return RowsChecked(good, frozenset(sources), data_path, forms["string"])


def report_bad_rows(
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
