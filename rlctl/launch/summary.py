"""A run's summary.json in a job dir: what it holds (`read_summary`: the summary, or what is wrong with a file that
does not read, one rule for the launcher's repair and a fetch of the controller's copy), written whole
(`write_summary`), and a damaged one replaced (`replace_damaged`)::

    summary.json (damaged) ──copied──▶ summary.json.damaged[.n]     kept whole, first
    repair ──written under a temporary name──▶ renamed over summary.json   a reader finds the damaged file or the
                                                                          repair, never none
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from rlctl.launch.recordfiles import record_text, replace_text


def parse_summary(text: str) -> tuple[dict[str, Any] | None, str]:
    """(the summary `text` holds, "") where it reads as a JSON object, else (None, what is wrong with it)."""
    try:
        summary = json.loads(text)
    except ValueError as e:  # JSONDecodeError
        return None, f"not valid JSON ({e})"
    if not isinstance(summary, dict):
        return None, f"not a JSON object but {type(summary).__name__}"
    return summary, ""


def read_summary(path: Path) -> tuple[dict[str, Any] | None, str] | None:
    """`parse_summary` of the file `path` (read as `record_text` reads the job's record); None where there is none."""
    try:
        return parse_summary(record_text(path))
    except FileNotFoundError:
        return None


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    """`summary` written whole at `path` (renamed into place)."""
    replace_text(path, json.dumps(summary, indent=2, default=str) + "\n")


def damaged_aside(path: Path) -> Path:
    """Where a record file that does not read is kept: `<name>.damaged`, else the first free `<name>.damaged.<n>`."""
    names = itertools.chain([f"{path.name}.damaged"], (f"{path.name}.damaged.{n}" for n in itertools.count(2)))
    return next(p for name in names if not (p := path.with_name(name)).exists())


def replace_damaged(path: Path, repair: dict[str, Any], *, problem: str) -> tuple[Path, dict[str, Any]]:
    """The summary.json at `path`, which does not read (`problem`), kept whole aside (`damaged_aside`) and `repair`
    written in its place, saying where (`summary_damaged`); (where it is kept, what was written). The damaged file is
    copied, then the repair renamed over it, versus the file moved aside first: a reader in between (`rlctl status`,
    a run's `wait`) found no summary, its run's end unknown. The copy is made exclusively: an aside name taken
    meanwhile is not written over (FileExistsError)."""
    aside = damaged_aside(path)
    with aside.open("xb") as f:
        f.write(path.read_bytes())
    written = {**repair, "summary_damaged": f"{path}: {problem}; kept as {aside.name}"}
    write_summary(path, written)
    return aside, written
