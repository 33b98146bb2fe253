"""User datasets (task kind `dataset`): rows → token ids once at launch, read back identically on every site.

    train.jsonl / .parquet ──prepare_dataset (launch, once)──▶ <out_dir>/
      {"prompt": str | [{role, content}],                         prompts.safetensors  tokens int32, offsets int64
       "ground_truth" | "reward_model": {"ground_truth"},         rows.jsonl           ground_truth, data_source,
       "data_source", "extra_info"}                                                    extra_info, source row
                                                                  manifest.json        counts, order, checksum
    every site: load_dataset(out_dir) → PromptDataset (checksum verified)

A row is read and tokenized by rlctl.rl.dataset_rows, the whole file under `task.bad_rows` by rlctl.rl.dataset_scan.
The data stream is a pure function of the position: position k is row order(k // N)[k % N], where order(epoch) is the
permutation seeded by (shuffle_seed, epoch); iteration i's n prompts are positions i·n … i·n + n − 1 (prompt ids
`p<k>`), so a resumed job needs no loader state.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlctl.config.task import DatasetTask
from rlctl.errors import ConfigError
from rlctl.launch.jobdir import refuse_theirs
from rlctl.rl.dataset_rows import NoChatTemplate
from rlctl.rl.dataset_scan import (
    LOGGED_BAD_ROWS,
    RowsChecked,
    check_rows,
    identity_of,
    report_bad_rows,
    sha256_of,
    take_kept,
    tokenized_rows,
)
from rlctl.rl.reward import RewardResult
from rlctl.rl.reward_files import copy_reward
from rlctl.rl.reward_pool import LoadTimedOut, RewardPool, check_loads
from rlctl.rl.tokenizer import HFTokenizer, TextTokenizer, decode_output
from rlctl.textutil import is_job_relative, job_relative, not_a_file

log = logging.getLogger(__name__)

TOKENS_FILE = "prompts.safetensors"
ROWS_FILE = "rows.jsonl"
MANIFEST_FILE = "manifest.json"
# the prompts drawn in place of dropped groups (dynamic sampling): a region of positions of their own, past any
# iteration's (a job of 2⁵⁰ prompts), REFILL_STRIDE per iteration
REFILL_OFFSET = 2**50
REFILL_STRIDE = 2**20
ORDERS_KEPT = 8  # epochs' row orders a dataset keeps (8 × 8 bytes a row)


@dataclass(frozen=True)
class DataPrompt:
    prompt_id: str  # p<position in the data stream>
    tokens: list[int]
    ground_truth: Any
    data_source: str
    extra_info: Any
    row: int  # index among the prepared rows
    source_row: str  # "line 3" / "row 2" in the user's file


# ── preparing (once, at launch) and loading (every site) ──────────────────────────────────────────


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


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
    every row is read, the manifest last. `heldout`: the file is evaluation.path (`dataset_scan`)."""
    from safetensors.numpy import save

    if not data_path.is_file():
        field = "evaluation.path" if heldout else "task.path"
        read = " is relative to the job file" if is_job_relative(cfg.path) else ""  # absolute or `~/…`: as written
        raise ConfigError(str(data_path), None, f"{not_a_file(data_path)} ({field}{read})")
    refuse_not_ours(data_path, out_dir)
    identity = identity_of(cfg, data_path, tokenizer)
    kept = take_kept(data_path)
    manifest_path = out_dir / MANIFEST_FILE
    if manifest_path.exists():
        old = json.loads(manifest_path.read_text(encoding="utf-8"))
        if all(old.get(k) == v for k, v in identity.items()):
            return load_dataset(out_dir, cfg)
    if kept is not None and kept[0] == identity:  # read and tokenized by this launch's check, the file unchanged
        tokens, rows, bad = kept[1]
        report_bad_rows(cfg, data_path, bad, len(rows) + len(bad), [], each=True)  # (refused by the check if so)
    else:
        tokens, rows, bad = tokenized_rows(cfg, data_path, tokenizer, check=check, heldout=heldout)
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
        "checksum": sha256_of(out_dir / TOKENS_FILE, out_dir / ROWS_FILE),
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


