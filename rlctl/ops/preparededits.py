"""What a resume refuses of job.json's edits to a dataset job's prepared data (`refuse_prepared_edits`, called by
`rlctl.ops.jobchanges.refuse_fixed_edits`): data/ and data-heldout/ are tokenized once, at the launch
(`rlctl.ops.inputs.prepare_data`), and every run of the job, resumed or not, reads them as they are.

    job.json `launched` (PREPARED_FIELDS at the launch) ──vs── job.json `job` now
        task.path, keys, templates, max_prompt_tokens, bad_rows, evaluation.path differ ──▶ refused (one line)
            unless the path names the very file moved (its SHA-256 the prepared one's) ──▶ taken
        evaluation.heldout_prompts > 0, no data-heldout/ ──▶ refused; else the run's count ──▶ taken
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlctl.errors import UsageError
from rlctl.launch.jobdir import JOB_LAUNCHED, LAUNCHED, PREPARED_FIELDS, JobDir, job_field
from rlctl.ops.jobchanges import _job_path, _shown

PREPARED_WHY = "the resumed run reads the data the launch prepared (its {dir}/, tokenized then), not job.json's"


def refuse_prepared_edits(jobdir: JobDir, data: dict[str, Any], job: dict[str, Any]) -> None:
    """UsageError, one line, when job.json's dataset task was edited since the launch in a field its prepared data is
    made of (`PREPARED_FIELDS`: the data file, its keys, templates and prompt bound, the held-out file), which a resume
    never prepares again: the field, its value at the launch and now. Held-out prompts asked of a job launched without
    them (`evaluation.heldout_prompts` above 0, no data-heldout/) likewise: its run failed at its first evaluation;
    a count changed over the held-out rows prepared is the run's to read, and taken, and so is a data file's path
    edited to where the very file moved since (`_same_data`: its SHA-256 the prepared one's). The launch's values as
    `launched` keeps them, else (an rlctl before them) the task's as `job_launched` does; nothing for a field neither
    keeps. Before, each edit was said as 'the resume runs the job as edited' and the run read the launch's data."""
    from rlctl.rl.dataset import MANIFEST_FILE
    from rlctl.rl.source import DATA_DIR, HELDOUT_DIR

    kept, task_kept = data.get(LAUNCHED), data.get(JOB_LAUNCHED)
    launched: dict[str, Any] = kept if isinstance(kept, dict) else {}
    record: dict[str, Any] = task_kept if isinstance(task_kept, dict) else {}

    def was(name: str) -> tuple[bool, Any]:
        if name in launched:
            return True, launched[name]
        top = name.split(".")[0]
        if isinstance(record.get(top), dict):
            return True, job_field(record, name)
        return False, None

    kind_known, kind = was("task.kind")
    if job_field(job, "task.kind") != "dataset" or (kind_known and kind != "dataset"):
        return
    heldout_prepared = (jobdir.path / HELDOUT_DIR / MANIFEST_FILE).is_file()
    asked = job_field(job, "evaluation.heldout_prompts") not in (None, 0)
    for name in PREPARED_FIELDS:
        known, before = was(name)
        now = job_field(job, name)
        if not known or before == now:
            continue
        if name == "evaluation.heldout_prompts" and (heldout_prepared or not asked):
            continue  # that many of the rows prepared (or none asked): the run reads the count as edited
        if name == "evaluation.path" and not asked:
            continue  # no held-out rows read (the evaluation turned off, or never on): the path is read by nothing
        where = HELDOUT_DIR if name.startswith("evaluation.") else DATA_DIR
        if name in ("task.path", "evaluation.path") and _same_data(data, now, jobdir.path / where / MANIFEST_FILE):
            continue  # the file moved, its new place written: the rows prepared are its own
        why = PREPARED_WHY.format(dir=where)
        if name == "evaluation.heldout_prompts":
            why = f"the launch prepared no held-out rows (no {HELDOUT_DIR}/), and a resume prepares none"
        raise UsageError(
            f"{jobdir.job_json}: job.{name} was edited since the launch ({_shown(before)} → {_shown(now)}); a "
            f"resume cannot take it: {why}",
            hint=f"put job.{name} back to {_shown(before)} in job.json, or launch the changed job anew",
        )


def _same_data(data: dict[str, Any], written: Any, manifest: Path) -> bool:
    """Whether the data file `written` (a path of job.json's job file, as `load_job` reads it) is the one the
    dataset prepared under `manifest` was tokenized from (its SHA-256): a file moved since the launch, its path
    edited to where it is now, whose rows the run reads as prepared."""
    from rlctl.rl.dataset_scan import sha256_of

    source = data.get("source_file")
    job_file = source.get("path") if isinstance(source, dict) else data.get("source")
    if not isinstance(written, str) or not isinstance(job_file, str) or not manifest.is_file():
        return False
    path = _job_path(Path(job_file), written)
    try:
        prepared = json.loads(manifest.read_text(encoding="utf-8")).get("source_sha256")
        return path is not None and path.is_file() and sha256_of(path) == prepared
    except (OSError, ValueError, AttributeError):  # unreadable: not known to be the same file
        return False
