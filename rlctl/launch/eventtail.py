"""The merge of the controller site's events into the operator's events.jsonl, by what the site's grew: its new lines
appended, where that is what the whole merge (`record._merge_lines`: both files read, parsed, sorted and written
again) would write, so that a `rlctl status` of a job of weeks reads the events that arrived, not every event of
the job (64 units a weight version each, 10⁴ versions: 640,000 lines, ≈ 130 MB, read twice and written again at
each status).

    fetch_record ─▶ .site-events.jsonl grew ─▶ tail(events, mirror, f) ─┬─ True: the new lines appended to f
                                                                         └─ False ─▶ the whole merge
                  ─▶ mark(events, mirror): .site-events.merged says what the merge left (each file's inode, size)

The new lines are appended only where events.jsonl is as the last merge left it (its inode and size: nothing
appended here since), the site's copy grew in place past what that merge read (its inode: not fetched whole again
after a resume cut it), every new line is a JSON event, and none is older than the last line here: then the whole
merge's order (by time, the operator's lines first) and its lines (each once) are events.jsonl and these, in order.

Both files are read a line at a time (`_lines`) and the lines sorted through a spill file (`SpillSort`), so what the
site's grew by can be more than memory holds (days without a `status`).
"""

from __future__ import annotations

import codecs
import json
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TextIO

from rlctl.launch.jobdir import event_time
from rlctl.launch.spillsort import Row, SpillSort

MARK = ".site-events.merged"  # beside events.jsonl: "<inode> <size> <site copy's inode> <its size>" after a merge
TAIL_READ_BYTES = 1 << 20  # events.jsonl is read from its end in pieces of at least this many bytes
READ_BYTES = 1 << 16  # either file is read this many bytes at a time
LINE_MAX_CHARS = 1 << 20  # a line longer than this is not held (`_lines`); an event is ≈ 200


def tail(local: Path, mirror: Path, out: TextIO) -> bool:
    """Write to `out` (`local`, events.jsonl, open to append) the lines that merge `mirror` (the site's events as
    fetched) into it, and say True; False, with nothing written, where the whole merge is needed (see the module's
    docstring). What is written, as the tail that read it all at once wrote it (a property test holds it to that):

    - The site's new lines: `mirror` from where the last merge left it (`MARK`) to its end, read as UTF-8 (a byte
      that is no UTF-8: False) and split as str.splitlines splits; a line of whitespace only left out, any other
      a JSON object (else False; an object without a usable time is at 0, as `event_time` reads it).
    - `local`'s lines from its end back to the last before the earliest of those (`open_record`'s way: a byte
      that is no UTF-8 as U+FFFD), each a JSON object (else False, whitespace only too).
    - The new lines that are not among those, each with a newline, by time (at one time in their order), where
      none is older than `local`'s last line (else False); nothing (True) where there is none.

    A line longer than LINE_MAX_CHARS, in either file, is not held: one of whitespace only is what a short one is,
    any other is taken for a line that is no JSON event (False: the whole merge's to read), versus read whole (a
    100 MB line cut short or of garbage: 100 MB held, three times) and parsed (an object of MBs: appended).

    Held: about `spillsort.BUDGET_BYTES` of rows (the rest in an unnamed file beside `local`), a line and a piece
    of the file being read, and `local`'s lines of the time being written (events at one time are few); versus the
    whole growth at once, as bytes, text, lines and parsed rows (≈ 6× it: a GB after days without a `status`)."""
    try:
        li, ls, mi, ms = (int(x) for x in (local.parent / MARK).read_text().split())
        here, there = local.stat(), mirror.stat()
    except (OSError, ValueError):
        return False
    if (here.st_ino, here.st_size, there.st_ino) != (li, ls, mi) or there.st_size < ms:
        return False
    with tempfile.TemporaryFile(dir=local.parent) as spill:  # unnamed: gone with this merge, or its process
        rows = SpillSort(spill)
        since = _grown(mirror, ms, rows)
        if since is None:
            return False
        if since == math.inf:  # no event: nothing to append
            return True
        last = _held_since(local, since, rows)
        return last is not None and _write_fresh(rows.rows(), last, out)


def mark(local: Path, mirror: Path) -> None:
    """Note what a merge left: `local` and `mirror` as they are now (`tail` reads on from here)."""
    here, there = local.stat(), mirror.stat()
    (local.parent / MARK).write_text(f"{here.st_ino} {here.st_size} {there.st_ino} {there.st_size}\n")


