"""Small text helpers: closest-name suggestions and lists of valid names (error messages), durations, how a job
file's path is read."""

from __future__ import annotations

import difflib
import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path, PurePath

from rlctl.errors import UsageError


def did_you_mean(word: str, valid: Iterable[str]) -> str:
    """Return " (did you mean 'x'?)" for the closest valid name, or "" when nothing is close."""
    choices = list(valid)
    lowered = {c.lower(): c for c in choices}
    if word.lower() in lowered:
        return f" (did you mean '{lowered[word.lower()]}'?)"
    match = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not match:
        match = [lowered[m] for m in difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)]
    return f" (did you mean '{match[0]}'?)" if match else ""


def one_line(text: str, *, max_chars: int | None = None) -> str:
    """`text` with line breaks and other control characters escaped (a key named "a\\nb" in a YAML file
    must not split the error in two, nor an escape sequence reach the terminal); `max_chars`: cut to at most that
    many characters, the cut said by a last '…'."""
    line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return line if max_chars is None or len(line) <= max_chars else line[: max_chars - 1] + "…"


def one_of(valid: Iterable[str]) -> str:
    return ", ".join(sorted(valid))


def duration(seconds: float) -> str:
    """A span as people read it: '45 s', '3 min 05 s', '2 h 07 min', '3 d 04 h' (weeks-long runs)."""
    s = round(seconds)
    if s >= 86400:
        return f"{s // 86400} d {s % 86400 // 3600:02d} h"
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


def is_job_relative(path: str | PurePath) -> bool:
    """Whether a path the job file wrote is read relative to the job file: not an absolute one, nor `~/…` (read from
    the home directory: `load_job` expands it). The one rule of every line that says so."""
    return not PurePath(os.path.expanduser(path)).is_absolute()


def job_relative(path: str | PurePath) -> str:
    """What a missing file's line adds of where it was looked for: a path the job file wrote relative is read
    relative to the job file (said), an absolute one or `~/…` as written (nothing to add). One rule for `rlctl check`
    and the launch, which say the same missing file."""
    return " (relative to the job file)" if is_job_relative(path) else ""


def not_a_file(path: str | PurePath) -> str:
    """What a file the user named that is no file is: `not a file` where the path is there (a directory: it was said
    to be `no such file`, as if missing), else `no such file`. The one rule of every line that refuses such a path."""
    return "not a file" if Path(path).exists() else "no such file"


CONFIG_MAX_BYTES = 64 * 1024 * 1024  # far past any job, inventory, profile or config.json
_SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"), (stat.S_ISSOCK, "a socket"))


def read_config_bytes(path: Path, *, max_bytes: int = CONFIG_MAX_BYTES) -> bytes:
    """A config file's bytes, read only where it is a regular file of at most `max_bytes`: ValueError, one clause, for
    a FIFO, a device or a socket (read_bytes of `mkfifo job.yaml` or /dev/zero waited, or read, for ever) and for a
    larger file; OSError as reading raises it (IsADirectoryError for a directory, as read_bytes said it)."""
    st = path.stat()  # (open() of a FIFO waits for a writer: asked first)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if not stat.S_ISREG(st.st_mode):
        kind = next((said for test, said in _SPECIAL if test(st.st_mode)), "no regular file")
        raise ValueError(f"not a file: {kind}; name a regular file")
    too_large = f"larger than {max_bytes // 2**20} MiB; no config is that large (is this the file you meant?)"
    if st.st_size > max_bytes:
        raise ValueError(f"{st.st_size} bytes, {too_large}")
    with path.open("rb") as f:
        raw = f.read(max_bytes + 1)
    if len(raw) > max_bytes:  # (grown since, or a file system that says no size)
        raise ValueError(too_large)
    return raw


def undecodable_at(raw: bytes, start: int) -> str:
    """Where `raw` stops being UTF-8 (`start`: a UnicodeDecodeError's), as an editor counts it: the byte, its line and
    column (in characters: the line's bytes before it decode, é is 2 bytes and 1 column)."""
    line = raw.count(b"\n", 0, start) + 1
    column = len(raw[raw.rfind(b"\n", 0, start) + 1 : start].decode("utf-8")) + 1
    return f"byte 0x{raw[start]:02x} at line {line}, column {column}"


def home_expanded(written: str) -> str:
    """`written` with a leading `~` or `~user` expanded (os.path's rule), the one rule of every path rlctl reads here:
    a home this machine does not know (`~nosuchuser/…`) is a ValueError, one message, where os.path leaves it as
    written (read as a folder named `~nosuchuser` beside the job file) and Path.expanduser raised RuntimeError
    ('Could not determine home directory', a traceback). The caller names the path and the option or field."""
    expanded = os.path.expanduser(written)
    if written.startswith("~") and expanded == written:
        raise ValueError(f"{written.split('/')[0]} is no home directory here (no such user)")
    return expanded


def home_path(path: str | PurePath, *, named: str) -> Path:
    """`path` with a leading `~` or `~user` expanded (`home_expanded`), as the option or field `named` gave it; a home
    this machine does not know is refused in one line naming it (exit 2)."""
    try:
        return Path(home_expanded(str(path)))
    except ValueError as e:
        raise UsageError(f"{named} {path}: {e}", hint=f"give {named} as ~/… or in full") from e
