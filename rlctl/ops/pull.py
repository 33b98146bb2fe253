"""`rlctl pull JOB`: a checkpoint's policy (a Hugging Face directory) and the job's tracker files, brought from the
sites that wrote them to this machine.

    job dir here ─ plan.json, staged.json, agents.jsonl ─▶ the trainer's site, the host of its rank 0, its job dir
        ─▶ which checkpoint: N, or `latest` (the controller's latest.json, read on its site; if that one's parts
           fail the check `status --checkpoints` makes, `rlctl.ops.checkpoints.sound`, or its trainer part does not
           verify, the next older of the job's checkpoints; a damaged latest.json: the newest that verifies, the
           rule a resume takes, `rlctl.checkpoint.choose.choose_resume`); N judged by the same check before any
           copy (`_judge_named`: refused where its trainer part fails it or its controller part names another,
           pulled with a warning where only its controller part fails it)
        ─▶ MANIFEST.trainer.json of iter-N ─▶ each model/ file: copied (SFTP or a local copy) to a temporary
           name, its size and SHA-256 checked against the manifest, renamed into place
    controller's site ─▶ tensorboard/, wandb/ ─▶ the job dir here (also when a job ends or stops:
                          `rlctl.launch.record.fetch_record`)

The pulled directory loads with `transformers` (`AutoModelForCausalLM.from_pretrained(DIR)`): it is the policy
the trainer wrote, with the starting model's tokenizer files.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlctl import procfs
from rlctl.checkpoint.choose import (
    LATEST_POINTER,
    checkpoint_versions,
    choose_resume,
    manifest_name,
    named_version,
    parse_latest,
)
from rlctl.checkpoint.files import ABANDONED, file_digest
from rlctl.config.inventory import Site
from rlctl.errors import LaunchError, RlctlError, UsageError
from rlctl.launch.backends import AGENTS_FILE, SITES_FILE, agents_from_lines, read_sites
from rlctl.launch.jobdir import JobDir, say_once
from rlctl.launch.record import TRACKER_DIRS, fetch_record, here_root, record_is_here, record_view
from rlctl.launch.recordfiles import record_text
from rlctl.launch.sitefs import HostFiles, LocalFiles, Survey, agent_view, host_files, is_remote
from rlctl.launch.stage import read_staged, root_for
from rlctl.ops.checkpoints import PartDir, best_checkpoint, sound, surveyed
from rlctl.ops.extend import earlier_iterations

log = logging.getLogger(__name__)

MODEL = "model"


@dataclass(frozen=True)
class Pulled:
    version: int
    to: Path
    files: int
    bytes: int
    source: str  # site:host:dir it came from
    trackers: list[str]  # the tracker files in the job dir here (copied now, or written here by its controller)


def trainer_site(job_dir: Path) -> tuple[str, Site, str, str]:
    """(site name, the site, the host view of trainer rank 0 there, the site job dir in that view): where the
    trainer's part of each checkpoint is. UsageError for a job never launched or staged there."""
    jd = JobDir(job_dir)
    plan = jd.read_plan_or_none()
    if plan is None:
        raise UsageError(f"{job_dir}: the job was never launched (no plan.json): nothing to pull")
    site_name = jd.plan_site(plan, "trainer", "site")
    site = read_sites(job_dir, required=True).get(site_name)  # gone: not "never staged", its record of the sites
    if site is None:
        raise LaunchError(
            f"{job_dir / SITES_FILE}: no site {site_name!r}, the trainer's in plan.json (the launch's record of the "
            "job's sites is damaged)",
            hint="put it back from a copy of the job dir",
        )
    staged = read_staged(job_dir)
    if site_name not in staged:
        raise UsageError(f"{job_dir}: the job was never staged to its trainer site {site_name!r}: nothing to pull")
    agents = job_dir / AGENTS_FILE
    skipped: list[str] = []  # a line cut short by a full disk stays in the file for good: read past it, said once
    rows = agents_from_lines(record_text(agents), source=agents, skipped=skipped) if agents.exists() else []
    say_once(skipped)
    host = next((h.ident.get("host") for h in rows if h.spec.name == "trainer-0"), None)
    view = agent_view(site, host)
    return site_name, site, view, here_root(site, root_for(staged[site_name]["roots"], view), job_dir)


