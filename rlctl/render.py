"""Rendering command results: `-o table` for people, `-o json` (stdout only) for programs."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Annotated, Any

import typer
from tabulate import tabulate


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


OutputOpt = Annotated[OutputFormat, typer.Option("--output", "-o", help="table for people, json for programs")]


def emit(data: Any, fmt: OutputFormat, table: Callable[[Any], str]) -> None:
    if fmt is OutputFormat.json:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    else:
        sys.stdout.write(table(data) + "\n")


def grid(rows: Sequence[Sequence[Any]], headers: Sequence[str], title: str | None = None) -> str:
    body = tabulate(rows, headers=list(headers), tablefmt="simple", disable_numparse=True)
    return f"{title}\n{body}" if title else body
