"""Staging a job to its sites: copy what the agents read into each site's job dir, verify it, record it.

    operator's job dir (prepare) ─▶ files_to_stage: job.json plan.json sites.json secret model/** data/** reward/**
        ─▶ per site, per host view (rlctl.launch.sitefs): mkdir the site job dir (0700), resolve it;
           model/init there is a link to W/models/<content digest> (`model_cache`, relative), the work root's
           one copy of that model, which every job starting from it shares
           ─▶ compare size + SHA-256 of what is there ─▶ copy what differs (SFTP / local copy)
           ─▶ verify size + SHA-256 (+ secret 0600) again ─▶ staged.json {site: {roots, files}}

A site of several SSH hosts whose inventory does not say they share the work root has each host write a mark in
its site job dir first: hosts that see another's (an NFS home) are staged once, by the first of them.
A site of several SSH hosts gets its large files over its link once, to its first host, which serves them to
the others as they land (`fan_out`, rlctl.launch.stagefanout, rlctl.launch.fanout). A site whose job dir is the
operator's (local, SLURM submitted from here) needs no copy. A host view's copy, its verification and the progress
lines are rlctl.launch.stagecopy's. staged.json
says where each site's copy is; the controller's Spawner reads it (its own copy) so a unit it adds goes
to a site already staged, or stages it first. The job's record (events, metrics, summary, controller.json, the
sample log) is written by the controller on its site; `fetch_record` (rlctl.launch.record) brings it to the
operator's job dir.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import secrets
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rlctl.config.inventory import Site
from rlctl.errors import LaunchError
from rlctl.launch.backends import SITES_FILE
from rlctl.launch.recordfiles import json_file
from rlctl.launch.sitefs import (
    FileState,
    HostFiles,
    access_hosts,
    file_state,
    host_files,
    is_remote,
    model_cache,
    site_root,
)
from rlctl.launch.stagecopy import StagingProgress, View, copy_files, copy_pool
from rlctl.launch.stagefanout import fan_out, fanned
from rlctl.rl.source import HELDOUT_DIR

log = logging.getLogger(__name__)

STAGED_FILE = "staged.json"
TOP_FILES = ("job.json", "plan.json", SITES_FILE, "secret")
INIT_MODEL = "model/init"  # the starting policy: staged once per work root and model (`model_cache`)
INIT_RECORD = "init-model.json"  # the operator's record of the starting model's files (`check_init_record`)
TREES = ("model", "data", "reward")  # what prepare() builds (rlctl.ops.inputs): policy, data set, reward file


Roots = dict[str, str]  # host view → absolute site job dir there


def files_to_stage(job_dir: Path) -> list[str]:
    """Names (relative to the job dir) of everything the agents read, symlinked trees followed."""
    names = [n for n in TOP_FILES if (job_dir / n).is_file()]
    for tree in (*TREES, HELDOUT_DIR):  # … and a dataset task's held-out set, when the job has one
        for dirpath, _, files in sorted(os.walk(job_dir / tree, followlinks=True)):
            if "__pycache__" not in Path(dirpath).parts:  # a reward's modules' bytecode, where it was loaded
                names += sorted(str(Path(dirpath, f).relative_to(job_dir)) for f in files)
    return names


def staging_plan(sites: dict[str, Site], *, job_id: str, here: Path) -> list[dict[str, Any]]:
    """For `launch --dry-run`: where each site's copy goes (unresolved `~`) and what goes there."""
    what = [*TOP_FILES, *(f"{t}/" for t in TREES)]
    out = []
    for name, site in sorted(sites.items()):
        root = site_root(site, job_id, here=here)
        copy = is_remote(site) or Path(root) != here
        hosts = access_hosts(site)
        out.append(
            {
                "site": name,
                "hosts": hosts,
                "job_dir": root,
                "files": what if copy else [],
                "note": (
                    "staged: size + SHA-256 verified, secret 0600; model/init shared per model"
                    + ("; files ≥ 8 MiB cross once, then fan out host to host" if len(hosts) > 1 else "")
                    if copy
                    else "the operator's job dir: no copy"
                ),
            }
        )
    return out


