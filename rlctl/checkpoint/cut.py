"""A resume's cut of the job's logs back to its checkpoint: the rows a log keeps, streamed as the file is read
(`cut_rows`), and the rows past the checkpoint appended to <name>.discarded.jsonl beside it (`append_discarded`),
on disk before the log loses them — one way for every log a resume cuts.

    launch --resume v ─▶ cut_metrics(v)     = cut_rows(metrics.jsonl, iteration < v)  ─▶ each row kept ─▶ RowBook
                      ─▶ cut_evaluations(v) = cut_rows(evaluations.jsonl, version ≤ v) ─▶ each row kept ─▶ Evaluator
                      ─▶ SampleLog.cut(v's samples_log_bytes)
                      each: the rest ─▶ append_discarded ─▶ <name>.discarded.jsonl (synced, its name too) ─▶ log cut
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Generator
from pathlib import Path
from typing import IO, Any

from rlctl.checkpoint.files import fsync_dir
from rlctl.launch.jobdir import JobDir
from rlctl.launch.recordfiles import appending, ends_mid_line

CHUNK_BYTES = 1 << 20  # the lines set aside are copied this much at a time, never held whole


def discarded(path: Path) -> Path:
    """Where a resume moves the rows of the log `path` past its checkpoint: <name>.discarded.jsonl beside it."""
    return path.with_name(f"{path.stem}.discarded.jsonl")


def append_discarded(path: Path, lines: IO[bytes]) -> int:
    """Append `lines` (read to their end), rows of the log `path` past a checkpoint, to its <name>.discarded.jsonl,
    each a line of its own: a file that ends mid-line (a cut that failed as it wrote there: a full disk) gets its
    newline first, and a last line cut short (the log's writer killed as it wrote) gets one after, so that the
    lines the next cut sets aside start lines of their own. Under the lock `appending` takes, and on disk, the
    file's name too, before the caller cuts them from the log: a cut that fails here or dies keeps them in the log,
    read again by the next resume, never in neither file. How many lines were appended."""
    aside = discarded(path)
    count, last = 0, b"\n"
    with appending(aside) as f:
        out = f.buffer
        if ends_mid_line(aside):
            out.write(b"\n")
        while chunk := lines.read(CHUNK_BYTES):
            out.write(chunk)
            count, last = count + chunk.count(b"\n"), chunk[-1:]
        if last != b"\n":
            out.write(b"\n")
            count += 1
        out.flush()
        os.fsync(out.fileno())
    fsync_dir(aside.parent)  # (its name: a file this cut made)
    return count


def cut_rows(
    jobdir: JobDir, path: Path, keep: Callable[[dict[str, Any]], bool]
) -> Generator[dict[str, Any], None, None]:
    """Keep the rows of the jsonl file `path` that `keep` accepts, each yielded as the file is read; move the others
    to <name>.discarded.jsonl beside it (`append_discarded`) once the file is read to its end. The file is read a row
    at a time into temporary files beside it (the rows kept, the rows set aside), so that nothing but one row is
    held; a line that does not parse (`read_lines`: LaunchError naming it), or a reader that stops before the end
    (the generator closed, or never read), leaves both files as they were."""
    if not path.exists():
        return
    tmp, away = path.with_name(f".{path.name}.tmp"), path.with_name(f".{discarded(path).name}.tmp")
    moved = 0
    try:
        with tmp.open("w") as out:
            with away.open("w") as off:
                for r in jobdir.iter_lines(path):
                    if keep(r):
                        out.write(json.dumps(r) + "\n")
                        yield r
                    else:
                        off.write(json.dumps(r, default=str) + "\n")
                        moved += 1
            if moved:
                with away.open("rb") as rows:
                    append_discarded(path, rows)
            out.flush()
            os.fsync(out.fileno())  # else a power loss after the rename can leave the file empty: every row before
            # the checkpoint, which `sync_logs` made durable, lost for good
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        away.unlink(missing_ok=True)
    tmp.replace(path)
    fsync_dir(path.parent)