def load_dataset(out_dir: Path, cfg: DatasetTask) -> PromptDataset:
    """The prepared dataset in `out_dir`, its checksum verified (what every site calls)."""
    from safetensors.numpy import load_file

    manifest_path = out_dir / MANIFEST_FILE
    if not manifest_path.exists():
        raise ConfigError(str(manifest_path), None, "no prepared dataset here; the launch prepares it first")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    if sha256_of(out_dir / TOKENS_FILE, out_dir / ROWS_FILE) != manifest["checksum"]:
        raise ConfigError(
            str(out_dir), None, f"{TOKENS_FILE} or {ROWS_FILE} changed since they were prepared (checksum mismatch)"
        )
    arrays = load_file(str(out_dir / TOKENS_FILE))
    with (out_dir / ROWS_FILE).open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return PromptDataset(arrays["tokens"], arrays["offsets"], rows, cfg, manifest)


def prepared_rows(out_dir: Path, cfg: DatasetTask) -> RowsChecked:
    """The rows of the dataset prepared in `out_dir` as a resumed run reads them (`load_dataset`: its checksum
    verified), said as `check_rows` says a file's; what a resume's check reads where the file they were prepared
    from is gone since the launch. The prompts' forms are not kept (tokens alone): `prepared`, not judged by them."""
    data = load_dataset(out_dir, cfg)
    with (out_dir / ROWS_FILE).open(encoding="utf-8") as f:
        sources = frozenset(str(json.loads(line)["data_source"]) for line in f)
    return RowsChecked(len(data), sources, out_dir, string_prompts=0, prepared=True)


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


def check_task(
    cfg: DatasetTask, *, job_file: Path, model_dir: Path | None = None, prepared: Path | None = None
) -> RowsChecked | None:
    """What `rlctl check` verifies: the data file exists, the reward function loads, and — given the model's
    directory (its tokenizer) — every row reads and tokenizes as the launch will (`check_rows`: what it read, else
    None). `prepared`: a resumed run's tokenized copy of the file (its job dir's data/, what the run reads), read in
    place of a data file gone since the launch (`prepared_rows`), versus refused as no such file."""
    base = job_file.parent
    data = base / cfg.path
    copy = prepared is not None and not data.is_file() and (prepared / MANIFEST_FILE).is_file()
    if not data.is_file() and not copy:
        raise ConfigError(str(job_file), "task.path", f"{not_a_file(data)} {str(data)!r}{job_relative(cfg.path)}")
    try:  # in a reward worker, within its deadline: never the user's module's import in this process
        _check_reward_loads(cfg, base)
    except ValueError as e:
        raise ConfigError(str(job_file), "task.reward", str(e)) from e
    except ConfigError as e:  # a module of it that cannot be copied into the job (`copy_reward`), named
        raise ConfigError(str(job_file), "task.reward", f"{e.file}: {e.detail}", hint=e.hint) from e
    if copy:
        assert prepared is not None
        try:
            return prepared_rows(prepared, cfg)
        except ConfigError as e:  # (changed since it was prepared: the run's load refuses it alike)
            raise ConfigError(str(job_file), "task.path", str(e), hint=e.hint) from e
    if model_dir is None or not model_dir.is_dir():
        return None
    from rlctl.rl.tokenizer import load_tokenizer

    try:  # the tokenizer is the model directory's: a missing or bad one is model.path's, not the data's
        tokenizer = load_tokenizer(model_dir)
        _tokens_fit_the_model(tokenizer, model_dir)
    except ConfigError as e:
        raise ConfigError(str(job_file), "model.path", str(e), hint=e.hint) from e
    try:
        return check_rows(cfg, data_path=data, tokenizer=tokenizer)
    except NoChatTemplate as e:  # the model's to fix, or the prompts' form: not the data file's rows
        raise ConfigError(str(job_file), "model.path", f"{e.file}: {e.detail}", hint=e.hint) from e
    except ConfigError as e:
        message = str(e).removeprefix(f"{e.file}: ")
        raise ConfigError(str(job_file), "task.path", f"{e.file}: {message}", hint=e.hint) from e