def stage_site(
    name: str,
    site: Site,
    src: Path,
    *,
    job_id: str,
    names: list[str] | None = None,
    progress: StagingProgress | None = None,
    want: dict[str, FileState] | None = None,
) -> dict[str, Any]:
    """Copy the job's files from `src` to every host view of `site`, verify them; the site's staged.json entry.
    A copy cut short by an earlier launch goes on from its bytes; one that then does not verify is copied again
    from its start (once). Hosts that turn out to share a site job dir (`_marks_seen`) are staged once, by the
    first of them (`shared_with` in the entry). `progress` counts the bytes as they go."""
    names = files_to_stage(src) if names is None else names
    want = {n: file_state(src / n) for n in names} if want is None else want
    root = site_root(site, job_id, here=src)
    progress = StagingProgress(name, lambda _line: None) if progress is None else progress  # also what stops copies

    model = [n for n in names if n.startswith(INIT_MODEL + "/")]
    digest = model_digest({n[len(INIT_MODEL) + 1 :]: want[n] for n in model}) if model else ""
    own = not is_remote(site) and Path(root).resolve() == src.resolve()  # the operator's own job dir: no copy
    cache = model_cache(root, digest) if model and not own else None

    def prepare(host: str, fs: HostFiles, marks: list[str]) -> View:
        if cache is not None:  # model/init → the work root's copy of this model, shared by its jobs
            resolved, cached, model = fs.make_dirs([root, cache, f"{root}/model"])
            # relative: a host that shares this work root under another path (`_marks_seen`) follows it too
            if not fs.link(posixpath.relpath(cached, model), f"{resolved}/{INIT_MODEL}"):
                log.info("site %s: %s:%s/%s is a directory of its own: staged into it", name, host, resolved,
                         INIT_MODEL)  # fmt: skip
        parents = sorted({str(Path(n).parent) for n in names} - {"."})
        resolved = fs.make_dirs([root, *(f"{root}/{p}" for p in parents)])[0]
        fs.remove(resolved, marks)  # the marks `_marks_seen` read, every host's that shares this one's
        have = fs.states(resolved, names, stop=progress.stopping)
        have |= _fix_modes(fs, resolved, have, want)
        return View(host, fs, resolved, have, [n for n in names if have.get(n) != want[n]])

    hosts = access_hosts(site)
    fanout: dict[str, Any] | None = None
    shared: dict[str, str] = {}
    if own:
        results = [(host, str(src), 0, 0) for host in hosts]
    else:
        views: list[View] = []
        opened: list[View] = []
        try:
            token = secrets.token_hex(6)  # this staging's marks: where one host's is seen on another, they share
            marks = {h: SHARE_MARK.format(token=token, host=h) for h in hosts} if len(hosts) > 1 else {}
            with copy_pool(min(8, len(hosts)), progress) as pool:
                futures = [pool.submit(_open_view, site, h, root, marks.get(h)) for h in hosts]
            _collect(futures, opened)
            seen = _marks_seen(name, opened, marks) if marks else {v.host: [] for v in opened}
            shared = {v.host: seen[v.host][0] for v in opened if seen[v.host] and seen[v.host][0] != v.host}
            with copy_pool(min(8, len(hosts)), progress) as pool:
                futures = [pool.submit(prepare, v.host, v.fs, [marks[h] for h in seen[v.host]]) for v in opened
                           if v.host not in shared]  # fmt: skip
            _collect(futures, views)
            if progress is not None:
                progress.add(sum(want[n].size for v in views for n in v.todo))
            fan = fanned(views, want) if len(views) > 1 else {}
            if fan:
                fanout = fan_out(name, site, src, views, fan, want, progress)
            else:
                with copy_pool(min(8, len(views)), progress) as pool:
                    list(pool.map(lambda v: copy_files(name, src, v, v.todo, want, progress), views))
        finally:
            for v in opened:
                v.fs.close()
        staged = {v.host: v for v in views}  # a host that shares another's work root: nothing to do
        results = [(v.host, v.resolved, len(v.todo), sum(want[n].size for n in v.todo))
                   for v in (staged.get(o.host, o) for o in opened)]  # fmt: skip
    for host, resolved, n, size in results:
        log.info("site %s: %s:%s holds the job's %d files (%d copied, %d B)", name, host, resolved, len(names), n, size)
    out = {
        "roots": {host: resolved for host, resolved, _, _ in results},
        "files": [{"path": n, "bytes": want[n].size, "sha256": want[n].sha256} for n in names],
        "copied": {host: n for host, _, n, _ in results},
    }
    if cache is not None:
        out["model_cache"] = {"digest": digest, "dir": cache}
    if fanout is not None:
        out["fanout"] = fanout
    if shared:
        out["shared_with"] = shared
    return out


