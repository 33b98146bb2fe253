"""`Problem`: one reason `rlctl check` / `launch` refuses a job, the field it names and what to do."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    field: str
    message: str
    hint: str | None = None
    file: str | None = None  # the file that holds the field, where not the job file (a site's inventory file)