def checkpoint_parts(job_dir: Path, *, remote: bool) -> dict[str, PartDir]:
    """Where each checkpoint part's checkpoints/ directory is: the trainer's on the host of its rank 0, the
    controller's where it keeps the job's record; with `remote` False only where the site keeps its files on this
    machine (a local site, a SLURM site's shared filesystem: not one reached over SSH), for a check that costs no
    connection (`rlctl report`). {} for a job whose record does not say where its trainer is (never launched or
    staged: said by what reads it)."""
    out: dict[str, PartDir] = {}
    try:
        site_name, site, view, root = trainer_site(job_dir)
    except (UsageError, LaunchError):
        return out
    if remote or not is_remote(site):
        out["trainer"] = PartDir(site_name, site, view, f"{root}/checkpoints")
    record = record_view(job_dir)
    if record is not None and (remote or not is_remote(record[0])):
        jd = JobDir(job_dir)
        plan = jd.read_plan_or_none()
        assert plan is not None  # (record_view read it)
        name = jd.plan_site(plan, "controller_site")
        out["controller"] = PartDir(name, record[0], record[1], f"{record[2]}/checkpoints")
    return out


def _latest(job_dir: Path) -> tuple[str, str | None, bool]:
    """(where the controller's latest.json is, its text: None without one, whether that is on this machine), read on
    the controller's site."""
    view = record_view(job_dir)
    fs, root = (host_files(view[0], view[1]), view[2]) if view is not None else (LocalFiles(), str(job_dir))
    where = f"{root}/checkpoints/{LATEST_POINTER}"
    try:
        return where, fs.read_text(where), view is None or not is_remote(view[0])
    finally:
        fs.close()


def pull(
    job_dir: Path,
    *,
    checkpoint: str = "latest",
    to: Path | None = None,
    policy_in: Callable[[Pulled], object] = lambda pulled: None,
    named: str | None = None,
) -> Pulled:
    """Copy checkpoint `checkpoint` ("latest", "best": `best_checkpoint`, or a version)'s policy to `to` (default:
    <job dir>/pulled/v<N>). A `to` given must be new or empty: a pull never mixes its files with others (the default
    one is the job's own copy of that version, replaced by a pull again). What a pull killed before it could clean up
    left there (its staging folder) does not count, and goes. `policy_in` is told once the policy is in place, every
    file verified, before the tracker files are fetched (a pull cut short then has its policy: a `to` given is not
    empty for a pull again). `named`: how its hints name the job (`JobRef.arg`), default its id."""
    to = _new_or_empty(to) if to is not None else None
    spec = JobDir(job_dir).read_job()
    versions = checkpoint_versions(spec, earlier=earlier_iterations(JobDir(job_dir)))
    number = None if checkpoint in ("latest", "best") else named_version(checkpoint)
    if checkpoint not in ("latest", "best") and number is None:
        raise UsageError(
            f"--checkpoint {checkpoint!r}: 'latest', 'best' or a version, e.g. {versions[-1]} or v{versions[-1]}"
        )
    # one view of the trainer's site for all that follows: over SSH one connection for a `best`'s look at the
    # checkpoints' manifests and the copy, versus one each
    site, site_spec, view, root = trainer_site(job_dir)
    fs = host_files(site_spec, view)
    try:
        if checkpoint == "best":
            number = _best(job_dir, named=named, views={(site, view): fs})
        pointer: str | None = None
        pointed: list[int] = []  # the version latest.json names
        damaged: str | None = None  # why latest.json names no version: damaged, missing
        where = ""  # (where it is)
        if checkpoint == "latest":
            where, pointer, pointed, damaged = _pointed(job_dir)
        listed = fs.list_files(f"{root}/checkpoints")
        if number is not None:
            _have(listed, root, number, named=checkpoint)
        # `latest`: the rule a resume takes (choose_resume): the one latest.json names first, a version of the job or
        # not (a count changed in job.json by hand since), then the older ones on the site (those of an
        # every_iterations changed since too); every one on the site, newest first, where latest.json is damaged
        on_site = sorted({v for v, complete in _checkpoints(listed).items() if complete and v}, reverse=True)
        stored = on_site if number is None else [number]
        if damaged is not None and on_site:
            log.warning("%s is %s: pulling the newest checkpoint that verifies", where, damaged)
        # each one judged first as `status --checkpoints` judges it (`sound` of what `surveyed` saw: every part's
        # manifests on its own site, the controller's naming the trainer's; one look a site), then its policy copied
        # and every byte verified: `latest` is the newest that status calls sound (its latest), versus the trainer
        # part alone (one whose controller part status marks damaged pulled as the latest); a version named is judged
        # by the same look (`_judge_named`), versus its trainer part alone, as it was copied; `best` was judged so
        seen: dict[str, Survey] = {}
        if checkpoint != "best":
            candidates = sorted({*on_site, *pointed, *([number] if number is not None else [])})
            parts = checkpoint_parts(job_dir, remote=True)
            seen, _ = surveyed(parts, candidates, views={(site, view): fs}, cache=JobDir(job_dir).manifest_cache)
        if number is not None and checkpoint != "best":
            _judge_named(seen, number, on_site, named=checkpoint, job=named or shlex.quote(JobDir(job_dir).id))
        problems: list[str] = []
        pulled: list[Pulled] = []

        def problem(version: int) -> str | None:
            why = sound(seen, version) if number is None else None  # (a version named: `_judge_named`)
            if why is None:
                try:
                    into = (to or job_dir / "pulled" / f"v{version}").resolve()
                    pulled.append(
                        _pull_one(
                            fs,
                            f"{root}/checkpoints/iter-{version}",
                            version,
                            into,
                            f"{site}:{fs.where}",
                            named_by="--to" if to else None,
                        )
                    )
                    return None
                except ValueError as e:
                    why = str(e)
            problems.append(f"v{version}: {why}")
            if any(v < version for v in stored):  # the error below says the last one
                log.warning("checkpoint v%d on site %s not pulled: %s; trying an older one", version, site, why)
            return why

        if number is not None:
            problem(number)
        else:
            try:
                choose_resume(pointer, stored, problem)
            except RlctlError as e:  # none verifies: said below, as the pull found it
                if type(e) is not RlctlError:  # the pull's own (a --to it cannot write), out of `problem`
                    raise
        if pulled:
            policy_in(pulled[0])
            got = pulled[0]
            return Pulled(got.version, got.to, got.files, got.bytes, got.source, fetch_trackers(job_dir))
        if not problems:  # latest.json names v0, or is damaged or missing, and no checkpoint is on the site
            ckpts = Path(f"{root}/checkpoints")
            if not is_remote(site_spec) and ckpts.exists() and not ckpts.is_dir():
                raise UsageError(f"{ckpts} is not a directory: site {site} holds no checkpoint of the job to pull")
            said = "names none" if damaged is None else f"is {damaged}, and site {site} holds none"
            raise UsageError(f"{job_dir}: no checkpoint is complete yet ({LATEST_POINTER} {said})")
        job_id = JobDir(job_dir).id
        raise LaunchError(f"no checkpoint of {job_id} could be pulled from site {site}: " + "; ".join(problems))
    finally:
        fs.close()


