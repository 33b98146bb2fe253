"""What each of a job's checkpoints holds, to choose one to go back to or to pull (`rlctl status JOB --checkpoints`):

    events.jsonl     the checkpoints it completed (less those set aside or let go: `completed_checkpoints`), when
    metrics.jsonl    the sampled reward of the iterations that made each one (since the checkpoint before it)
    evaluations.jsonl  held-out greedy figures of the versions the run evaluated (`evaluation.every_iterations`)
    summary.json     the held-out figures of the starting and the final policy (`evaluation`, after the job)

Checkpoint v holds the policy after v iterations: the iterations that made it are v_prev + 1 … v (1-based, the
metrics' rows v_prev … v − 1), where v_prev is the checkpoint written before it, kept or not.
"""

from __future__ import annotations

import logging
import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlctl.checkpoint.choose import CHECKPOINT_PARTS, manifest_name, parts_problem
from rlctl.checkpoint.files import PREFIX, sized_manifest
from rlctl.config.inventory import Site
from rlctl.errors import RlctlError, UsageError
from rlctl.launch.jobdir import JobDir
from rlctl.launch.sitefs import HostFiles, Survey, host_files, is_remote
from rlctl.ops.extend import completed_checkpoints, last_summary
from rlctl.ops.surveycache import ManifestCache

log = logging.getLogger(__name__)

FIGURES = ("greedy_exact", "greedy_reward", "prompts")
LAST_CLOCK_S = 253_402_300_800  # 10000-01-01: a time past it (edited by hand) is none; localtime raised on 1e20


def _number(v: Any) -> float | None:
    """A figure of a record, or None where it is none (missing, null, edited into text)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


@dataclass(frozen=True)
class PartDir:
    """Where one part of a job's checkpoints is: its site, the view of it (a host) that holds them, and the
    checkpoints/ directory in that view."""

    site_name: str
    site: Site
    view: str
    dir: str


def surveyed(
    parts: dict[str, PartDir],
    versions: list[int],
    *,
    views: Mapping[tuple[str, str], HostFiles] | None = None,
    cache: Path | None = None,
) -> tuple[dict[str, Survey], dict[str, str]]:
    """Each part's checkpoint directories of `versions` looked at (`HostFiles.survey`: the files' sizes and the
    manifests' bytes), once per site view and directory (both parts in one job dir: one look) — over SSH one
    command, whatever the number of checkpoints and files, versus one per file or none; and why a part on a site
    that did not answer was not (the table is listed all the same, said under it). A checkpoints/ directory not here
    (a shared filesystem not mounted on this machine, a site job dir removed) is not looked in: nothing to check
    there, not every checkpoint missing. `views`: (site name, view) → that view open already, the caller's (a pull's
    on the trainer's site: its one connection there, left open), versus one opened and closed here. `cache`: where the
    manifests read over SSH are kept (`JobDir.manifest_cache`): a site sends those new or changed since the last look
    only (`ManifestCache`), versus every checkpoint's again."""
    dirs = [f"{PREFIX}{v}" for v in versions]
    seen: dict[str, Survey] = {}
    why: dict[str, str] = {}
    places: dict[tuple[str, str, str], list[str]] = {}
    kept = ManifestCache.load(cache) if cache is not None and any(is_remote(at.site) for at in parts.values()) else None
    for part, at in parts.items():
        places.setdefault((at.site_name, at.view, at.dir), []).append(part)
    for (site_name, view, root), group in places.items():
        site = parts[group[0]].site
        if not is_remote(site) and not Path(root).is_dir():
            continue
        opened = (views or {}).get((site_name, view))
        fs = opened or host_files(site, view)
        try:
            if kept is not None and is_remote(site):
                got = kept.survey(fs, (site_name, view, root), dirs, read=manifest_name("*"))
            else:  # (this machine's files: read as cheaply as stamped)
                got = fs.survey(root, dirs, read=manifest_name("*"))
        except (RlctlError, OSError) as e:  # a site that does not answer: its parts not checked, said why
            log.info("checkpoints' manifests on site %s (%s) not checked: %s", site_name, view, e)
            why |= dict.fromkeys(group, f"site {site_name} did not answer: {e}")
            continue
        finally:
            if opened is None:
                fs.close()
        if got.found:
            seen |= dict.fromkeys(group, got)
        elif is_remote(site):
            why |= dict.fromkeys(group, f"site {site_name} holds no {root} on {view}")
    if kept is not None:
        kept.save()
    return seen, why


