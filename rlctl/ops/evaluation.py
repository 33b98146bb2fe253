"""The job's held-out evaluation (job field `evaluation`), run by `rlctl launch` in its own process once
the job is done, and merged into summary.json as `heldout`:

    model/init/                       the operator's job dir (built there by launch)
    checkpoints/iter-N/model/         the trainer's site job dir; N = the job's iterations
        │ rlctl.rl.evaluate.compare: greedy, held-out prompts of the digits task
        │ rlctl.rl.evaluate.compare_dataset: greedy, the first rows of a dataset task's `evaluation.path`
        │   (prepared at launch into data-heldout/), scored by the task's reward
        ▼
    summary.json  "heldout": {prompts, greedy_exact_first/last (digits), greedy_reward_first/last, seconds, …,
                              greedy_reward_first/last_by_source: {data_source: mean} where the rows have several}

The final checkpoint is read where launch runs, so the trainer's site must be on this machine's
filesystem (`rlctl check` refuses the field for a site reached over SSH: rlctl.ops.preflight), unless the job
evaluates during the run (`evaluation.every_iterations`): then the figures are its first and last rows
(evaluations.jsonl, fetched with the job's record; `from_run`), decoded by the rollout units.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.config.job import JobFile
from rlctl.config.task import DatasetTask, DigitsTask
from rlctl.errors import LaunchError
from rlctl.launch.backends import read_sites
from rlctl.launch.jobdir import JobDir, row_count
from rlctl.launch.sitefs import is_remote, site_root
from rlctl.models.hf import CONFIG_FILE
from rlctl.ops.runstate import update_summary
from rlctl.textutil import one_line

log = logging.getLogger(__name__)


def final_model(jobdir: JobDir, spec: JobFile) -> Path:
    """The final checkpoint's model directory, as this machine sees the trainer's site job dir."""
    site = read_sites(jobdir.path)[spec.placement.trainer.site]
    root = Path(site_root(site, jobdir.id, here=jobdir.path))
    model = JobDir(root).checkpoint(spec.iterations) / "model"
    if not (model / CONFIG_FILE).exists():
        raise LaunchError(f"no final checkpoint to evaluate: {model / CONFIG_FILE} does not exist")
    return model


def from_run(jobdir: JobDir, spec: JobFile) -> dict[str, Any]:
    """The held-out figures of the run's first and last evaluations (its last version's must be there), with the
    versions that decoded each. A row whose version is no number (null, text: an edited file) is passed over, as
    `row_count` reads one; a field a first or last row lacks or has no number for (an older version's row, an edited
    one) is left out, as are a figure's first and last where either row lacks it."""
    numbered = [(v, r) for r in jobdir.read_lines(jobdir.evaluations) if (v := row_count(r.get("version"))) is not None]
    rows = [r for _, r in sorted(numbered, key=lambda vr: vr[0])]
    if not rows or rows[-1]["version"] != spec.iterations:
        raise LaunchError(f"the run did not evaluate its last version v{spec.iterations} (see {jobdir.events})")
    first, last = rows[0], rows[-1]
    out: dict[str, Any] = {"source": "during the run", "evaluations": len(rows)}
    if (prompts := row_count(last.get("prompts"))) is not None:
        out["prompts"] = prompts
    for name in ("greedy_exact", "greedy_reward"):
        if _figure(first.get(name)) and _figure(last.get(name)):
            out |= {f"{name}_first": first[name], f"{name}_last": last[name]}
    key = "greedy_reward_by_source"  # (a mixed job's rows: its first and last per data_source)
    if isinstance(first.get(key), dict) and isinstance(last.get(key), dict):
        out |= {
            f"greedy_reward_{which}_by_source": {k: v for k, v in r[key].items() if _figure(v)}
            for which, r in (("first", first), ("last", last))
        }
    # (a row holds `reward_failures` only where some failed: the first's too, where the last's had none; one
    # evaluation, first and last alike, counted once; a null or text count, from an edited row, as none)
    if failed := sum(row_count(r.get("reward_failures")) or 0 for r in ([first, last] if len(rows) > 1 else [last])):
        out["reward_failures"] = failed
    for which, r in (("first", first), ("last", last)):
        if versions := _versions(r.get("versions")):
            out[f"versions_{which}"] = versions
    return out


def _figure(v: Any) -> bool:
    """Whether a row's figure is a number (not missing, null, text or a bool: an older version's row, an edited one)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _versions(v: Any) -> list[int] | None:
    """A row's `versions` (those that decoded it) as ints; None where it has none, or one of them is no number."""
    got = [row_count(x) for x in v] if isinstance(v, list) else []
    return [x for x in got if x is not None] if got and None not in got else None