def _collect(futures: list[Future[View]], into: list[View]) -> None:
    """The views the futures made go `into` (the caller closes them, whatever happens next); then the first
    failure is raised."""
    into.extend(f.result() for f in futures if f.exception() is None)
    for f in futures:
        if (e := f.exception()) is not None:
            raise e


SHARE_MARK = ".rlctl-stage-{token}-{host}"  # each host's, in its site job dir while a site is staged per host


def _open_view(site: Site, host: str, root: str, mark: str | None) -> View:
    """The host's view, its site job dir made (and resolved), `mark` written there (`_marks_seen`)."""
    fs = host_files(site, host)
    try:
        resolved = fs.make_dirs([root])[0]
        if mark is not None:
            fs.append(f"{resolved}/{mark}", "")
    except BaseException:
        fs.close()
        raise
    return View(host, fs, resolved, {}, [])


def _marks_seen(name: str, views: list[View], marks: dict[str, str]) -> dict[str, list[str]]:
    """For each view, the hosts whose marks its site job dir holds, in the site's order: hosts that share a
    filesystem (an NFS home) though the inventory does not say `shared_workdir`. The first of them stages it and
    the others use its copy: each copying or fetching into the same files (their `.part`s) broke the staging."""
    with ThreadPoolExecutor(max_workers=min(8, len(views))) as pool:
        found = list(pool.map(lambda v: v.fs.states(v.resolved, list(marks.values())), views))
    seen = {v.host: [h for h, m in marks.items() if m in f] for v, f in zip(views, found, strict=True)}
    groups = {hs[0]: hs[1:] for hs in seen.values() if len(hs) > 1}
    if groups:
        where = "; ".join(f"{', '.join(o)} {'see' if o[1:] else 'sees'} {first}'s" for first, o in groups.items())
        log.warning("site %s: hosts share a work root (%s): it is staged once; set sites.%s.scheduler."
                    "shared_workdir: true where all of the site's hosts share it", name, where, name)  # fmt: skip
    return seen


def _fix_modes(
    fs: HostFiles, root: str, have: dict[str, FileState], want: dict[str, FileState]
) -> dict[str, FileState]:
    """Give the files the view holds with the wanted bytes but other permission bits the wanted ones, in place;
    their states now. Copying them again replaced them, and on a multi-host site first removed them
    (`_clear_stale`): files of the work root's model directory, which other jobs on the host may be reading."""
    modes = {
        n: w.mode
        for n, w in want.items()
        if (h := have.get(n)) is not None and (h.size, h.sha256) == (w.size, w.sha256) and h.mode != w.mode
    }
    if modes:
        fs.chmod(root, modes)
    return {n: FileState(have[n].size, have[n].sha256, mode) for n, mode in modes.items()}


