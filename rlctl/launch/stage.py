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
the others as they land (`_fan_out`, rlctl.launch.fanout). A site whose job dir is the operator's (local, SLURM
submitted from here) needs no copy. staged.json
says where each site's copy is; the controller's Spawner reads it (its own copy) so a unit it adds goes
to a site already staged, or stages it first. The job's record (events, metrics, summary, controller.json, the
sample log) is written by the controller on its site; `fetch_record` brings it to the operator's job dir (the logs
by the bytes they grew since the last fetch: `fetch_appended`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import posixpath
import secrets
import shlex
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlctl.config.inventory import Site
from rlctl.errors import LaunchError
from rlctl.launch import eventtail
from rlctl.launch.backends import AGENTS_FILE, SITES_FILE, agents_from_lines, kind_of, python_for, read_sites
from rlctl.launch.base import AgentHandle, site_setup
from rlctl.launch.jobdir import appending, event_time, json_file, replace_text, say_once
from rlctl.launch.remote import CommandResult, SshRunner, sh_path
from rlctl.launch.sitefs import (
    FileState,
    HostFiles,
    StagingStopped,
    access_hosts,
    file_state,
    host_files,
    is_remote,
    model_cache,
    site_root,
    ssh_target,
)
from rlctl.rl.source import HELDOUT_DIR
from rlctl.textutil import duration

log = logging.getLogger(__name__)

STAGED_FILE = "staged.json"
TOP_FILES = ("job.json", "plan.json", SITES_FILE, "secret")
INIT_MODEL = "model/init"  # the starting policy: staged once per work root and model (`model_cache`)
INIT_RECORD = "init-model.json"  # the operator's record of the starting model's files (`check_init_record`)
TREES = ("model", "data", "reward")  # what prepare() builds (rlctl.ops.inputs): policy, data set, reward file
RECORD_FILES = ("controller.json", "summary.json")
# what the launcher writes into its copy of a run's summary.json: the held-out figures (`add_heldout`), the exits of
# its own agents (`JobRun._record_exits`), the first trainer rank that ended and a stop the controller did not see
# (`state`); kept when the controller's copy of the same run is fetched again (every `rlctl status` of a job whose
# controller ran on another site)
LAUNCHER_SUMMARY_KEYS = ("heldout", "agent_exits", "trainer_ranks_ended", "state")
EVENTS = "events.jsonl"  # the controller's site's and the operator's, merged here
SITE_EVENTS = ".site-events.jsonl"  # the controller's site's events.jsonl as fetched (by what it grew)
TRACKER_DIRS = ("tensorboard", "wandb")  # what rlctl.tracking writes under the controller's job dir
# logs the controller appends to (cut back only by a resume), fetched by the bytes they grew since the last fetch
APPENDED_LOGS = tuple(
    f"{name}{cut}.jsonl" for name in ("metrics", "evaluations", "samples") for cut in ("", ".discarded")
)
TAIL_MATCH_BYTES = 64 << 10  # a local copy whose last bytes match the host's at the same offset is a prefix of it
SECRET_MODE = 0o600
PROGRESS_INTERVAL_S = 10.0  # a staging progress line at most this often
BAR_INTERVAL_S = 0.25  # … and the terminal's live bar
FANOUT_MIN_BYTES = 8 << 20  # a multi-host SSH site's files this large cross its link once, then fan out there
FANOUT_CHILDREN = 2  # hosts each host of the site's fan-out tree serves
FANOUT_FLOOR_S = 60.0  # the fan-out server's start; a fetch's deadline: this plus its bytes at the floor rate
FANOUT_FLOOR_BYTES_PER_S = 1e6

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

    def prepare(host: str, fs: HostFiles, marks: list[str]) -> _View:
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
        return _View(host, fs, resolved, have, [n for n in names if have.get(n) != want[n]])

    hosts = access_hosts(site)
    fanout: dict[str, Any] | None = None
    shared: dict[str, str] = {}
    if own:
        results = [(host, str(src), 0, 0) for host in hosts]
    else:
        views: list[_View] = []
        opened: list[_View] = []
        try:
            token = secrets.token_hex(6)  # this staging's marks: where one host's is seen on another, they share
            marks = {h: SHARE_MARK.format(token=token, host=h) for h in hosts} if len(hosts) > 1 else {}
            with _pool(min(8, len(hosts)), progress) as pool:
                futures = [pool.submit(_open_view, site, h, root, marks.get(h)) for h in hosts]
            _collect(futures, opened)
            seen = _marks_seen(name, opened, marks) if marks else {v.host: [] for v in opened}
            shared = {v.host: seen[v.host][0] for v in opened if seen[v.host] and seen[v.host][0] != v.host}
            with _pool(min(8, len(hosts)), progress) as pool:
                futures = [pool.submit(prepare, v.host, v.fs, [marks[h] for h in seen[v.host]]) for v in opened
                           if v.host not in shared]  # fmt: skip
            _collect(futures, views)
            if progress is not None:
                progress.add(sum(want[n].size for v in views for n in v.todo))
            fan = _fanned(views, want) if len(views) > 1 else {}
            if fan:
                fanout = _fan_out(name, site, src, views, fan, want, progress)
            else:
                with _pool(min(8, len(views)), progress) as pool:
                    list(pool.map(lambda v: _copy(name, src, v, v.todo, want, progress), views))
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