def lost_dir(jobdir: JobDir, at: PartDir) -> str | None:
    """ "DIR is missing" (or "is not a directory") where a part's checkpoints/ directory is the job dir's own (a local
    launch's: this machine is where they are) and is not one: lost (removed, moved), versus a directory elsewhere
    this machine may not have (a shared filesystem not mounted here: `surveyed` does not look); else None."""
    root = Path(at.dir)
    if is_remote(at.site) or root.is_dir() or root.resolve() != jobdir.checkpoints.resolve():
        return None
    return f"{root} {'is not a directory' if root.exists() else 'is missing'}"


def checkpoint_table(
    jobdir: JobDir,
    *,
    parts: dict[str, PartDir] | None = None,
    views: Mapping[tuple[str, str], HostFiles] | None = None,
) -> dict[str, Any]:
    """The job's complete checkpoints, oldest first, each with when it was written, the mean sampled reward of the
    iterations that made it, and its held-out figures where the job evaluated that version; and the starting
    policy's held-out figures. `parts`: where each part's checkpoints are (`rlctl.ops.pull.checkpoint_parts`),
    whose manifests are checked there (`surveyed`, `sound`); "latest" is the newest checkpoint that passes, versus
    the newest the events name (a damaged one listed as the latest, which a pull passed over). A part not checked is
    left out of "manifests_checked", and where a site did not answer, "manifests_unchecked" says why; "dirs_lost" says
    which part's checkpoints/ directory is gone from where it is on this machine (`lost_dir`: each checkpoint
    damaged). `views`: as `surveyed` takes them."""
    versions = completed_checkpoints(jobdir)
    checked, unchecked = surveyed(parts or {}, versions, views=views, cache=jobdir.manifest_cache)
    lost = {part: why for part, at in (parts or {}).items() if versions and (why := lost_dir(jobdir, at))}
    checked |= dict.fromkeys(lost, Survey(found=False, sizes={}, texts={}))  # looked at: none of their files there
    damaged = {v: why for v in versions if (why := sound(checked, v)) is not None}
    latest = max((v for v in versions if v not in damaged), default=None)
    written: dict[int, float | None] = {}
    for e in jobdir.read_events("checkpoint"):  # the last write of a version (a roll-back writes it again)
        if isinstance(e.get("version"), int):
            written.setdefault(e["version"], None)
            if (t := _number(e.get("t"))) is not None and 0 <= t < LAST_CLOCK_S:
                written[e["version"]] = t
    # the logs a row at a time (`iter_lines`), only each row's figure kept: metrics.jsonl holds a row per iteration
    # (10⁵ after weeks, each a few kB with its agents: hundreds of MB), which `read_lines` held whole, text and rows
    reward: dict[int, float] = {}
    for r in jobdir.iter_lines(jobdir.metrics):
        if isinstance(r.get("iteration"), int) and (x := _number(r.get("reward_mean"))) is not None:
            reward[r["iteration"]] = x
    evaluated: dict[int, dict[str, Any]] = {}
    for r in jobdir.iter_lines(jobdir.evaluations):
        if isinstance(r.get("version"), int):
            evaluated[r["version"]] = {k: r[k] for k in FIGURES if _number(r.get(k)) is not None}
    summary = last_summary(jobdir)
    end: dict[str, Any] = summary["heldout"] if isinstance(summary.get("heldout"), dict) else {}
    if (
        "greedy_reward_last" in end
        and end.get("source") != "during the run"
        and isinstance(summary.get("iterations"), int)
    ):
        # the evaluation after the job: its starting policy (v0) and its final checkpoint
        evaluated.setdefault(0, _after(end, "first"))
        evaluated[summary["iterations"]] = _after(end, "last")
    rows = []
    every = sorted(written)
    for v in versions:
        since = max((w for w in every if w < v), default=0)
        got = [reward[i] for i in range(since, v) if i in reward]
        rows.append(
            {
                "version": v,
                "written_at": written.get(v),
                "iterations": [since + 1, v],
                "reward_mean": round(sum(got) / len(got), 4) if got else None,
                "reward_iterations": len(got),
                "heldout": evaluated.get(v),
                "latest": v == latest,
                "damaged": damaged.get(v),
            }
        )
    return {
        "checkpoints": rows,
        "heldout_start": evaluated.get(0),
        "manifests_checked": sorted(checked),
        "manifests_unchecked": unchecked,
        "dirs_lost": sorted(set(lost.values())),
    }