def _new_or_empty(to: Path) -> Path:
    """`--to`, resolved (`--to .` named); UsageError where it is no directory or holds files of another pull's (a
    pull never mixes its files with others; what a pull killed before it could clean up left does not count)."""
    to = to.resolve()
    try:
        if to.exists() and not to.is_dir():
            raise UsageError(f"--to {to}: not a directory")
        if to.is_dir() and set(to.iterdir()) - set(_abandoned(to)):
            raise UsageError(
                f"--to {to}: not empty (a pull never mixes its files with others); name a new or empty directory"
            )
    except OSError as e:
        raise UsageError(f"--to {to}: {e.strerror or e}") from e
    return to


def _best(job_dir: Path, *, named: str | None, views: dict[tuple[str, str], HostFiles]) -> int:
    """`--checkpoint best`: the highest held-out greedy reward of those the run evaluated (its evaluations and events
    as the controller's site has them: a launcher gone before the run ended fetched none, as `status --checkpoints`
    lists them), among those whose parts pass the check `status --checkpoints` makes (`parts_problem`: each part's
    manifests, the controller's naming the trainer's, on its own site; `views`: the ones open), versus the trainer
    part alone (a controller part that status marks damaged taken). Each better one passed over is said with why."""
    fetch_trackers(job_dir)
    parts = checkpoint_parts(job_dir, remote=True)
    number, figures, passed = best_checkpoint(JobDir(job_dir), named=named, parts=parts, views=views)
    for r in passed:
        log.warning(
            "--checkpoint best: v%d (held-out greedy reward %.4f) passed over as damaged: %s",
            r["version"],
            r["heldout"]["greedy_reward"],
            r["damaged"],
        )
    took = f"--checkpoint best: v{number} (held-out greedy reward {figures['greedy_reward']:.4f})"
    log.log(logging.WARNING if passed else logging.INFO, "%s%s", took, ", the best sound one" if passed else "")
    return number