@contextmanager
def _pool(workers: int, progress: StagingProgress | None) -> Iterator[ThreadPoolExecutor]:
    """A thread pool for a site's copies, left (as a plain one) only once its threads are done; when the thread
    that waits on it is stopped (Ctrl-C, SIGTERM's exit) or fails, `progress` is stopped first, so the copies end
    at their next chunk and their checksums at once. A plain pool waited for them: a launch stopped while it staged
    went on copying (minutes to hours across a slow link), or hashing what it copied, before it stopped."""
    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        yield pool
    except BaseException:
        if progress is not None:
            progress.stop()
        raise
    finally:
        pool.shutdown(wait=True)


@dataclass
class _View:
    """One host view of a site while it is staged: its files (`fs`), its site job dir, what it held before and
    what it lacks (`todo`)."""

    host: str
    fs: HostFiles
    resolved: str
    have: dict[str, FileState]
    todo: list[str]


def _copy(
    site: str, src: Path, v: _View, names: list[str], want: dict[str, FileState], progress: StagingProgress | None
) -> None:
    """Copy `names` from the operator's job dir straight to the view (SFTP / a local copy) and verify them."""
    if not names:
        return
    tick = progress.advance if progress is not None else None
    stop = progress.stopping if progress is not None else None
    resumed = [n for n in names if v.fs.put(src / n, f"{v.resolved}/{n}", progress=tick, resume=True)]
    after = v.fs.states(v.resolved, names, stop=stop)
    again = [n for n in resumed if after.get(n) != want[n]]  # an earlier partial copy of other bytes
    if again:
        log.warning("site %s: %s: %d resumed copies did not verify; copying them again", site, v.host, len(again))
        for n in again:
            v.fs.put(src / n, f"{v.resolved}/{n}", resume=False)
        after.update(v.fs.states(v.resolved, again, stop=stop))
    _verify(site, v.fs.where, v.resolved, {n: want[n] for n in names}, after)


def _collect(futures: list[Future[_View]], into: list[_View]) -> None:
    """The views the futures made go `into` (the caller closes them, whatever happens next); then the first
    failure is raised."""
    into.extend(f.result() for f in futures if f.exception() is None)
    for f in futures:
        if (e := f.exception()) is not None:
            raise e


SHARE_MARK = ".rlctl-stage-{token}-{host}"  # each host's, in its site job dir while a site is staged per host


def _open_view(site: Site, host: str, root: str, mark: str | None) -> _View:
    """The host's view, its site job dir made (and resolved), `mark` written there (`_marks_seen`)."""
    fs = host_files(site, host)
    try:
        resolved = fs.make_dirs([root])[0]
        if mark is not None:
            fs.append(f"{resolved}/{mark}", "")
    except BaseException:
        fs.close()
        raise
    return _View(host, fs, resolved, {}, [])


def _marks_seen(name: str, views: list[_View], marks: dict[str, str]) -> dict[str, list[str]]:
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


def _fanned(views: list[_View], want: dict[str, FileState]) -> dict[str, list[str]]:
    """What the site's hosts other than the first (the seed) fetch from it instead of from the operator: their
    missing files of at least FANOUT_MIN_BYTES (the secret always goes straight: the fetch authenticates with it)."""
    out = {v.host: [n for n in v.todo if want[n].size >= FANOUT_MIN_BYTES and n != "secret"] for v in views[1:]}
    return {h: ns for h, ns in out.items() if ns}


