"""The job's held-out evaluation (job field `evaluation`), run by `rlctl launch` in its own process once
the job is done, and merged into summary.json as `heldout`:

    model/init/                       the operator's job dir (built there by launch)
    checkpoints/iter-N/model/         the trainer's site job dir; N = the job's iterations
        │ rlctl.rl.evaluate.compare: greedy, held-out prompts of the digits task
        │ rlctl.rl.evaluate.compare_dataset: greedy, the first rows of a dataset task's `evaluation.path`
        │   (prepared at launch into data-heldout/), scored by the task's reward
        ▼
    summary.json  "heldout": {prompts, greedy_exact_first/last (digits), greedy_reward_first/last, seconds, …}

The final checkpoint is read where launch runs, so the trainer's site must be on this machine's
filesystem (`rlctl check` refuses the field for a site reached over SSH: rlctl.ops.preflight).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.config.job import DatasetTask, DigitsTask, JobFile
from rlctl.errors import LaunchError
from rlctl.launch.backends import read_sites
from rlctl.launch.jobdir import JobDir
from rlctl.launch.sitefs import site_root
from rlctl.models.hf import CONFIG_FILE

log = logging.getLogger(__name__)


def final_model(jobdir: JobDir, spec: JobFile) -> Path:
    """The final checkpoint's model directory, as this machine sees the trainer's site job dir."""
    site = read_sites(jobdir.path)[spec.placement.trainer.site]
    root = Path(site_root(site, jobdir.path.name, here=jobdir.path))
    model = JobDir(root).checkpoint(spec.iterations) / "model"
    if not (model / CONFIG_FILE).exists():
        raise LaunchError(f"no final checkpoint to evaluate: {model / CONFIG_FILE} does not exist")
    return model


def heldout(jobdir: JobDir, spec: JobFile) -> dict[str, Any]:
    """Greedy held-out figures of the starting policy and the final checkpoint (rlctl.rl.evaluate)."""
    from rlctl.rl.evaluate import compare, compare_dataset
    from rlctl.rl.source import HELDOUT_DIR, heldout_task
    from rlctl.rl.tasks import DigitsTask as Digits

    last = final_model(jobdir, spec)
    n = spec.evaluation.heldout_prompts
    if isinstance(spec.task, DatasetTask):
        assert spec.evaluation.path is not None, "preflight refuses a dataset evaluation without a file"
        resolved = jobdir.read_job().task  # its reward file as copied into the job directory (ops.inputs)
        assert isinstance(resolved, DatasetTask)
        task = heldout_task(resolved, spec.evaluation.path)
        figures = compare_dataset(
            jobdir.init_model, last, task, data_dir=jobdir.path / HELDOUT_DIR, reward_dir=jobdir.path, num_prompts=n
        )
    else:
        assert isinstance(spec.task, DigitsTask), "preflight refuses `evaluation` for other tasks"
        figures = compare(jobdir.init_model, last, Digits(spec.task), num_prompts=n)
    return {**figures, "model_first": str(jobdir.init_model), "model_last": str(last)}


def add_heldout(
    jobdir: JobDir, spec: JobFile, summary: dict[str, Any], *, say: Callable[[str], None]
) -> dict[str, Any]:
    """`summary` with `heldout` (also written to summary.json) when the job asks for it and is done.

    A failed evaluation is recorded as `heldout: {"error": …}` and logged: the job itself finished."""
    n = spec.evaluation.heldout_prompts
    if not n or summary["state"] != "done":
        return summary
    say(f"held-out evaluation: greedy decoding of {n} prompts by the starting and the final policy")
    try:
        figures = heldout(jobdir, spec)
    except LaunchError as e:
        log.warning("held-out evaluation skipped: %s", e)
        figures = {"error": str(e)}
    except Exception as e:  # noqa: BLE001 — the job is done and kept: an evaluation that fails for any reason (a
        # reward file that no longer loads, a checkpoint that does not fit the GPU) is noted, not raised
        log.warning("held-out evaluation failed: %s: %s", type(e).__name__, e)
        figures = {"error": f"{type(e).__name__}: {e}"}
    record = jobdir.read_json(jobdir.summary_json)
    record["heldout"] = figures
    jobdir.write_json(jobdir.summary_json, record)
    return {**summary, "heldout": figures}


def heldout_line(h: dict[str, Any]) -> str:
    """The summary table's row: greedy exact match and reward, starting → final policy."""
    if "error" in h:
        return f"not evaluated: {h['error']}"
    line = f"reward {h['greedy_reward_first']:.3f} → {h['greedy_reward_last']:.3f} (greedy, {h['prompts']} prompts)"
    if "greedy_exact_first" not in h:  # a dataset task: its reward function's figures only
        return line
    return f"exact {h['greedy_exact_first']:.3f} → {h['greedy_exact_last']:.3f}, {line}"
