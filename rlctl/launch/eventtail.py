"""The merge of the controller site's events into the operator's events.jsonl, by what the site's grew: its new lines
appended, where that is what the whole merge (`record._merge_lines`: both files read, parsed, sorted and written
again) would write, so that a `rlctl status` of a job of weeks reads the events that arrived, not every event of
the job (64 units a weight version each, 10⁴ versions: 640,000 lines, ≈ 130 MB, read twice and written again at
each status).

    fetch_record ─▶ .site-events.jsonl grew ─▶ tail(events, mirror) ─┬─ the new lines ─▶ appended to events.jsonl
                                                                      └─ None ─▶ the whole merge
                  ─▶ mark(events, mirror): .site-events.merged says what the merge left (each file's inode, size)

The new lines are appended only where events.jsonl is as the last merge left it (its inode and size: nothing
appended here since), the site's copy grew in place past what that merge read (its inode: not fetched whole again
after a resume cut it), every new line is a JSON event, and none is older than the last line here: then the whole
merge's order (by time, the operator's lines first) and its lines (each once) are events.jsonl and these, in order.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlctl.launch.jobdir import event_time

MARK = ".site-events.merged"  # beside events.jsonl: "<inode> <size> <site copy's inode> <its size>" after a merge
TAIL_READ_BYTES = 1 << 20  # events.jsonl is read from its end in pieces of at least this many bytes


def tail(local: Path, mirror: Path) -> str | None:
    """The lines to append to `local` (events.jsonl) that merge `mirror` (the site's events as fetched) into it, or
    None where the whole merge is needed (see the module's docstring)."""
    try:
        li, ls, mi, ms = (int(x) for x in (local.parent / MARK).read_text().split())
        here, there = local.stat(), mirror.stat()
    except (OSError, ValueError):
        return None
    if (here.st_ino, here.st_size, there.st_ino) != (li, ls, mi) or there.st_size < ms:
        return None
    with mirror.open("rb") as f:
        f.seek(ms)
        data = f.read()
    try:
        new = data.decode().splitlines()
    except UnicodeDecodeError:
        return None
    rows = []
    for line in new:
        if not line.strip():
            continue
        t = _time(line)
        if t is None:  # not a JSON event: the whole merge sets it aside, once
            return None
        rows.append((t, line))
    if not rows:
        return ""
    held = _lines_since(local, min(t for t, _ in rows))
    if held is None:
        return None
    lines, last = held
    fresh = [(t, i, line) for i, (t, line) in enumerate(rows) if line not in lines]
    if fresh and min(t for t, _, _ in fresh) < last:
        return None
    return "".join(line + "\n" for _, _, line in sorted(fresh))


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


def _lines_since(path: Path, since: float) -> tuple[set[str], float] | None:
    """The lines at the end of `path` (sorted by time: a merge wrote it) whose time is `since` or later, and the
    time of its last line (-inf when it has none); read from its end, as far back as they go. None when a line read
    is not a JSON event."""
    size = path.stat().st_size
    want = TAIL_READ_BYTES
    while True:
        start = max(0, size - want)
        with path.open("rb") as f:
            f.seek(start)
            lines = f.read().decode(errors="replace").splitlines()  # (a character cut by the start: its line goes)
        if start > 0:
            lines = lines[1:]  # (cut by the start)
        found: set[str] = set()
        last = float("-inf")
        for line in reversed(lines):
            t = _time(line)
            if t is None:
                return None
            if last == float("-inf"):
                last = t
            if t < since:
                return found, last
            found.add(line)
        if start == 0:
            return found, last
        want *= 4