def check_init_record(job_dir: Path, want: dict[str, FileState]) -> None:
    """Record the starting model's files (size, SHA-256) at the job's first launch; at a later one (a resume),
    LaunchError naming the first file that changed since (a hard link shares its bytes with the checkpoint the
    job was launched from: rewriting that checkpoint in place would change the job's reference policy)."""
    files = {n: f for n, f in want.items() if n.startswith(INIT_MODEL + "/")}
    record = job_dir / INIT_RECORD
    if not record.exists():
        tmp = record.with_name(record.name + ".tmp")
        tmp.write_text(json.dumps({n: [f.size, f.sha256] for n, f in sorted(files.items())}, indent=1) + "\n")
        tmp.replace(record)
        return
    then = {n: tuple(v) for n, v in json.loads(record.read_text()).items()}
    for n in sorted(set(then) | set(files)):
        now = (files[n].size, files[n].sha256) if n in files else None
        if now != then.get(n):
            raise LaunchError(
                f"{job_dir / n}: the job's starting model changed since its first launch ("
                + ("missing now" if now is None else "new" if n not in then else "other bytes")
                + "): restore the checkpoint it was launched from, or launch a new job"
            )


def model_digest(files: dict[str, FileState]) -> str:
    """A model directory's content address: SHA-256 over its files' names, sizes and SHA-256s (32 hex digits)."""
    lines = "".join(f"{n}\t{f.size}\t{f.sha256}\n" for n, f in sorted(files.items()))
    return hashlib.sha256(lines.encode()).hexdigest()[:32]


def read_staged(job_dir: Path) -> dict[str, Any]:
    """What `write_staged` wrote ({} before it did): site → {"roots": {host: site job dir}, …}; LaunchError naming
    the file and entry when it is not that."""
    p = job_dir / STAGED_FILE
    if not p.exists():
        return {}
    data = json_file(p)
    if not isinstance(data, dict):
        raise LaunchError(f"{p}: not an object of staged sites")
    for name, entry in data.items():
        roots = entry.get("roots") if isinstance(entry, dict) else None
        if not isinstance(roots, dict) or not roots or not all(isinstance(r, str) for r in roots.values()):
            raise LaunchError(f'{p}: {name!r}: not a {{"roots": {{host: job dir}}}} entry')
    return data


def write_staged(job_dir: Path, staged: dict[str, Any]) -> None:
    tmp = job_dir / (STAGED_FILE + ".tmp")
    tmp.write_text(json.dumps(staged, indent=2) + "\n")
    tmp.replace(job_dir / STAGED_FILE)


def stage_all(
    job_dir: Path,
    sites: dict[str, Site],
    *,
    job_id: str,
    say: Callable[[str], None] | None = None,
    show: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Stage to every site of the job (once each; a site already holding identical files gets no copy). `say`:
    where the copy's progress goes (a line every PROGRESS_INTERVAL_S while it runs, one at its end); `show`: a
    terminal's live line (a bar while a site's copy runs, cleared after). The job's
    files are hashed once; the starting model's checksums are recorded at the first launch (INIT_RECORD) and a
    later launch whose starting model changed is refused (its files may be hard links to the user's)."""
    staged = read_staged(job_dir)
    names = files_to_stage(job_dir)
    want = {n: file_state(job_dir / n) for n in names}
    check_init_record(job_dir, want)
    for name, site in sorted(sites.items()):
        progress = StagingProgress(name, say, show=show) if say is not None else None
        staged[name] = stage_site(name, site, job_dir, job_id=job_id, names=names, progress=progress, want=want)
        if progress is not None:
            progress.done()
        if show is not None:
            show("")
    write_staged(job_dir, staged)
    return staged


def ensure_staged(job_dir: Path, name: str, site: Site, *, job_id: str) -> Roots:
    """The site's roots from staged.json; a site not staged yet is staged from `job_dir` first (scale-out)."""
    staged = read_staged(job_dir)
    if name not in staged:
        staged[name] = stage_site(name, site, job_dir, job_id=job_id)
        write_staged(job_dir, staged)
    return dict(staged[name]["roots"])


def root_for(roots: Roots, host: str | None) -> str:
    """The site job dir an agent on `host` uses (SLURM / local sites have one view for every node)."""
    if host is not None and host in roots:
        return roots[host]
    return next(iter(roots.values()))
