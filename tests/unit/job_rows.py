"""A job's index row, put as a launcher leaves it (in the test's $RLCTL_HOME index)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlctl.ops.jobdb import JobDB, JobRow


def indexed_row(name: str, job_dir: Path, *, job: str, **update: Any) -> JobRow:
    """Row `name` for the job `job` in `job_dir`, `launching` as `put` writes it, then `update`d (state, info)."""
    db = JobDB()
    try:
        db.put(name, job_dir=str(job_dir), spec={"name": job})
        if update:
            db.update(name, **update)
        return db.get(name)
    finally:
        db.close()