def _pointed(job_dir: Path) -> tuple[str, str | None, list[int], str | None]:
    """`--checkpoint latest`: where the controller's latest.json is, its text (read on its site: None where there is
    none), the version it names ([] where it is damaged or missing), and why it is damaged ("missing", "not a file"
    where it is none; None: it parses). A damaged or missing pointer bounds nothing (`choose_resume`: the newest
    checkpoint on the site that verifies), versus a missing one refused 'no checkpoint is complete yet' beside
    sound checkpoints; said by the pull, once, where the site holds any."""
    where, pointer, local = _latest(job_dir)
    if pointer is None:  # (on this machine, a directory in its place is said as one; on a site's host, as missing)
        return where, None, [], "not a file" if local and Path(where).exists() else "missing"
    try:
        return where, pointer, [parse_latest(pointer)], None
    except ValueError as e:
        return where, pointer, [], f"damaged ({e})"


def _judge_named(seen: dict[str, Survey], version: int, on_site: list[int], *, named: str, job: str) -> None:
    """A version named on the command line (`named`: `v20`, `20`), judged by what `status --checkpoints` checks
    (`sound` of `seen`) before any file is copied. Damaged in its trainer part (the policy a pull copies), or its two
    parts each sound alone but the controller's naming another trainer part (the weights there are not the ones the
    job's record of that version, its held-out figures among them, was written with): UsageError naming the damage
    and the versions on the site that are sound. Damaged in its controller part alone (its manifest cut short or
    missing, a file it lists gone: a controller that died as it wrote it): the policy is still that version's
    whole, which is what a pull is for — pulled, every byte verified against the trainer's manifest as ever, the
    damage said in a warning (a resume refuses that checkpoint)."""
    why = sound(seen, version)
    if why is None:
        return
    trainer = {part: s for part, s in seen.items() if part == "trainer"}
    others = {part: s for part, s in seen.items() if part != "trainer"}
    if sound(trainer, version) is None and sound(others, version) is not None:
        log.warning(
            "--checkpoint %s: v%d is not sound (%s); its trainer part, the policy, is: pulled, every file verified "
            "(a resume cannot start from v%d)",
            named,
            version,
            why,
            version,
        )
        return
    good = [f"v{v}" for v in sorted(on_site) if v != version and sound(seen, v) is None]
    these = f"the sound ones: {', '.join(good)}" if good else "none on the site is sound"
    raise UsageError(
        f"--checkpoint {named}: v{version} is not sound ({why}); {these}",
        hint=f"`rlctl status {job} --checkpoints` lists them",
    )


def _have(files: list[str], root: str, version: int, *, named: str) -> None:
    """UsageError listing the job's checkpoints when `version` (`named` so on the command line: `v20`, `20`) is none
    of them (its folder holds no file), and naming it where a resume set it aside
    (checkpoints/abandoned/iter-N.<key>). `files`: every file under the site job dir `root`'s checkpoints/."""
    found = _checkpoints(files)
    aside: set[str] = set()
    for rel in files:
        top, _, rest = rel.partition("/")
        if top == ABANDONED and rest.startswith(f"iter-{version}."):
            aside.add(f"{root}/checkpoints/{ABANDONED}/{rest.partition('/')[0]}")
    if version in found:
        return  # an incomplete one is said by the pull itself
    complete = [f"v{v}" for v in sorted(found) if found[v]]
    has = f"this job has {', '.join(complete)}" if complete else "this job has none complete yet"
    if aside:
        has = (
            f"a resume from an older one set it aside in {', '.join(sorted(aside))} (its model/ folder is the "
            f"policy, not pulled from there); {has}"
        )
    raise UsageError(f"--checkpoint {named}: no such checkpoint; {has}")


def _checkpoints(files: list[str]) -> dict[int, bool]:
    """The checkpoints among `files` (paths under a job dir's checkpoints/): version → complete (its trainer part's
    manifest is there)."""
    found: dict[int, bool] = {}
    for rel in files:
        top, _, rest = rel.partition("/")
        if top.startswith("iter-") and top[5:].isascii() and top[5:].isdigit():
            v = int(top[5:])
            found[v] = found.get(v, False) or rest == manifest_name("trainer")
    return found


