"""Rendering command results: `-o table` for people, `-o json` (stdout only) for programs."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Annotated, Any

import typer
from tabulate import tabulate

from rlctl.errors import RlctlError


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


OutputOpt = Annotated[OutputFormat, typer.Option("--output", "-o", help="table for people, json for programs")]


def emit(data: Any, fmt: OutputFormat, table: Callable[[Any], str]) -> None:
    write_out(json.dumps(data, indent=2, default=str) if fmt is OutputFormat.json else table(data))


WRITE_PIECE = 1 << 16  # characters of stdout written at once (`write_out`)


def stdout_closed() -> RlctlError:
    return RlctlError("stdout is closed: nothing can be written", hint="redirect it instead, e.g. > /dev/null")


class ClosedStdout(io.TextIOBase):
    """`sys.stdout` where rlctl started with none (`rlctl --help >&-`; rlctl.cli.main puts it there): a write says
    so. Python's None in its place was said by `write_out` only; rich, printing typer's help, wrote to nothing: exit 0,
    unsaid."""

    def write(self, s: str) -> int:
        raise stdout_closed()


def write_out(text: str, *, end: str = "\n") -> None:
    """`text` and `end` on stdout, flushed; a stdout that cannot take it is an RlctlError (one line, exit 1)."""
    if sys.stdout is None:  # closed before rlctl started (`rlctl plan job.yaml >&-`): Python has no stdout
        raise stdout_closed()
    text += end
    try:  # in pieces: one write of megabytes into a pipe whose reader left took part of it and raised nothing
        for i in range(0, len(text), WRITE_PIECE):
            sys.stdout.write(text[i : i + WRITE_PIECE])
        sys.stdout.flush()  # here, where a full disk can still be said (at exit Python prints its traceback)
    except BrokenPipeError:
        raise  # a reader gone (`| head`): rlctl.cli ends quietly with 141
    except OSError as e:  # `> /dev/full`, a full disk
        raise RlctlError(f"cannot write the output to stdout: {e.strerror or e}") from e


def grid(rows: Sequence[Sequence[Any]], headers: Sequence[str], title: str | None = None) -> str:
    body = tabulate(rows, headers=list(headers), tablefmt="simple", disable_numparse=True)
    return f"{title}\n{body}" if title else body


def reward_failures_line(r: dict[str, Any]) -> str | None:
    """The reward calls scored `task.reward_on_error` (raised, timed out, returned no finite number, their worker
    died), when there were any: without it a job whose every reward call failed ended `done` with reward 0 → 0 and
    nothing said why."""
    kinds = {
        "raised": r.get("errors", 0),
        "timed out": r.get("timeouts", 0),
        "wrong type": r.get("bad_type", 0),
        "died with their worker": r.get("died", 0),  # (counted under "raised" before: a segfault said as an exception)
    }
    failed = sum(kinds.values())
    if not failed:
        return None
    why = ", ".join(f"{n} {k}" for k, n in kinds.items() if n)
    calls = r.get("calls", failed)
    first = f"; the first: {r['first_failure']}" if r.get("first_failure") else ""
    return f"{failed} of {calls} calls scored task.reward_on_error ({why}){first}; each in the controller's log"