def heldout(jobdir: JobDir, spec: JobFile) -> dict[str, Any]:
    """Greedy held-out figures of the starting policy and the final checkpoint (rlctl.rl.evaluate); of the run's
    own evaluations when the trainer's site is reached over SSH (`from_run`)."""
    from rlctl.rl.evaluate import compare, compare_dataset
    from rlctl.rl.source import HELDOUT_DIR, heldout_task
    from rlctl.rl.tasks import DigitsTask as Digits

    if spec.evaluation.every_iterations and is_remote(read_sites(jobdir.path)[spec.placement.trainer.site]):
        return from_run(jobdir, spec)
    last = final_model(jobdir, spec)
    n = spec.evaluation.most_prompts  # (`all`: the file's rows, compare_dataset takes the fewer)
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
    say(f"held-out evaluation: {n} prompts decoded greedily by the starting and the final policy")
    try:
        figures = heldout(jobdir, spec)
    except LaunchError as e:
        log.warning("held-out evaluation skipped: %s", e)
        figures = {"error": str(e)}
    except Exception as e:  # noqa: BLE001 — the job is done and kept: an evaluation that fails for any reason (a
        # reward file that no longer loads, a checkpoint that does not fit the GPU) is noted, not raised
        log.warning("held-out evaluation failed: %s: %s", type(e).__name__, e)
        figures = {"error": f"{type(e).__name__}: {e}"}
    # (its run's summary.json as every command reads it: one that does not read is its run's end from the events)
    try:
        recorded = update_summary(jobdir, summary.get("run"), {"heldout": figures})
    except (LaunchError, OSError) as e:  # (a summary lock that cannot be opened; a damaged summary, its run's end not
        # in the events): the figures are the run's end's secondary part, said with the summary all the same, versus
        # the launch of a finished job ending on this error, exit 1, its summary unprinted
        hint = getattr(e, "hint", None)
        log.warning("held-out figures not recorded in the summary here: %s%s", e, f" (hint: {hint})" if hint else "")
    else:
        if recorded is None:
            log.warning(
                "%s holds no summary of this run: its held-out figures are not recorded there", jobdir.summary_json
            )
    return {**summary, "heldout": figures}


def heldout_line(h: dict[str, Any]) -> str:
    """The summary table's row: greedy exact match and reward, starting → final policy."""
    if "error" in h:
        return f"not evaluated: {h['error']}"
    n = f", {h['prompts']} prompts" if "prompts" in h else ""  # (a figure the run's rows lacked: left out)
    line = f"reward {_fig(h.get('greedy_reward_first'))} → {_fig(h.get('greedy_reward_last'))} (greedy{n}"
    if h.get("source") == "during the run":  # the rollout units' evaluations: the versions that decoded them
        line += ", during the run"
        if "versions_first" in h and "versions_last" in h:
            line += f": v{_span(h['versions_first'])} → v{_span(h['versions_last'])}"
    line += ")"
    if h.get("reward_failures"):  # else the figures read as the policies' own: `reward_on_error` is a score too
        calls = f" of its {h['prompts'] * (1 if h.get('evaluations') == 1 else 2)}" if "prompts" in h else ""
        line += f"; {h['reward_failures']}{calls} reward calls failed, scored task.reward_on_error"
    first, last = h.get("greedy_reward_first_by_source"), h.get("greedy_reward_last_by_source")
    if isinstance(first, dict) and isinstance(last, dict):  # a mean over mixed datasets hides one that regresses
        line += "; by data_source: " + ", ".join(
            f"{src} {_fig(first.get(src))} → {_fig(last.get(src))}" for src in sorted(first.keys() | last.keys())
        )
    if "greedy_exact_first" not in h:  # a dataset task: its reward function's figures only
        return line
    return f"exact {h['greedy_exact_first']:.3f} → {h['greedy_exact_last']:.3f}, {line}"


def by_source_lines(evaluations: list[dict[str, Any]]) -> list[str]:
    """One short line per data_source of a mixed job's held-out evaluations during the run (`evaluations`, sorted by
    version; rows of 2+ sources): its greedy reward at the first and the last evaluation that has it, as `rlctl
    report` writes them below its table (a mean over GSM8K and MATH hides one regressing). A figure that is no
    number (an edited row) is shown as it is."""
    seen: dict[str, list[tuple[Any, Any]]] = {}
    for e in evaluations:
        if isinstance(by := e.get("greedy_reward_by_source"), dict) and len(by) > 1:
            for src, x in by.items():
                seen.setdefault(str(src), []).append((e.get("version"), x))

    def fig(x: Any) -> str:
        return f"{x:.4f}" if isinstance(x, int | float) and not isinstance(x, bool) else str(x)

    return [  # (a source as the rows wrote it, its line breaks and control characters escaped; the report escapes
        # each line's HTML)
        one_line(
            f"{src}: greedy reward {fig(xs[0][1])} at v{xs[0][0]} → {fig(xs[-1][1])} at v{xs[-1][0]} "
            f"({len(xs)} evaluation{'s' if len(xs) > 1 else ''})"
        )
        for src, xs in sorted(seen.items())
    ]


def _fig(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}"


def _span(versions: list[int]) -> str:
    return str(versions[0]) if versions[0] == versions[-1] else f"{versions[0]}–{versions[-1]}"