def _pull_one(fs: HostFiles, ckpt: str, version: int, to: Path, source: str, *, named_by: str | None = None) -> Pulled:
    """The model/ files the trainer part's manifest lists, each verified here after the copy; ValueError naming
    what is missing or does not match. `named_by`: the option that named `to` (`--to`), which a `to` it cannot write
    names, as the option's other lines do; None for the job's own pulled/vN."""
    where = f"{named_by} {to}" if named_by else str(to)
    text = fs.read_text(f"{ckpt}/{manifest_name('trainer')}")
    if text is None:
        raise ValueError(f"no {manifest_name('trainer')} (not written, or the part is incomplete)")
    try:
        listed = {str(k): (int(v["bytes"]), str(v["sha256"])) for k, v in json.loads(text)["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{manifest_name('trainer')} does not parse ({e})") from e
    model = {rel: w for rel, w in listed.items() if rel.startswith(f"{MODEL}/")}
    if any(part in ("", ".", "..") for rel in model for part in rel.split("/")):
        raise ValueError(f"{manifest_name('trainer')} lists a path outside the checkpoint")
    if not model:
        raise ValueError(f"{manifest_name('trainer')} lists no {MODEL}/ files")
    # every file into a directory of its own first (inside `to`: the same filesystem, also when `to` is a mount
    # point); into `to` only once all of them verified (a damaged checkpoint leaves nothing behind)
    created = not to.exists()
    staging = to / f".pull-{os.getpid()}"
    try:
        to.mkdir(parents=True, exist_ok=True)
        for left in [staging, *_abandoned(to)]:
            shutil.rmtree(left, ignore_errors=True)
        staging.mkdir()
    except OSError as e:
        raise UsageError(f"{where}: cannot pull into it: {e.strerror or e}") from e
    total, done = 0, False
    try:
        for rel, (size, sha) in sorted(model.items()):
            tmp = staging / rel.removeprefix(f"{MODEL}/")
            tmp.parent.mkdir(parents=True, exist_ok=True)
            try:
                fs.get(f"{ckpt}/{rel}", tmp)
            except LaunchError as e:
                raise ValueError(f"{rel}: {e}") from e
            got_size, got_sha = tmp.stat().st_size, file_digest(tmp)
            if (got_size, got_sha) != (size, sha):
                raise ValueError(f"{rel}: {got_size} bytes, SHA-256 {got_sha[:12]}… here; the manifest lists "
                                 f"{size}, {sha[:12]}…")  # fmt: skip
            total += size
        try:
            for rel in sorted(model):
                name = rel.removeprefix(f"{MODEL}/")
                (to / name).parent.mkdir(parents=True, exist_ok=True)
                _move(staging / name, to / name)
        except OSError as e:
            raise UsageError(f"{where}: cannot pull into it: {e.strerror or e}") from e
        done = True
    finally:
        shutil.rmtree(staging if done or not created else to, ignore_errors=True)
    log.info("pulled checkpoint v%d (%d files, %d B) from %s to %s", version, len(model), total, source, to)
    return Pulled(version, to, len(model), total, f"{source}:{ckpt}", [])


def _abandoned(to: Path) -> list[Path]:
    """The staging folders in `to` of pulls whose process is gone (SIGKILLed, OOM-killed, a reboot: no `finally`
    ran): a partial copy of the weights, which stayed inside the pulled model and made `--to` read as not empty.
    (One whose pid another process took since keeps its leftover: `--to` then reads as not empty.)"""
    out = []
    for p in to.glob(".pull-*"):
        pid = p.name.removeprefix(".pull-")
        if pid.isdigit() and int(pid) != os.getpid() and not procfs.alive(int(pid)):
            out.append(p)
    return out


def _move(src: Path, dst: Path) -> None:
    """Rename; a copy where that crosses filesystems (EXDEV: `to`, or a folder of it, is a mount point of its own)."""
    try:
        os.replace(src, dst)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        shutil.copyfile(src, dst)


def fetch_trackers(job_dir: Path) -> list[str]:
    """The tracker files (and the job's record) from the controller's site into the job dir here, and then the
    tracker files here (copied now, or by a fetch before: one that has not changed since is not copied again); when
    the controller's job dir is this one, those it wrote here (`pull` said "tracker files: 0" of a local job whose
    tensorboard/ held its events). A controller's site (not the trainer's) that does not answer is said (a warning)
    and costs the tracker files, not the policy pulled already (the pull failed, exit 1)."""
    view = record_view(job_dir)
    if view is None:
        return []
    site, _, root = view
    if not record_is_here(site, root, job_dir):  # (as `fetch_record` tells it)
        try:
            fetch_record(job_dir, *view)  # (a tracker file the fetch before brought whole is not copied again)
        except (RlctlError, OSError) as e:
            log.warning("%s: tracker files not fetched from the controller's site: %s", JobDir(job_dir).id, e)
            return []
    here = (p for tree in TRACKER_DIRS for p in sorted((job_dir / tree).rglob("*")) if p.is_file())
    return [str(p.relative_to(job_dir)) for p in here]