def _fan_out(
    site_name: str,
    site: Site,
    src: Path,
    views: list[_View],
    fan: dict[str, list[str]],
    want: dict[str, FileState],
    progress: StagingProgress | None,
) -> dict[str, Any]:
    """Stage a multi-host site with one copy over its link: the small files straight to every host, the large ones
    to the seed (the first host); the hosts form a tree of FANOUT_CHILDREN children per host (in inventory order,
    the seed at its root), and every host with children serves what lands in it to their fetches
    (rlctl.launch.fanout), so no host sends more than FANOUT_CHILDREN copies. A fetch that fails is tried again
    from the seed's verified copy, then copied straight from here (a warning); a relay whose server does not start
    leaves its children to the seed. Returns staged.json's `fanout` entry: the seed, the bytes the servers sent (in
    all and by host), the relays, the files copied from here instead."""
    seed, others = views[0], views[1:]
    big = {n for ns in fan.values() for n in ns} | {n for n in seed.todo if want[n].size >= FANOUT_MIN_BYTES}
    big.discard("secret")
    with _pool(min(8, len(views)), progress) as pool:  # the secret first: the fan-out needs it
        list(pool.map(lambda v: _copy(site_name, src, v, [n for n in v.todo if n not in big], want, progress), views))
    tick = progress.advance if progress is not None else None
    stop = progress.stopping if progress is not None else None
    seed_files = [n for n in seed.todo if n in big]
    parent = {views[i].host: views[(i - 1) // FANOUT_CHILDREN] for i in range(1, len(views))}
    relaying = [seed, *{parent[h].host: parent[h] for h in fan if parent[h] is not seed}.values()]
    with _pool(min(8, len(relaying)), progress) as pool:  # before any server can serve them
        list(pool.map(lambda v: _clear_stale(site, v, seed_files if v is seed else fan.get(v.host, [])), relaying))
    servers = {seed.host: _Server(site, seed)}
    try:
        servers[seed.host].start()
    except LaunchError as e:  # e.g. no rlctl in the site's python: every host's copy crosses the link
        log.warning("site %s: %s; copying to each host from here", site_name, e)
        with _pool(min(8, len(views)), progress) as pool:
            direct = [(seed, seed_files), *((v, fan.get(v.host, [])) for v in others)]
            list(pool.map(lambda vn: _copy(site_name, src, vn[0], vn[1], want, progress), direct))
        direct_n = {h: len(ns) for h, ns in fan.items()}
        return {"seed": seed.host, "served_bytes": 0, "served_by": {}, "relays": [], "direct": direct_n}
    try:
        relays = {v.host: v for v in relaying[1:]}
        with _pool(min(8, len(views)), progress) as pool:
            for host, started in zip(relays, pool.map(lambda v: _start(site, v), relays.values()), strict=True):
                if started is None:
                    log.warning("site %s: %s does not relay; its hosts fetch from %s", site_name, host, seed.host)
                else:
                    servers[host] = started

        def source(v: _View) -> str:
            return servers.get(parent[v.host].host, servers[seed.host]).address

        ahead = sum(want[n].size for n in seed_files)  # a fetch may wait for the seed's copy of all of them
        with _pool(1 + len(views), progress) as pool:
            copy = pool.submit(_copy, site_name, src, seed, seed_files, want, progress)
            fetches = {v.host: pool.submit(_fetch, site, v, fan[v.host], want, source(v), tick, ahead, stop)
                       for v in others if v.host in fan}  # fmt: skip
            try:
                copy.result()
            except BaseException:
                if progress is not None:  # first (as `_pool` would next): a fetch the seed's stop ends is stopped,
                    progress.stop()  # not a failed fetch, a warning per host of a launch the operator stopped
                for server in servers.values():  # the fetches waiting on the seed's files end now
                    server.stop()
                raise
            failed = {h: f.result() for h, f in fetches.items()}
        again = [v for v in others if failed.get(v.host)]
        for v in again:
            log.warning("site %s: %s: %d files did not arrive from %s; fetching them again from %s", site_name,
                        v.host, len(failed[v.host]), parent[v.host].host, seed.host)  # fmt: skip
            if progress is not None:
                progress.add(sum(want[n].size for n in failed[v.host]))
        with _pool(len(again), progress) as pool:  # the seed's copy is whole and verified
            address = servers[seed.host].address
            retried = pool.map(lambda v: _fetch(site, v, failed[v.host], want, address, tick, stop=stop), again)
            failed.update(zip((v.host for v in again), retried, strict=True))
    finally:
        for server in servers.values():
            server.stop()
    for v in others:
        if failed.get(v.host):
            log.warning("site %s: %s: %d files did not arrive twice; copying them from here", site_name, v.host,
                        len(failed[v.host]))  # fmt: skip
            if progress is not None:
                progress.add(sum(want[n].size for n in failed[v.host]))
            _copy(site_name, src, v, failed[v.host], want, progress)
    return {
        "seed": seed.host,
        "served_bytes": sum(server.served for server in servers.values()),
        "served_by": {h: server.served for h, server in servers.items()},
        "relays": sorted(h for h in servers if h != seed.host),
        "direct": {h: len(ns) for h, ns in failed.items() if ns},
    }


def _start(site: Site, v: _View) -> _Server | None:
    """A fan-out server on the view's host, started (None, with the reason logged, when it does not start)."""
    server = _Server(site, v)
    try:
        server.start()
    except LaunchError as e:
        log.warning("site fan-out: %s", e)
        return None
    return server


def _fetch(
    site: Site,
    v: _View,
    names: list[str],
    want: dict[str, FileState],
    source: str,
    tick: Callable[[int], None] | None,
    ahead: int = 0,
    stop: threading.Event | None = None,
) -> list[str]:
    """Run `fanout fetch` on the view's host for `names` from `source`; the names that did not arrive whole (each
    file's SHA-256 is computed there as it is written and compared with the operator's). `ahead`: bytes the
    source may copy before it has these (its deadline allows for them at the floor rate too). Once `stop` is set
    the fetch is killed there (`_fetch_script`) and StagingStopped raised: the launch waited for its next
    progress line (a resumed file's hash, up to a model's shard), and the host went on fetching after it."""
    if not names:
        return []
    ok: set[str] = set()
    errors: list[str] = []

    def line(text: str) -> None:
        row = _row(text)
        if row is None:
            return
        if tick is not None and row.get("progress"):
            tick(int(row["progress"]))
        if "path" in row and row.get("ok"):
            ok.add(str(row["path"]))
        if "error" in row:
            errors.append(str(row["error"]))

    files = json.dumps([[n, want[n].size, want[n].sha256, want[n].mode] for n in names])
    command = _fetch_script(site, f"{sh_path(v.resolved)} --source {shlex.quote(source)}")
    held = stop if stop is not None else threading.Event()  # never set: stdin stays open until the fetch ends
    deadline = FANOUT_FLOOR_S + (ahead + sum(want[n].size for n in names)) / FANOUT_FLOOR_BYTES_PER_S
    runner = SshRunner(ssh_target(site, v.host))
    try:
        res: CommandResult | LaunchError = runner.run(
            command, timeout_s=deadline, stdin=files + "\n", hold_stdin=held, on_line=line
        )
    except LaunchError as e:
        res = e
    finally:
        runner.close()
    if held.is_set():
        raise StagingStopped(f"ssh {v.host}: fetch from {source} stopped")
    if isinstance(res, LaunchError):
        log.warning("site fan-out: %s: %s", v.host, res)
    elif res.exit_code != 0:
        log.warning("site fan-out: %s: fetch from %s failed: %s", v.host, source, "; ".join(errors) or res.tail())
    return [n for n in names if n not in ok]


def _row(text: str) -> dict[str, Any] | None:
    """A JSON object line of a fan-out command's stdout (None for any other line: a site's setup may print)."""
    try:
        row = json.loads(text)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def _clear_stale(site: Site, v: _View, names: list[str]) -> None:
    """Remove the view's other versions of `names` (on its host, not the bytes wanted) before its server starts:
    a whole file of the right size would otherwise be served before the new copy replaces it."""
    stale = [n for n in names if n in v.have]
    if not stale:
        return
    runner = SshRunner(ssh_target(site, v.host))
    try:
        paths = " ".join(sh_path(f"{v.resolved}/{n}") for n in stale)
        res = runner.run(f"rm -f -- {paths}", timeout_s=FANOUT_FLOOR_S)
        if res.exit_code != 0:
            raise LaunchError(f"ssh {v.host}: could not remove the old versions of {len(stale)} files: {res.tail()}")
    finally:
        runner.close()


def _site_python(site: Site, args: str) -> str:
    """A `python -m rlctl.launch.fanout ARGS` command line for one of the site's hosts (its setup lines first)."""
    return "\n".join([*site_setup(site.setup), f"exec {shlex.quote(python_for(site))} -m rlctl.launch.fanout {args}"])


def _fetch_script(site: Site, args: str) -> str:
    """`python -m rlctl.launch.fanout fetch ARGS` on a host of the site, given the first line of the command's stdin
    (the files, as JSON) and killed there by a watcher when the rest of its stdin ends: the operator ends it to
    stop (`_fetch`'s `stop`), and sshd does when the connection goes, where the fetch went on until it next wrote
    to the closed connection. Exits with the fetch's status (143 when killed)."""
    return "\n".join([
        *site_setup(site.setup),
        "exec 3<&0",  # the command's stdin: an asynchronous list's own is /dev/null
        "IFS= read -r files",
        f"{shlex.quote(python_for(site))} -m rlctl.launch.fanout fetch {args} <<EOF & fetcher=$!",
        "$files",
        "EOF",
        "(while read -r _; do :; done <&3; kill $fetcher 2>/dev/null) & watcher=$!",
        "wait $fetcher; rc=$?",
        "kill $watcher 2>/dev/null",
        'exit "$rc"',
    ])  # fmt: skip


class _Server:
    """`fanout serve` on a host of the site (the seed, or a relay) from `start` to `stop` (its stdin is held open
    until then)."""

    def __init__(self, site: Site, seed: _View) -> None:
        self.runner = SshRunner(ssh_target(site, seed.host))
        self.command = _site_python(site, f"serve {sh_path(seed.resolved)} --advertise {shlex.quote(seed.host)}")
        self.where = seed.host
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._result: list[CommandResult | LaunchError] = []
        self.address = ""
        self.served = 0

    def _line(self, text: str) -> None:
        row = _row(text)
        if row is None:
            return
        if "listening" in row:
            self.address = str(row["listening"])
            self._listening.set()
        self.served = int(row.get("served", self.served))

    def _run(self) -> None:
        try:
            res = self.runner.run(self.command, timeout_s=None, on_line=self._line, hold_stdin=self._stop)
            self._result.append(res)
        except LaunchError as e:
            self._result.append(e)
        finally:
            self._listening.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fanout-seed", daemon=True)
        self._thread.start()
        self._listening.wait(FANOUT_FLOOR_S)
        if not self.address:
            self.stop()
            why = self._result[0] if self._result else "no answer"
            if isinstance(why, CommandResult):
                why = f"exit {why.exit_code}: {why.tail()}"
            raise LaunchError(f"ssh {self.where}: the fan-out server did not start ({why})")

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=FANOUT_FLOOR_S)
        self.runner.close()
        if self.address:
            log.info("site fan-out: %s served %d B to the site's other hosts", self.where, self.served)


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


def _verify(site: str, where: str, root: str, want: dict[str, FileState], have: dict[str, FileState]) -> None:
    for n, w in want.items():
        h = have.get(n)
        path = f"site {site}: {where}:{root}/{n}"
        if h is None:
            raise LaunchError(f"{path}: missing after the copy")
        if h.size != w.size:
            raise LaunchError(f"{path}: {h.size} bytes after the copy, {w.size} here")
        if h.sha256 != w.sha256:
            raise LaunchError(f"{path}: SHA-256 {h.sha256[:12]}… after the copy, {w.sha256[:12]}… here")
        if n == "secret" and h.mode != SECRET_MODE:
            raise LaunchError(f"{path}: mode {h.mode:o} after the copy, must be 600")


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


def read_plan(job_dir: Path) -> dict[str, Any] | None:
    """The job's plan.json (None before `prepare` wrote it); LaunchError naming the file when it is not an object."""
    p = job_dir / "plan.json"
    if not p.is_file():
        return None
    data = json_file(p)
    if not isinstance(data, dict):
        raise LaunchError(f"{p}: not a JSON object")
    return data


def plan_site(job_dir: Path, plan: dict[str, Any], *keys: str) -> str:
    """The site name at `keys` in `plan` (plan.json of `job_dir`); LaunchError naming the field when it is not one."""
    value: Any = plan
    for k in keys:
        value = value.get(k) if isinstance(value, dict) else None
    if not isinstance(value, str):
        raise LaunchError(f"{job_dir / 'plan.json'}: {'.'.join(keys)} is not a site name")
    return value


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


class StagingProgress:
    """Bytes a site's copy has to move and has moved (every host's, from their threads), reported through `say`
    at most every `interval_s`: done / total, the rate, the time left; and through `show` (a terminal's live line,
    when there is one) as a bar at most every BAR_INTERVAL_S."""

    def __init__(
        self,
        site: str,
        say: Callable[[str], None],
        *,
        show: Callable[[str], None] | None = None,
        interval_s: float = PROGRESS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.site, self.say, self.show, self.interval_s, self.clock = site, say, show, interval_s, clock
        self.total = self.moved = 0
        self._lock = threading.Lock()
        self._t0 = self._last = self._shown = clock()
        self._stopping = threading.Event()

    def stop(self) -> None:
        """The launch is stopping: every copy that reports here raises StagingStopped at its next chunk, and every
        checksum given `stopping` soon."""
        self._stopping.set()

    @property
    def stopping(self) -> threading.Event:
        """Set once the launch is stopping (`stop`): what a site view's checksums watch (HostFiles.states)."""
        return self._stopping

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.total += nbytes

    def advance(self, nbytes: int) -> None:
        if self._stopping.is_set():
            raise StagingStopped(f"staging {self.site}: stopped")
        with self._lock:
            self.moved += nbytes
            now = self.clock()
            bar = self.bar(now) if self.show is not None and now - self._shown >= BAR_INTERVAL_S else None
            if bar is not None:
                self._shown = now
            line = None
            if now - self._last >= self.interval_s:
                self._last = now
                line = self.line(now)
        if bar is not None and self.show is not None:
            self.show(bar)
        if line is not None:
            self.say(line)

    def bar(self, now: float, width: int = 30) -> str:
        """`staging gen [██████········] 1.00 GB / 3.00 GB  100 MB/s  ≈ 20 s left`"""
        frac = min(self.moved / self.total, 1.0) if self.total else 1.0
        full = round(frac * width)
        rate = self.moved / max(now - self._t0, 1e-9)
        left = f"≈ {duration((self.total - self.moved) / rate)} left" if rate > 0 else ""
        return (
            f"staging {self.site} [{'█' * full}{'·' * (width - full)}] {_gb(self.moved)} / {_gb(self.total)}  "
            f"{rate / 1e6:.0f} MB/s  {left}"
        ).rstrip()

    def line(self, now: float) -> str:
        spent = max(now - self._t0, 1e-9)
        rate = self.moved / spent
        left = (self.total - self.moved) / rate if rate > 0 else float("inf")
        pct = 100 * self.moved / self.total if self.total else 100.0
        eta = f"≈ {duration(left)} left" if left != float("inf") else "waiting for the first bytes"
        return (
            f"staging {self.site}: {_gb(self.moved)} of {_gb(self.total)} ({pct:.0f} %), {rate / 1e6:.0f} MB/s, {eta}"
        )

    def done(self) -> None:
        """The closing line, when anything was copied."""
        if self.total:
            spent = self.clock() - self._t0
            rate = self.moved / spent if spent > 0 else 0.0
            self.say(f"staging {self.site}: {_gb(self.moved)} copied in {duration(spent)} ({rate / 1e6:.0f} MB/s)")


def _gb(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 10**8 else f"{nbytes / 1e6:.1f} MB"


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


# -- the job's record on the controller's site ----------------------------------------------------------
def here_root(site: Site, root: str, job_dir: Path) -> str:
    """The site job dir `root` staged.json names, for the operator's job dir `job_dir` as it is now: a site with no
    work root keeps the job's files in the operator's job dir, wherever that dir is now — a copied or moved job dir
    is its own record, not the one it was copied from (its status overwrote the copy's record with the original's,
    and its stop wrote the original's events)."""
    return str(job_dir) if not is_remote(site) and kind_of(site).work_root(site) is None else root


def record_is_here(site: Site, root: str, job_dir: Path) -> bool:
    """Whether the site job dir `root` is the operator's job dir `job_dir` itself: this machine's filesystem and the
    same directory once links are resolved (a job dir reached through a symlink, `~/jobs` -> `/scratch/jobs`, is not
    another site's record to fetch)."""
    return not is_remote(site) and os.path.realpath(root) == os.path.realpath(job_dir)


def controller_view(
    staged: dict[str, Any], sites: dict[str, Site], controller_site: str, host: str | None
) -> tuple[Site, str, str]:
    """(site, host view, site job dir) where the controller writes the job's record."""
    roots: Roots = staged[controller_site]["roots"]
    view = host if host in roots else next(iter(roots))
    return sites[controller_site], view, roots[view]


def fetch_record(job_dir: Path, site: Site, host: str, root: str) -> list[str]:
    """Copy the controller's record (summary, controller.json; its events, by what they grew, merged into the
    operator's), its logs (APPENDED_LOGS: metrics, evaluations, samples, by what they grew) and the tracker files
    (TRACKER_DIRS) into the operator's job dir; nothing to do when the controller's site job dir is this one.
    Returns the names fetched."""
    if record_is_here(site, root, job_dir):
        return []
    fs = host_files(site, host)
    fetched = []
    try:
        for name in RECORD_FILES:
            text = fs.read_text(f"{root}/{name}")
            if text is None:
                continue
            if name == "summary.json":
                text = _with_launchers_keys(job_dir / name, text)
            replace_text(job_dir / name, text)
            fetched.append(name)
        mirror = job_dir / SITE_EVENTS  # the site's events as they are there; merged into the operator's
        if fetch_appended(fs, f"{root}/{EVENTS}", mirror):
            # an event appended here meanwhile would go with the file replaced
            with appending(job_dir / EVENTS) as events:
                new = eventtail.tail(job_dir / EVENTS, mirror)  # the site's new lines, where they merge as such
                if new is None:
                    replace_text(job_dir / EVENTS, _merge_lines(job_dir / EVENTS, mirror))
                else:
                    events.write(new)
                    events.flush()
                eventtail.mark(job_dir / EVENTS, mirror)
            fetched.append(EVENTS)
        fetched += [name for name in APPENDED_LOGS if fetch_appended(fs, f"{root}/{name}", job_dir / name)]
        for tree in TRACKER_DIRS:  # after the record: a tracker file that goes away meanwhile costs only itself
            for rel in fs.list_files(f"{root}/{tree}"):
                dst = job_dir / tree / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                try:
                    fs.get(f"{root}/{tree}/{rel}", dst)
                except LaunchError as e:  # a tracker's temporary file, removed since the listing
                    log.info("tracker file %s/%s not fetched: %s", tree, rel, e)
                    continue
                fetched.append(f"{tree}/{rel}")
    finally:
        fs.close()
    return fetched


def _with_launchers_keys(here: Path, fetched: str) -> str:
    """The controller's summary.json as fetched, with `LAUNCHER_SUMMARY_KEYS` of the copy `here` when that is the
    same run's (its `run` id): before, a fetch again replaced them, so `rlctl status` of a finished job whose
    controller ran on another site took its held-out figures out of summary.json (and `rlctl report`)."""
    try:
        mine, theirs = json.loads(here.read_text()), json.loads(fetched)
    except (OSError, ValueError):
        return fetched
    if not (isinstance(mine, dict) and isinstance(theirs, dict)) or mine.get("run") is None:
        return fetched
    if mine["run"] != theirs.get("run"):
        return fetched
    kept = {k: mine[k] for k in LAUNCHER_SUMMARY_KEYS if k in mine}
    return json.dumps({**theirs, **kept}, indent=2, default=str) + "\n"


def event_to_record(job_dir: Path, row: dict[str, Any], view: tuple[Site, str, str] | None = None) -> None:
    """The event `row`, appended here already (`JobDir.event`), appended to the controller's own record too where
    that is on another site (`view`, else `record_view`): the controller reads only its own events, and a stop it
    does not see there makes its SIGTERM a failure (`failed: controller got SIGTERM`) that every fetch of its record
    brings back here. The same line as here: a fetch merges the two as one. A site that does not answer is logged
    (the launcher then says `stopped` for the controller in the summary it fetched)."""
    try:
        view = view or record_view(job_dir)
    except LaunchError as e:
        log.warning("the %s event is not on the controller's site: %s", row.get("event"), e)
        return
    if view is None:
        return
    site, host, root = view
    if record_is_here(site, root, job_dir):
        return
    try:
        fs = host_files(site, host)
        try:
            fs.append(f"{root}/{EVENTS}", json.dumps(row, default=str) + "\n")
        finally:
            fs.close()
    except (LaunchError, OSError) as e:
        log.warning("the %s event is not on the controller's site (%s): %s", row.get("event"), host, e)


def fetch_appended(fs: HostFiles, path: str, local: Path) -> bool:
    """Bring the local copy of a log the host only appends to up to date, whole lines only: the bytes past the
    copy where it is a prefix of the host's file (its last TAIL_MATCH_BYTES equal the host's at the same offset),
    else the whole file (a resume cut the log back). True when lines arrived."""
    have = local.stat().st_size if local.exists() else 0
    probe = fs.read_from(path, max(0, have - TAIL_MATCH_BYTES), min(have, TAIL_MATCH_BYTES))
    if probe is None:
        return False
    data, size = probe
    if have and (size < have or data != _tail(local, len(data))):
        have = 0
    if size <= have:
        return False
    part = local.with_name(local.name + ".part")
    try:
        fs.get_range(path, part, have, size)
        whole = _whole_lines(part)  # the controller may be writing its last line
        if not whole:
            return False
        os.truncate(part, whole)
        if have:
            with part.open("rb") as src, local.open("ab") as dst:
                shutil.copyfileobj(src, dst)
        else:
            os.replace(part, local)
    finally:
        part.unlink(missing_ok=True)
    return True


def _tail(path: Path, n: int) -> bytes:
    """The file's last `n` bytes."""
    with path.open("rb") as f:
        f.seek(f.seek(0, os.SEEK_END) - n)
        return f.read(n)


def _whole_lines(path: Path) -> int:
    """The length of the file's whole lines (up to and with its last newline)."""
    size = path.stat().st_size
    with path.open("rb") as f:
        end = size
        while end > 0:
            start = max(0, end - (1 << 20))
            f.seek(start)
            i = f.read(end - start).rfind(b"\n")
            if i >= 0:
                return start + i + 1
            end = start
    return 0


def _merge_lines(local: Path, remote: Path) -> str:
    """Both event logs as one, ordered by time, each event once (fetching twice adds nothing). A line that is not
    a JSON object (an append cut short by a full disk, the next one on the same line) is left out, with a warning
    naming the file and line, and kept in `<events>.damaged` (once: a later merge reads the site's again): the
    merged log reads again (`rlctl status`). An object without a usable time (null, text: an older version's row or
    an edited one) is an event all the same, at time 0 (`event_time`: before anything), as every reader takes it."""
    mine = local.read_text().splitlines() if local.exists() else []
    seen = set(mine)
    theirs = [(remote, n, line) for n, line in enumerate(remote.read_text().splitlines(), 1) if line not in seen]
    rows, bad = [], []
    for i, (path, n, line) in enumerate([(local, n, line) for n, line in enumerate(mine, 1)] + theirs):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict):
            rows.append((event_time(row), i, line))
        else:
            bad.append((f"{path}: line {n}", line))
    damaged = local.with_name(local.name + ".damaged")
    # the site's copy keeps its damaged lines, and every merge reads them again: each is kept and said once
    kept = set(damaged.read_text().splitlines()) if damaged.exists() else set()
    bad = [(where, line) for where, line in bad if line not in kept]
    if bad:
        with damaged.open("a") as f:
            f.write("".join(line + "\n" for _, line in bad))
        more = f" (and {len(bad) - 1} more)" if bad[1:] else ""
        log.warning("%s is not a JSON event: left out of the merged events%s, kept in %s", bad[0][0], more, damaged)
    return "".join(line + "\n" for _, _, line in sorted(rows))


def remote_agent_lines(job_dir: Path, site: Site, host: str, root: str) -> str:
    """The controller site's agents.jsonl ('' when it is the operator's own file or missing)."""
    if record_is_here(site, root, job_dir):
        return ""
    fs = host_files(site, host)
    try:
        return fs.read_text(f"{root}/{AGENTS_FILE}") or ""
    finally:
        fs.close()


def record_view(job_dir: Path) -> tuple[Site, str, str] | None:
    """Where the controller of the job in `job_dir` (the operator's) keeps the record; None before staging."""
    staged = read_staged(job_dir)
    plan = read_plan(job_dir)
    if not staged or plan is None:
        return None
    cs = plan_site(job_dir, plan, "controller_site")
    sites = read_sites(job_dir)
    if cs not in staged or cs not in sites:
        return None
    local = job_dir / AGENTS_FILE
    # only the controller's host is wanted here: a damaged line of the record is its readers' to say (the stop's,
    # which stops every agent it can read, those recorded on the controller's site among them)
    rows = agents_from_lines(local.read_text(), skipped=[]) if local.exists() else []
    host = next((h.ident.get("host") for h in rows if h.spec.role == "controller"), None)
    site, view, root = controller_view(staged, sites, cs, host)
    return site, view, here_root(site, root, job_dir)


def _recorded_text(job_dir: Path, problems: list[str] | None) -> str:
    """The agent records' lines: the operator's agents.jsonl, then the controller site's (when that is elsewhere);
    a controller site that does not answer, or a record here that does not say where it is, leaves only the first,
    with a warning (a line in `problems` instead, when given)."""
    local = job_dir / AGENTS_FILE
    text = local.read_text() if local.exists() else ""
    try:
        view = record_view(job_dir)
        if view is not None:
            text += remote_agent_lines(job_dir, *view)
    except LaunchError as e:
        if problems is None:
            log.warning("the controller site's agent record is unreachable (%s); using the local one", e)
        else:
            problems.append(f"the controller site's agent record is unreachable ({e}); stopped those recorded here")
    return text


def all_recorded_agents(
    job_dir: Path, problems: list[str] | None = None, *, skipped: list[str] | None = None
) -> list[AgentHandle]:
    """Every agent of the job: those the operator's launch started (its agents.jsonl) and those the controller
    started on scale (the controller site's agents.jsonl, when that is elsewhere; `_recorded_text`). A line that is
    no agent record raises LaunchError, or, given `skipped`, is left out and said there (a stop stops every agent it
    can read)."""
    return agents_from_lines(_recorded_text(job_dir, problems), source=job_dir / AGENTS_FILE, skipped=skipped)


def agents_and_latest_run(
    job_dir: Path, problems: list[str], *, skipped: list[str]
) -> tuple[list[AgentHandle], set[str] | None]:
    """`all_recorded_agents` and `latest_run_names` from one reading of the records (a remote controller site's is
    one SSH fetch): what `rlctl stop` stops, and which of them it lists."""
    text = _recorded_text(job_dir, problems)
    return agents_from_lines(text, source=job_dir / AGENTS_FILE, skipped=skipped), run_names(text)


def latest_run_names(job_dir: Path) -> set[str] | None:
    """The names of the agents of the job's latest run: those recorded since its last controller record (in
    agents.jsonl, and on the controller's site where that keeps its own: the units its controller started on scale);
    None when none records a controller. A line that is no record is passed over (its readers say it). Not the
    handles' order: a name a later run records again keeps its first run's place among them."""
    return run_names(_recorded_text(job_dir, []))  # a site that does not answer: the agents recorded here


def run_names(text: str) -> set[str] | None:
    """`latest_run_names` of the records' lines (an agents.jsonl's text)."""
    names: set[str] | None = None
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            d = json.loads(line)
            if not isinstance(d, dict):
                continue
            if d.get("role") == "controller":
                names = set()
            if names is not None and isinstance(d.get("name"), str):
                names.add(d["name"])
    return names


def readable_agents(job_dir: Path) -> list[AgentHandle]:
    """`all_recorded_agents` for a reader that acts on what it can read (status, attach, logs): a line that is no
    agent record (cut short by a full disk, it stays in the file for good) is left out and said once."""
    return readable_agents_and_run(job_dir)[0]


def readable_agents_and_run(job_dir: Path) -> tuple[list[AgentHandle], set[str] | None]:
    """`readable_agents` and `latest_run_names` from one reading of the records (a remote controller site's is one
    SSH fetch)."""
    skipped: list[str] = []
    text = _recorded_text(job_dir, None)
    handles = agents_from_lines(text, source=job_dir / AGENTS_FILE, skipped=skipped)
    say_once(skipped)
    return handles, run_names(text)