def _time(line: str) -> float | None:
    """A JSON event's time, as `event_time` reads it and the whole merge sorts by it (0 where it has no usable one:
    missing, null, text); None when the line is not a JSON object."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return event_time(row) if isinstance(row, dict) else None


def _grown(mirror: Path, start: int, rows: SpillSort) -> float | None:
    """The events `mirror` holds past byte `start` added to `rows` (side 1, in their order), and the earliest time
    among them (inf where there is none); None where a line is no JSON event or a byte no UTF-8 (see `tail`)."""
    since = math.inf
    with mirror.open("rb") as f:
        f.seek(start)
        try:
            for n, line in enumerate(_lines(f, errors="strict")):
                if line is None:  # past LINE_MAX_CHARS: the whole merge's to read
                    return None
                if not line.strip():
                    continue
                t = _time(line)
                if t is None:  # not a JSON event: the whole merge sets it aside, once
                    return None
                rows.add((t, 1, n, line))
                since = min(since, t)
        except UnicodeDecodeError:
            return None
    return since


def _held_since(path: Path, since: float, rows: SpillSort) -> float | None:
    """The lines at the end of `path` (sorted by time: a merge wrote it) whose time is `since` or later added to
    `rows` (side 0), and the time of its last line (-inf when it has none); read from its end, as far back as they
    go. None when a line read is not a JSON event."""
    size = path.stat().st_size
    want = TAIL_READ_BYTES
    with path.open("rb") as f:
        while True:
            start = max(0, size - want)
            stop, bad, last, end = _scan(f, start, since)
            if bad:
                return None
            if stop >= 0 or start == 0:
                break
            want *= 4
        for n, line in enumerate(_piece(f, start, end)):
            if n > stop:
                t = None if line is None else _time(line)
                assert line is not None and t is not None, "_scan read each as a JSON event"
                rows.add((t, 0, n, line))
    return last


def _scan(f: IO[bytes], start: int, since: float) -> tuple[int, bool, float, int]:
    """Over the lines of the file `f` from byte `start` to its end (`_piece`): the index of the last whose time is
    before `since` (-1: none), whether a line after it is no JSON event, the time of the last line (-inf: none), and
    where the file ended."""
    stop, bad, last = -1, False, -math.inf
    for n, line in enumerate(_piece(f, start, None)):
        t = None if line is None else _time(line)
        if t is None:
            bad = True
            continue
        last = t
        if t < since:
            stop, bad = n, False
    return stop, bad, last, f.tell()


def _piece(f: IO[bytes], start: int, end: int | None) -> Iterator[str | None]:
    """The lines of the file `f` from byte `start` to `end` (its end where None), as `open_record` reads them, the
    first left out where `start` is past the file's start (cut by it)."""
    f.seek(start)
    lines = _lines(f, errors="replace", end=end)
    if start > 0:
        next(lines, None)
    return lines


def _write_fresh(rows: Iterator[Row], last: float, out: TextIO) -> bool:
    """The site's rows (side 1) that are not among the operator's (side 0) of their time written to `out`, sorted;
    False, nothing written, where the earliest is older than `last`."""
    at: float | None = None  # the time of the rows last read
    mine: set[str] = set()  # the operator's lines of that time
    wrote = False
    for t, side, _, line in rows:
        if t != at:
            at, mine = t, set()
        if side == 0:
            mine.add(line)
        elif line not in mine:
            if not wrote and t < last:
                return False
            wrote = True
            out.write(line + "\n")
    return True


def _lines(f: IO[bytes], *, errors: str, end: int | None = None) -> Iterator[str | None]:
    """The lines of the file `f` from where it is to its end (or byte `end`), as
    `f.read().decode("utf-8", errors).splitlines()` has them, read READ_BYTES at a time (UnicodeDecodeError where
    `errors` is "strict" and a byte is no UTF-8). A line longer than LINE_MAX_CHARS is not held: it comes as "" where
    it is whitespace only, else as None."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors)
    head = ""  # a line begun and not ended by what was read, or a line and its \r (a \n may follow)
    long = blank = False  # whether head's line is past LINE_MAX_CHARS (what it held dropped); whether that was blank
    while True:
        block = f.read(READ_BYTES if end is None else min(READ_BYTES, end - f.tell()))
        parts = (head + decoder.decode(block, final=not block)).splitlines(keepends=True)
        head = parts.pop() if block and parts and (parts[-1][-1] == "\r" or not _ended(parts[-1])) else ""
        for part in parts:
            line = part.splitlines()[0]
            if long or len(line) > LINE_MAX_CHARS:
                yield "" if (blank or not long) and not line.strip() else None
                long = False
            else:
                yield line
        if not block:
            if long:  # the last line, without its line end
                yield "" if blank else None
            return
        if head[-1:] != "\r" and (long or len(head) > LINE_MAX_CHARS):
            long, blank, head = True, (blank or not long) and not head.strip(), ""


def _ended(part: str) -> bool:
    """Whether a piece of text from str.splitlines(keepends=True) ends with its line end."""
    return part.splitlines()[0] != part
