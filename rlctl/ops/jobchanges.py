"""What changed since a job's launch, said by `launch --resume`, which runs the job as launched (its job.json).

    launch: job.json = the job as resolved + SHA-256 of each top-level field + the job file's path and mapping
            + the rlctl version
    resume: the job file at that path now ──diff──▶ "jobs/kt.yaml changed since the launch (iterations,
            algorithm.lr); the resume runs the job as launched …"
            job.json's fields now ──digests──▶ "job.json was edited since the launch (algorithm); the resume runs
            it as edited …"
            the inventory files now ──diff sites.json──▶ "the inventory (…) changed since the launch
            (sites.h20.nodes); the resume runs on the sites as launched …"
            the reward file and its modules now ──diff reward/──▶ "the reward (…) changed since the launch
            (helper.py); the resume runs the reward as launched …"
            job.json naming no rlctl version ──▶ a loss this rlctl computes otherwise than the one that launched
            it (a decoupled is_cap: truncated then, left out now)

A changed job file is not taken up: the checkpoint holds the state of the job as launched (its model, its split,
its plan), and a change of one of those would fail the resume late or train something else silently. A new launch
runs the changed job. A hand-edited job.json is used, and said: it is the only way to change a setting of a job
that resumes (a lower `checkpoint.keep` on a disk that filled), and whoever edited it meant it. Before, both
went unsaid: a resume after a change of `iterations` in the job file ran the old count without a word. An edit of
a field the checkpoints depend on (`FIXED_FIELDS`: samples per prompt, model kind and name, seed, task kind,
trainer.lora; not an HF model's name, only a label) is refused by a resume that continues from a checkpoint
(`refuse_fixed_edits`, one line with the value at the launch and now), since no checkpoint of the job fits it; a
resume of a job that completed none starts from the beginning, which nothing of the launch holds back: it runs the
edit, said as any other, and the job as edited is then the one its checkpoints are of (`take_edits`: the resumes
after it compare with that). An edit `rlctl check` refuses in a job file (job.json is read with a job's record's
leniency, `RECORDED`) is refused by every resume too (`rlctl.ops.resumecheck`). An edit of a dataset task's field its
prepared data is made of (`PREPARED_FIELDS`: task.path, its keys, template_strings, chat_template_kwargs,
max_prompt_tokens, bad_rows, evaluation.path; held-out prompts asked of a job launched without them) is refused by
every resume, from a checkpoint or not (`rlctl.ops.preparededits`): no resume tokenizes again, its run reads the
launch's data/ and data-heldout/.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shlex
import tempfile
from pathlib import Path
from typing import Any

from rlctl.config.base import read_yaml
from rlctl.config.inventory import RECORDED, Inventory, Link, Site, load_inventory
from rlctl.errors import ConfigError, RlctlError, UsageError
from rlctl.launch.backends import SITES_FILE, read_sites
from rlctl.launch.jobdir import (
    FIXED_FIELDS,
    JOB_LAUNCHED,
    LAUNCHED,
    MEMORY_FIELDS,
    NAME_FIXES_WEIGHTS,
    PREPARED_FIELDS,
    VERSION,
    JobDir,
    job_digests,
    job_field,
    launched_job,
)
from rlctl.launch.recordfiles import replace_text
from rlctl.textutil import home_expanded

# why a checkpoint cannot continue a job with another value of each of `FIXED_FIELDS`
FIXED_WHY = {
    "batch.samples_per_prompt": "its checkpoints' groups have the launch's samples each",
    "model.kind": "its checkpoints hold the weights of the model it was launched with",
    "model.name": "its checkpoints hold the weights of the model it was launched with",
    "seed": "the prompts of the iterations after a checkpoint are those the launch's seed draws",
    "task.kind": "its checkpoints' prompts and rewards are the launched task's",
    "trainer.lora": "its checkpoints hold the launched trainer's trained state (the whole policy, or LoRA adapters "
    "of the launch's rank and projections)",
}


def refuse_fixed_edits(jobdir: JobDir, *, resumed: int) -> None:
    """UsageError, one line, when job.json was edited since the launch in a field its checkpoints depend on
    (`FIXED_FIELDS`, as its `launched` keeps them): the field, its value at the launch and now, and why a resume
    cannot take it. `resumed`: the checkpoint the resume continues from; 0 (none: the job starts from the beginning)
    refuses none of those (`launch_changes` says the edit). An edit of what the job's prepared data is made of is
    refused whatever `resumed` (`rlctl.ops.preparededits`). Nothing for a job.json without `launched` (an rlctl before
    it), or one that does not read."""
    try:
        data = jobdir.read_json(jobdir.job_json)
    except (OSError, RlctlError):  # gone or not JSON: said by what reads the job next
        return
    launched = data.get(LAUNCHED) if isinstance(data, dict) else None
    job = data.get("job") if isinstance(data, dict) else None
    if not isinstance(job, dict):
        return
    from rlctl.ops.preparededits import refuse_prepared_edits

    refuse_prepared_edits(jobdir, data, job)  # (whatever the checkpoint: no resume prepares the data again)
    if resumed <= 0 or not isinstance(launched, dict):
        return
    for name in FIXED_FIELDS:
        if name not in launched or launched[name] == job_field(job, name):
            continue
        if name == "model.name" and launched.get("model.kind") not in NAME_FIXES_WEIGHTS:
            continue  # (an HF model's label: said as any edit; another kind is refused as `model.kind`)
        was, now = launched[name], job_field(job, name)
        raise UsageError(
            f"{jobdir.job_json}: job.{name} was edited since the launch ({_shown(was)} → {_shown(now)}); a resume "
            f"cannot take it: {FIXED_WHY[name]}",
            hint=f"put job.{name} back to {_shown(was)} in job.json, or launch the changed job anew",
        )


def older_rlctl_changes(jobdir: JobDir) -> list[str]:
    """One line for what this rlctl computes otherwise than the rlctl that launched the job, where its job.json keeps
    no `VERSION` (an rlctl before it): `decoupled` with an `is_cap` (> 1; one ≤ 1 reads as the `tis` it computed),
    whose token past the cap was truncated there before 8d7ca57 and is left out now. A warning, not a refusal: the
    job may have been launched after 8d7ca57, and `tis` at the cap is the loss of before, one edit of job.json away
    (read as job.json has it now, as the resumed run reads it)."""
    data = jobdir.read_json(jobdir.job_json)
    if isinstance(data, dict) and VERSION in data:
        return []
    algo = jobdir.job_of(data).algorithm
    if algo.off_policy != "decoupled" or algo.is_cap is None:
        return []
    return [
        f"{jobdir.job_json} names no rlctl version (launched by an rlctl before 8d7ca57?): there, algorithm.off_policy "
        f"'decoupled' truncated each token's π_prox/μ at is_cap {algo.is_cap:g} (min(π_prox/μ, {algo.is_cap:g}), as "
        f"'tis' does); now it leaves out a token whose π_prox/μ exceeds {algo.is_cap:g} (weight 0). To resume with "
        "the truncation, set job.algorithm.off_policy to 'tis' in job.json"
    ]


def take_edits(jobdir: JobDir) -> None:
    """job.json's launch values (`launched`, `job_launched`) and field digests made those of the job as it is now,
    once a resume started it over (no checkpoint to continue from): the checkpoints its run writes are of the job as
    edited, which the resumes after it compare with. Before, a seed edit taken so was refused by the next resume once
    the run had checkpointed, hinting to put back the launch's seed, which no checkpoint was written with (and said
    as edited at every resume). Nothing for a job.json that does not read, or that keeps neither (an rlctl before
    them)."""
    try:
        data = jobdir.read_json(jobdir.job_json)
    except (OSError, RlctlError):
        return
    job = data.get("job") if isinstance(data, dict) else None
    if not isinstance(job, dict):
        return
    taken = dict(data)
    if isinstance(data.get(LAUNCHED), dict):
        taken[LAUNCHED] = {name: job_field(job, name) for name in (*FIXED_FIELDS, *PREPARED_FIELDS)}
    if launched_job(data) is not None:
        taken[JOB_LAUNCHED] = job
    elif isinstance(data.get(JOB_LAUNCHED), dict):  # (an rlctl's that kept `MEMORY_FIELDS` alone)
        taken[JOB_LAUNCHED] = {name: job[name] for name in MEMORY_FIELDS if name in job}
    if isinstance(data.get("job_sha256"), dict):
        taken["job_sha256"] = job_digests(job)
    if taken != data:
        replace_text(jobdir.job_json, json.dumps(taken, indent=2) + "\n")


def _shown(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": "))


def launch_changes(jobdir: JobDir, *, count_given: bool = False) -> list[str]:
    """One line for each of: job.json edited since the launch (`job_json_edits`), then what every resume says before
    its run starts (`resume_changes`). Nothing for a job launched by an rlctl that kept none of it, or from a file
    that is gone."""
    return job_json_edits(jobdir, count_given=count_given) + resume_changes(jobdir)


def resume_changes(jobdir: JobDir) -> list[str]:
    """What a resume says before its run starts, `launch --resume`'s and an automatic one's (`launch_changes`)
    alike: the job file, inventory or reward changed, which it does not take up (`source_changes`), and a loss this
    rlctl computes otherwise than the one that launched the job (`older_rlctl_changes`); versus the automatic resume
    saying the first alone."""
    return source_changes(jobdir) + older_rlctl_changes(jobdir)


def edited_fields(jobdir: JobDir, *, count_given: bool = False) -> list[str]:
    """The top-level fields of job.json edited since the launch, by their digests (`job_json_edits`' line); none for a
    job.json an rlctl before them wrote."""
    data = jobdir.read_json(jobdir.job_json)
    digests, job = data.get("job_sha256"), data.get("job")
    if not isinstance(digests, dict) or not isinstance(job, dict):
        return []
    now = job_digests(job)
    return sorted(
        k
        for k in digests.keys() | now.keys()
        if digests.get(k) != now.get(k) and not (count_given and k == "iterations")
    )


def job_json_edits(jobdir: JobDir, *, count_given: bool = False) -> list[str]:
    """One line when job.json was edited since the launch: its top-level fields that differ (not `iterations`
    where the resume's `--iterations` sets another count, `count_given`: its own line says the count it replaces);
    the resume runs the job as edited there, unless it refuses the edit (`refuse_fixed_edits`), but for an HF
    model.path, which it says no resume reads (`_model_path_unread`)."""
    if not (edited := edited_fields(jobdir, count_given=count_given)):
        return []
    line = f"{jobdir.job_json} was edited since the launch ({', '.join(edited)})"
    line += ": the resume runs the job as edited there"
    return [line + _model_path_unread(jobdir) if "model" in edited else line]


def _model_path_unread(jobdir: JobDir) -> str:
    """What `job_json_edits`' line adds where job.json's HF model.path was edited since the launch (as its record of
    the job as launched, `job_launched`, has it): no resume reads it. Every run of the job, resumed or not, trains the
    model the launch copied into the job dir (`JobDir.init_model`: the trainer, the rollout engines and the prompts'
    tokenizer read it; the checkpoints carry its weights), so a path edited to another model is not taken, and one
    edited to where the model moved since is needed by nothing; versus 'the resume runs the job as edited there', said
    of an edit the run never read. Nothing for another model, or a job.json without that record."""
    data = jobdir.read_json(jobdir.job_json)
    record = data.get(JOB_LAUNCHED)
    job = data.get("job")
    if not isinstance(record, dict) or not isinstance(job, dict) or job_field(job, "model.kind") != "hf":
        return ""
    was, now = job_field(record, "model.path"), job_field(job, "model.path")
    if was is None or was == now:
        return ""
    return (
        f", but for job.model.path ({_shown(was)} → {_shown(now)}), which no resume reads: its run trains the model "
        f"the launch copied into {jobdir.init_model} (the checkpoints carry its weights; the prompts were tokenized "
        "with its tokenizer), whatever directory model.path names; to train another model, launch the changed job "
        "anew"
    )


def source_changes(jobdir: JobDir) -> list[str]:
    """One line for each of what the resume does not take up, whether or not its run then starts: the job file the
    job was launched from changed (the fields that differ), its inventory (`site_changes`), its reward
    (`reward_changes`). Nothing for a job launched by an rlctl that kept none of it, or from a file that is gone."""
    data = jobdir.read_json(jobdir.job_json)
    source = data.get("source_file")
    if not isinstance(source, dict) or not isinstance(source.get("path"), str):
        return []
    path = Path(source["path"])
    try:
        current = json.loads(json.dumps(read_yaml(path), default=str))
    except ConfigError:  # moved, removed, unreadable: nothing to compare with
        return []
    lines = []
    if changed := changed_fields(source.get("job"), current):
        lines.append(
            f"{path} changed since the launch ({', '.join(changed)}); the resume runs the job as launched "
            f"(its job.json): to run the changed job, launch it anew (`rlctl launch {shlex.quote(str(path))}`)"
        )
    lines += site_changes(jobdir, data.get("job"), path)
    lines += reward_changes(jobdir, source.get("job"), path)
    return lines


def reward_changes(jobdir: JobDir, job: Any, source: Path) -> list[str]:
    """One line when the reward file the job file names (`task.reward: path/to/file.py:name`), with the modules
    beside it that it imports, is not what the job's reward/ holds (copied at the launch), which the resume runs:
    the files that differ. Nothing for another reward, or one that cannot be read (moved, removed)."""
    from rlctl.rl.reward_files import copy_reward
    from rlctl.rl.source import REWARD_DIR

    task = job.get("task") if isinstance(job, dict) else None
    reward = task.get("reward") if isinstance(task, dict) else None
    target, sep, _ = reward.rpartition(":") if isinstance(reward, str) else ("", "", "")
    launched = jobdir.path / REWARD_DIR
    # (a link is copied under its own name, as the launch does)
    named = _job_path(source, target) if sep and target.endswith(".py") else None
    if named is None or not named.resolve().is_file() or not launched.is_dir():
        return []
    src = named.resolve()
    with tempfile.TemporaryDirectory(prefix="rlctl-reward-") as tmp:
        try:
            copy_reward(named, Path(tmp) / REWARD_DIR)
        except ConfigError:  # a module it cannot copy (a link to nothing): nothing to compare with
            return []
        before, after = (_files(d) for d in (launched, Path(tmp) / REWARD_DIR))
    changed = sorted(f for f in before.keys() | after.keys() if before.get(f) != after.get(f))
    if not changed:
        return []
    return [
        f"the reward ({src}, with the modules beside it that it imports) changed since the launch "
        f"({', '.join(changed)}); the resume runs the reward as launched (its {launched}): to run the changed "
        "reward, launch the job anew"
    ]


def _files(directory: Path) -> dict[str, bytes]:
    """The files under `directory` (less what `copy_reward` leaves out: bytecode, a .git a launch before it copied)
    by their path relative to it, with their bytes."""
    from rlctl.rl.reward_files import NOT_COPIED

    return {
        str(f.relative_to(directory)): f.read_bytes()
        for f in directory.rglob("*")
        if f.is_file()
        and not any(fnmatch.fnmatch(part, p) for part in f.relative_to(directory).parts for p in NOT_COPIED)
    }


def site_changes(jobdir: JobDir, job: Any, source: Path) -> list[str]:
    """One line when the inventory files the job names (relative to the job file it was launched from) now say
    something else of its sites than the job's sites.json (as launched), which the resume runs on: the fields
    that differ, `sites.<name>.nodes`. Nothing when they cannot be read (moved, removed, broken)."""
    paths = _inventory_paths(job, source)
    if paths is None:
        return []
    try:
        now = load_inventory(paths).sites
        launched = read_sites(jobdir.path)
    except RlctlError:
        return []
    changed: list[str] = []
    for name, site in sorted(launched.items()):
        if name not in now:
            changed.append(f"sites.{name} (gone)")
            continue
        before, after = (s.model_dump(mode="json", by_alias=True) for s in (site, now[name]))
        changed += changed_fields(before, after, f"sites.{name}")
    if not changed:
        return []
    return [
        f"the inventory ({', '.join(map(str, paths))}) changed since the launch ({', '.join(changed)}); the resume "
        f"runs on the sites as launched (its {SITES_FILE}): to run on the changed inventory, launch the job anew"
    ]


def launched_inventory(jobdir: JobDir, plan: dict[str, Any]) -> Inventory:
    """The job's sites as launched (sites.json) with the links its plan.json records (`links`: pairs of sites,
    `ops.jobprep`), with the figures (bandwidth, latency) and datacenters the launch recorded of them
    (`link_figures`, checked by `JobDir.read_plan`): what the planner prices the weights' route over, a resume at
    another trainer split's (`ops.trainersplit`). A job dir written before them (2026-12-07) keeps the links' pairs
    alone: their figures and the sites they name that the job does not use (their datacenters) from the inventory
    files the job names, read now as `site_changes` reads them, and no links where those cannot be read (moved,
    removed, broken); versus the files as they are now for every job, their links' figures since edited (priced
    over another link than the run's) or the files gone (the predictions dropped)."""
    sites = read_sites(jobdir.path, required=True)
    if "link_figures" in plan:
        return _recorded_inventory(sites, plan["link_figures"])
    bare = Inventory(sites, [], [SITES_FILE])
    data = jobdir.read_json(jobdir.job_json)
    source = data.get("source_file")
    if not isinstance(source, dict) or not isinstance(source.get("path"), str):
        return bare
    paths = _inventory_paths(data.get("job"), Path(source["path"]))
    try:
        now = load_inventory(paths) if paths else None
    except RlctlError:
        now = None
    if now is None:
        return bare
    pairs = {frozenset(p) for p in plan.get("links", [])}
    links = [ln for ln in now.links if frozenset(ln.between) in pairs]
    named = {s: now.sites[s] for ln in links for s in ln.between if s not in sites}
    return Inventory(named | sites, links, [SITES_FILE, *map(str, paths or [])])


def _recorded_inventory(sites: dict[str, Site], figures: list[dict[str, Any]]) -> Inventory:
    """`sites` with plan.json's links as its launch recorded them (`link_figures`: each link's two sites, their
    datacenters, bandwidth and latency). A site of a link that the job does not use (an uplink declared from another
    site of one of the job's datacenters: `Inventory.links_among`) stands in as a copy of one of the job's sites with
    the datacenter recorded: the route reads nothing else of it (`planner.weightsync.weight_route`)."""
    links = [
        Link.model_validate({k: f[k] for k in ("between", "bandwidth_gbps", "latency_ms")}, context=RECORDED)
        for f in figures
    ]
    stand_ins = {
        name: next(iter(sites.values())).model_copy(update={"datacenter": dc})
        for f in figures
        for name, dc in zip(f["between"], f["datacenters"], strict=True)
        if name not in sites
    }
    return Inventory(sites | stand_ins, links, [SITES_FILE, "plan.json"])


def _inventory_paths(job: Any, source: Path) -> list[Path] | None:
    """The inventory files job.json's `job` names, each as `load_job` read it relative to the job file `source`;
    None where it names none, or one whose home this machine does not know."""
    files = job.get("inventory") if isinstance(job, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    named = [_job_path(source, f) for f in files]
    paths = [Path(os.path.normpath(p)) for p in named if p is not None]
    return paths if len(paths) == len(named) else None


def _job_path(source: Path, written: str) -> Path | None:
    """`written`, a path of the job file `source`, as `load_job` reads it: relative to the job file, a leading `~` or
    `~user` from that home (`home_expanded`, the one rule). None for a home this machine does not know, which
    `load_job` refuses: nothing to compare with (os.path left `~nosuchuser/x` as written, read as a folder
    `~nosuchuser` beside the job file)."""
    try:
        return source.parent / home_expanded(written)
    except ValueError:
        return None


def changed_fields(before: Any, after: Any, prefix: str = "") -> list[str]:
    """The dotted names of the fields that differ between two mappings (`algorithm.lr`); a list, or any other
    value, that differs is named as a whole."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return [] if before == after else [prefix or "(the whole file)"]
    out: list[str] = []
    for key in sorted(before.keys() | after.keys(), key=str):
        name = f"{prefix}.{key}" if prefix else str(key)
        if key not in before or key not in after:
            out += [] if before.get(key) == after.get(key) else [name]
        else:
            out += changed_fields(before[key], after[key], name)
    return out
