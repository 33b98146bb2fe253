"""The files of a job's record, written and read whole: a .jsonl file appended to a row at a time under a lock
(`appending`, `append_row`: a line cut short by a killed writer gets its newline first), a file replaced by a
rename (`replace_text`), and the record read back as text that bytes of no UTF-8 cannot break (`open_record`) and
as JSON rows, a damaged line named by file and line (`json_lines`, `json_rows`). `rlctl.launch.jobdir.JobDir`
reads and appends through these."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from rlctl.errors import LaunchError
from rlctl.launch.locks import flock

log = logging.getLogger(__name__)


@contextlib.contextmanager
def appending(path: Path) -> Iterator[TextIO]:
    """`path` open to append, under an exclusive flock: the events the operator's processes append here and
    `fetch_record`'s merge of the controller site's events into the file (read, merge, rename over it, under this
    lock too) exclude each other, so no event lands in the file the merge replaces (`rlctl stop`'s request lost
    to a `rlctl status -w` poll). A file renamed over while this waited for the lock is opened again. Where the
    filesystem has no flock (a site's Lustre mounted without it: its agents append there, no merge happens
    there) the file is appended to unlocked."""
    while True:
        f = path.open("a")
        try:
            if flock(f, fcntl.LOCK_EX) is not None or os.path.samestat(os.fstat(f.fileno()), os.stat(path)):
                break
        except BaseException:
            f.close()
            raise
        f.close()  # the merge replaced it: its lock was the old file's
    with f:
        yield f


def append_row(path: Path, row: dict[str, Any]) -> None:
    """`row` as a line of its own at the end of the .jsonl file `path`. A file that ends in a line cut short (its
    writer SIGKILLed mid-write, a full disk) gets its newline first: the row went on that line, and the one
    damaged line became this one and every reader's (`rlctl stop`'s request among them, or the record of the
    agent started next, which no stop then stopped)."""
    with appending(path) as f:
        f.write(("\n" if ends_mid_line(path) else "") + json.dumps(row, default=str) + "\n")


def ends_mid_line(path: Path) -> bool:
    """Whether the file `path` ends in a line without its newline (False where there is none): a writer killed as
    it appended left it so, and the next line appended starts on a line of its own (`append_event`, the sample
    log's lines set aside)."""
    try:
        with path.open("rb") as f:
            end = f.seek(0, os.SEEK_END)
            if end == 0:
                return False
            f.seek(end - 1)
            return f.read(1) != b"\n"
    except FileNotFoundError:
        return False


def replace_text(path: Path, text: str) -> None:
    """Write `path` under a temporary name, then rename it: a reader sees the old file or the new, whole. The name is
    this writer's own (its process and thread), versus one `NAME.tmp` two writers at once would share (one's rename
    of the other's half-written file; the other's rename failing on a name gone); removed if the write fails."""
    replace_lines(path, [text])


def replace_lines(path: Path, pieces: Iterable[str]) -> None:
    """`replace_text` of the text `pieces` make, written as they come (a file larger than memory should hold)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        with tmp.open("w") as f:
            for piece in pieces:
                f.write(piece)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def open_record(path: Path) -> TextIO:
    """`path`, a file of the job's record (events.jsonl, metrics.jsonl, agents.jsonl, a JSON file), open to read as
    text. Bytes that are no UTF-8 (a disk's damage, another tool's write) read as U+FFFD: their line is one that does
    not parse, which each reader refuses or leaves out, naming the file and line, as it does any damaged line (a
    UnicodeDecodeError's traceback, before). A directory in the file's place is a LaunchError naming it (an
    IsADirectoryError's traceback, before); any other OSError passes (a missing file is each caller's own case)."""
    try:
        return path.open(encoding="utf-8", errors="replace")
    except IsADirectoryError as e:
        raise not_a_file(path) from e


def not_a_file(path: Path) -> LaunchError:
    """What a directory in the place of `path`, a file of the job's record, is said as (`open_record`)."""
    return LaunchError(
        f"{path}: a directory, where the job's record has a file", hint="move it aside, or put the file back"
    )


def record_text(path: Path) -> str:
    """The whole text of `path`, a file of the job's record, read as `open_record` says."""
    with open_record(path) as f:
        return f.read()


def json_file(path: Path) -> Any:
    """A JSON file of the job's record; LaunchError naming the file when it is not JSON or is a directory (any other
    OSError passes)."""
    try:
        return json.loads(record_text(path))
    except ValueError as e:  # JSONDecodeError
        raise LaunchError(f"{path}: not valid JSON ({e})", hint="was it edited or cut short?") from e


def whole_object(line: str) -> bool:
    """Whether `line` may be a JSON object whole (a line cut short by a writer killed mid-write is not)."""
    line = line.strip()
    return not line or (line.startswith("{") and line.endswith("}"))


def json_lines(path: Path | str, text: str, *, skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """The JSON objects of `text`, the content of the .jsonl file `path` (see JobDir.read_lines). A line that is no
    JSON object raises LaunchError, or, given `skipped`, is left out with a line there saying which (a reader that
    must act on what it can read: `rlctl stop`)."""
    return list(json_rows(path, text.splitlines(), skipped=skipped))


def json_rows(
    path: Path | str,
    lines: Iterable[str],
    *,
    skipped: list[str] | None = None,
    parsed: Callable[[str], bool] = lambda line: True,
) -> Iterator[dict[str, Any]]:
    """`json_lines` of `lines` (the file's, one at a time), those before the last that are not `parsed` passed over
    unread. The last line that is not blank, which may not parse yet, is known once the next is read: each line is
    held back until then, so nothing but one line is held at once."""
    held: tuple[int, str] | None = None
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        if held is not None and parsed(held[1]):
            yield from json_row_at(path, *held, last=False, skipped=skipped)
        held = (i, line)
    if held is not None:
        yield from json_row_at(path, *held, last=True, skipped=skipped)


def json_row_at(
    path: Path | str, i: int, line: str, *, last: bool, skipped: list[str] | None
) -> Iterator[dict[str, Any]]:
    """The JSON object of line `i` (from 0) of `path`, if it is one (`json_lines`)."""
    try:
        row = json.loads(line)
    except ValueError as e:
        if last:
            log.debug("%s: line %d skipped, not (yet) a whole JSON object: %s", path, i + 1, e)
            return
        bad = LaunchError(f"{path}: line {i + 1} is not valid JSON ({e})", hint="was it edited?")
        if skipped is None:
            raise bad from e
        skipped.append(f"{bad.args[0]}: left out")
        return
    if not isinstance(row, dict):
        if skipped is None:
            raise LaunchError(f"{path}: line {i + 1} is {type(row).__name__}, not a JSON object")
        skipped.append(f"{path}: line {i + 1} is {type(row).__name__}, not a JSON object: left out")
        return
    yield row