def sound(parts: dict[str, Survey], version: int) -> str | None:
    """Why checkpoint `version`'s parts in `parts` (part → what a look at its checkpoints/ directory saw: `surveyed`)
    do not pass the cheap check (`sized_manifest`: each manifest parses and names its part and version, each file it
    lists is there at its size; the controller's names the trainer's), or None. No file's SHA-256 is taken: a status
    reads a few small manifests, not a model's gigabytes; a pull or a resume verifies every byte of what it takes."""
    order = sorted(parts, key=lambda part: part != "trainer")
    return parts_problem(order, lambda part: sized_manifest(parts[part], f"{PREFIX}{version}", part, version=version))


def unchecked_line(checked: list[str], why: dict[str, str] | None = None) -> str | None:
    """The lines under a checkpoints table (`status --checkpoints`, `report`) naming the parts whose manifests were
    not checked (`checkpoint_table`'s "manifests_checked" lacks them): why, where a site did not answer (its
    "manifests_unchecked"), else as not on this machine; None where both were."""
    why = why or {}
    unchecked = [p for p in CHECKPOINT_PARTS if p not in checked and p not in why]
    lines = [
        f"the {p} part's manifests not checked ({why[p]}): a pull or a resume verifies every file"
        for p in CHECKPOINT_PARTS
        if p in why
    ]
    if unchecked:
        parts = " and ".join(unchecked) + (" parts'" if len(unchecked) > 1 else " part's")
        lines.append(
            f"the {parts} manifests not checked here (their site's files are not on this machine): a pull or a resume "
            "verifies every file"
        )
    return "\n".join(lines) or None


def _after(heldout: dict[str, Any], which: str) -> dict[str, Any]:
    """One policy's figures of the evaluation after the job (`summary.json` `heldout`: `greedy_reward_first`, …)."""
    out = {k: heldout[f"{k}_{which}"] for k in FIGURES[:2] if _number(heldout.get(f"{k}_{which}")) is not None}
    return out | ({"prompts": heldout["prompts"]} if _number(heldout.get("prompts")) is not None else {})


def best_checkpoint(
    jobdir: JobDir,
    *,
    named: str | None = None,
    parts: dict[str, PartDir] | None = None,
    views: Mapping[tuple[str, str], HostFiles] | None = None,
) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
    """The complete checkpoint with the highest held-out greedy reward among those the job evaluated (the newest of
    equal ones) and that pass the check `status --checkpoints` makes (`sound`, of the parts in `parts`), its
    figures, and the rows of those better by their figures that it passed over as damaged (best first), versus the
    best by figures alone (a damaged one, which the pull then refused instead of taking the best sound one);
    UsageError naming what to do where it evaluated none, or every one it evaluated is damaged. `named`: how a command
    names the job, quoted (`JobRef.arg`: its directory where the index lacks it); default its id. `views`: as
    `surveyed` takes them."""
    table = checkpoint_table(jobdir, parts=parts, views=views)["checkpoints"]
    rows = [r for r in table if (r["heldout"] or {}).get("greedy_reward") is not None]
    named = named or shlex.quote(jobdir.id)
    hint = f"`rlctl status {named} --checkpoints` lists them"
    if not table:  # (it said to set evaluation.every_iterations, of a job that sets it)
        when = f"`rlctl status {named} --checkpoints` says when the first comes"
        raise UsageError(f"--checkpoint best: job {jobdir.id} completed no checkpoint yet", hint=when)
    if not rows:
        evaluation = jobdir.read_job().evaluation
        every = evaluation.every_iterations
        versions = ", ".join(f"v{r['version']}" for r in table)
        # (it said "set evaluation.heldout_prompts and every_iterations" of a job that set the one: which
        # every_iterations, the checkpoint's or the evaluation's, left to guess)
        why = (
            f"the run evaluates every {every} versions; none of its checkpoints ({versions}) is one it evaluated yet"
            if every
            else "the job evaluates its final checkpoint only, once its last iteration is done; set "
            "evaluation.every_iterations to evaluate during the run"
            if evaluation.heldout_prompts
            else "set evaluation.heldout_prompts and evaluation.every_iterations to evaluate during the run"
        )
        raise UsageError(
            f"--checkpoint best: no complete checkpoint of job {jobdir.id} has held-out figures ({why}); name a "
            "version instead",
            hint=hint,
        )
    ranked = sorted(rows, key=lambda r: (r["heldout"]["greedy_reward"], r["version"]), reverse=True)
    best = next((r for r in ranked if not r["damaged"]), None)
    if best is None:
        damaged = "; ".join(f"v{r['version']}: {r['damaged']}" for r in ranked)
        raise UsageError(
            f"--checkpoint best: every checkpoint of job {jobdir.id} with held-out figures is damaged ({damaged}); "
            "name another version instead",
            hint=hint,
        )
    return int(best["version"]), dict(best["heldout"]), ranked[: ranked.index(best)]  # (each of them damaged)
