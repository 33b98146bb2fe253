"""One command's reads of a model's directory: within `reads_once()` (`rlctl check`, `rlctl plan`) a checkpoint's
config.json and its weight files' headers are read once while their files are unchanged, versus once for every
question asked of them (`rlctl check` of an HF job read config.json 18 times and each header 10: the job's model
checked at load, then its architecture, context, window, memory, ... each reading it again).

    reads_once() ──▶ read_config(d) / check_hf_dir(d) ──key: (what, d, each file's stamp)──▶ kept, or read and kept

A stamp is a file's (size, mtime, inode, ctime): a file rewritten or replaced between two reads is read again.
Outside the scope nothing is kept: an agent, a resume or a test that rewrites the directory reads it afresh every
time, as before. Each caller gets its own copy (`TinyGPTConfig` is mutable)."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_kept: ContextVar[dict[tuple[Any, ...], Any] | None] = ContextVar("rlctl_model_reads", default=None)


@contextmanager
def reads_once() -> Iterator[None]:
    """A scope (one command) in which `kept` keeps what it read."""
    token = _kept.set({})
    try:
        yield
    finally:
        _kept.reset(token)


def stamp(path: Path) -> tuple[int, int, int, int] | None:
    """`path`'s size, mtime, inode and ctime (ns); None where it is not there."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def dir_stamp(directory: Path) -> tuple[tuple[str, tuple[int, int, int, int] | None], ...] | None:
    """Every file's `stamp` in `directory` (by name, links followed); None where it cannot be listed."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return None
    return tuple((n, stamp(directory / n)) for n in names)


def kept(key: tuple[Any, ...], read: Callable[[], T]) -> T:
    """`read()`, a copy of what it returned the first time in this scope for `key` (which must hold the stamps of
    the files `read` reads); outside a scope, `read()` always. An error is not kept: the next call reads again."""
    memo = _kept.get()
    if memo is None:
        return read()
    if key not in memo:
        memo[key] = read()
    return copy.deepcopy(memo[key])
