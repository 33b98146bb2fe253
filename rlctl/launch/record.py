"""The job's record on the controller's site, and bringing it back here. The record (events, metrics, summary,
controller.json, the sample log) is written by the controller on its site; `fetch_record` brings it to the
operator's job dir (the logs by the bytes they grew since the last fetch: `fetch_appended`; the site's events
merged into the operator's: `_merge_lines`, rlctl.launch.eventtail), and `event_to_record` puts an event written
here on it too."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from rlctl.config.inventory import Site
from rlctl.errors import LaunchError
from rlctl.launch import eventtail
from rlctl.launch.backends import AGENTS_FILE, agents_from_lines, kind_of, read_sites
from rlctl.launch.jobdir import JobDir, appending, event_time, record_text, replace_text
from rlctl.launch.locks import flock, open_lock
from rlctl.launch.sitefs import HostFiles, host_files, is_remote
from rlctl.launch.stage import Roots, read_staged
from rlctl.launch.summary import parse_summary, read_summary, replace_damaged

log = logging.getLogger(__name__)

RECORD_FILES = ("controller.json", "summary.json")
# what the launcher writes into its copy of a run's summary.json: the held-out figures (`add_heldout`), the exits of
# its own agents (`JobRun._record_exits`), the first trainer rank that ended and a stop the controller did not see
# (`state`), and where a copy of it that did not read is kept (`summary_damaged`: `update_summary`, `_damaged_kept`);
# kept when the controller's copy of the same run is fetched again (every `rlctl status` of a job whose controller
# ran on another site)
LAUNCHER_SUMMARY_KEYS = ("heldout", "agent_exits", "trainer_ranks_ended", "state", "summary_damaged")
EVENTS = "events.jsonl"  # the controller's site's and the operator's, merged here
SITE_EVENTS = ".site-events.jsonl"  # the controller's site's events.jsonl as fetched (by what it grew)
# beside them: one write of a fetch, a launcher's summary write or a resume's move of it at a time (`fetching`); it
# holds the number of those moves
FETCH_LOCK = ".record-fetch.lock"
FETCH_TRIES = 4  # reads of a log whose copy here other fetches wrote meanwhile, before it is left (`fetch_appended`)
TRACKER_DIRS = ("tensorboard", "wandb")  # what rlctl.tracking writes under the controller's job dir
# logs the controller appends to (cut back only by a resume), fetched by the bytes they grew since the last fetch
APPENDED_LOGS = tuple(
    f"{name}{cut}.jsonl" for name in ("metrics", "evaluations", "samples") for cut in ("", ".discarded")
)
TAIL_MATCH_BYTES = 64 << 10  # a local copy whose last bytes match the host's at the same offset is a prefix of it


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
    Returns the names fetched. The site is read with no lock held, and each write here under the fetch lock
    (`fetching`), versus that lock held across the whole fetch: a site that did not answer (each of its reads up to
    its timeout) held it for minutes, and the launcher's summary writes (a `rlctl stop`'s record of its agents'
    exits: `update_summary`) and a resume's moves of the summary waited behind it."""
    if record_is_here(site, root, job_dir):
        return []
    fs = host_files(site, host)
    try:
        return _fetch(job_dir, fs, host, root)
    finally:
        fs.close()


@contextlib.contextmanager
def fetching(job_dir: Path, *, moving: bool = False) -> Iterator[None]:
    """One writer of the fetched record into `job_dir` at a time (an exclusive flock on FETCH_LOCK, waited for):
    `rlctl status` or `stop` while the job's launcher fetches as its run ends, or a `launch --resume` as it takes the
    job over, each read how much of a log was here and appended what was past it (a row appended twice).
    The launcher's own read-change-write of summary.json (`rlctl.ops.runstate.update_summary`) holds it too: a fetch
    reads that file, adds the launcher's keys to the controller's copy and writes it back (`_with_launchers_keys`),
    and a key written in between was lost. A resume's moves of summary.json (aside as its run starts, here and on
    the controller's site; back where it never started: `rlctl.ops.runstart`) hold it `moving`: each counts one more
    move in FETCH_LOCK (`_moves`), and a fetch whose read of the site came before a move writes no record file
    (the run before's summary back over the move). Only local files are read and written inside: a fetch reads the
    site before it (`fetch_record`). Not reentrant (a flock per open file): no holder takes it again, nor the
    launcher lock (taken without waiting). Where the filesystem has no flock it goes unlocked, as `appending` does.
    A FETCH_LOCK that cannot be opened (another user's job dir, a read-only mount) is a LaunchError, one line naming
    it (`_fetch_lock`)."""
    with _fetch_lock(job_dir) as f:
        flock(f, fcntl.LOCK_EX)  # (none on this filesystem: unlocked)
        if moving:
            f.seek(0)
            moves = int(f.read().strip() or 0) + 1
            f.truncate(0)
            f.write(f"{moves}\n")
            f.flush()
        yield  # (the lock goes with the file's close)


def _moves(job_dir: Path) -> str:
    """How many moves of the summary `fetching` counted (the text of FETCH_LOCK; "" for none). Read before a fetch
    reads the site: a job dir whose fetch lock cannot be opened is said (`_fetch_lock`) before the site is asked for
    a record that could not be written here."""
    with _fetch_lock(job_dir) as f:
        f.seek(0)
        return f.read().strip()


def _fetch_lock(job_dir: Path) -> TextIO:
    """FETCH_LOCK open (made where missing); a LaunchError, one line naming it, where it cannot be (another user's job
    dir, a read-only mount), versus the OSError's traceback (a launcher's stop or end, which say a LaunchError of the
    fetch as a problem; its summary writes: `update_summary`) or a warning naming no lock (`rlctl status`, `stop`:
    '[Errno 13] Permission denied: …', as if the controller's site had not answered)."""
    return open_lock(
        job_dir / FETCH_LOCK,
        what="the lock of the job's record fetch",
        why="the job's record is fetched into the job dir",
        error=LaunchError,
    )


def _fetch(job_dir: Path, fs: HostFiles, host: str, root: str) -> list[str]:
    moves = _moves(job_dir)  # before the site is read: a move after it makes what was read the run before's
    texts = {name: text for name in RECORD_FILES if (text := fs.read_text(f"{root}/{name}")) is not None}
    fetched = []
    with fetching(job_dir):
        if _moves(job_dir) != moves:
            log.info("%s: the summary was moved as the record was fetched; %s fetched next time", job_dir, list(texts))
            texts = {}
        for name, text in texts.items():
            if name == "summary.json":
                merged = _with_launchers_keys(job_dir / name, text, source=f"{host}:{root}/{name}")
                if merged is None:  # the controller's copy does not read and a copy is here, or the copy here
                    # cannot be read: that one stays
                    continue
                text, damage = merged
                if damage:  # the copy here does not read: kept aside whole, the fetched one says where
                    _damaged_kept(job_dir / name, text, damage)
                    fetched.append(name)
                    continue
            replace_text(job_dir / name, text)
            fetched.append(name)
    mirror = job_dir / SITE_EVENTS  # the site's events as they are there; merged into the operator's
    if fetch_appended(fs, f"{root}/{EVENTS}", mirror, then=lambda: _merge_events(job_dir / EVENTS, mirror)):
        fetched.append(EVENTS)
    fetched += [name for name in APPENDED_LOGS if fetch_appended(fs, f"{root}/{name}", job_dir / name)]
    for tree in TRACKER_DIRS:  # after the record: a tracker file that goes away meanwhile costs only itself
        for rel in fs.list_files(f"{root}/{tree}"):
            dst = job_dir / tree / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            part = _own_part(dst)  # renamed into place: another fetch's copy of it is whole too
            try:
                fs.get(f"{root}/{tree}/{rel}", part)
                os.replace(part, dst)
            except LaunchError as e:  # a tracker's temporary file, removed since the listing
                log.info("tracker file %s/%s not fetched: %s", tree, rel, e)
                continue
            finally:
                part.unlink(missing_ok=True)
            fetched.append(f"{tree}/{rel}")
    return fetched


def _merge_events(events: Path, mirror: Path) -> None:
    """The site's events as fetched (`mirror`) merged into the operator's `events` (under the fetch lock)."""
    with appending(events) as f:  # an event appended here meanwhile would go with the file replaced
        new = eventtail.tail(events, mirror)  # the site's new lines, where they merge as such
        if new is None:
            replace_text(events, _merge_lines(events, mirror))
        else:
            f.write(new)
            f.flush()
        eventtail.mark(events, mirror)


_SAID_FETCHED_DAMAGED: set[str] = set()  # the controller's summaries that do not read this process said it skipped


def _with_launchers_keys(here: Path, fetched: str, *, source: str) -> tuple[str, str] | None:
    """(text, damage): the controller's summary.json as fetched, with `LAUNCHER_SUMMARY_KEYS` of the copy `here` when
    that is the same run's (its `run` id): before, a fetch again replaced them, so `rlctl status` of a finished job
    whose controller ran on another site took its held-out figures out of summary.json (and `rlctl report`). `damage`
    says how the copy here does not read ("" where it does or there is none): the caller keeps it aside whole
    (`_damaged_kept`), as `rlctl.ops.runstate.update_summary` does, versus replaced by the fetched one: the launcher's
    keys it held were gone. A fetched one (from `source`) that does not read is written only where there is no copy
    here (the run's end is then read from the events, and the launcher's keys written with it: `update_summary`);
    None where there is one, damaged or not, or one that cannot be read (`_unread_here`): it stays, and the skip is
    said once a process, versus the damaged copy written over it (its launcher's keys, the held-out figures among
    them, lost) or, where the copy here was that same damage written by the fetch before, moved aside and written
    again: one more summary.json.damaged.N every `rlctl status` (every poll of `status -w`)."""
    theirs, problem = parse_summary(fetched)
    try:
        read = read_summary(here)  # (None: none here)
    except OSError as e:  # one here that cannot be read (its permissions, the disk): it stays, versus taken for none
        # and the fetched one renamed over it, its launcher's keys lost
        _unread_here(here, source, e)
        return None
    if read is None:
        return fetched, ""
    mine, damage = read
    if theirs is None:
        _kept_here(here, source, problem)
        return None
    if mine is None:
        return fetched, damage
    if mine.get("run") is None or mine["run"] != theirs.get("run"):
        return fetched, ""
    kept = {k: mine[k] for k in LAUNCHER_SUMMARY_KEYS if k in mine}
    return json.dumps({**theirs, **kept}, indent=2, default=str) + "\n", ""


def _kept_here(here: Path, source: str, problem: str) -> None:
    """The controller's summary.json at `source` does not read (`problem`): `here` is kept as it is, once said."""
    said = f"{source}: {problem}"
    if said not in _SAID_FETCHED_DAMAGED:
        _SAID_FETCHED_DAMAGED.add(said)
        log.warning("the controller's summary %s; not fetched, %s kept as it is", said, here)


def _unread_here(here: Path, source: str, e: OSError) -> None:
    """The summary.json `here` cannot be read (`e`: its permissions, the disk): kept as it is, the controller's copy
    at `source` not fetched over it, once said."""
    said = f"{here}: cannot be read ({e.strerror or e})"
    if said not in _SAID_FETCHED_DAMAGED:
        _SAID_FETCHED_DAMAGED.add(said)
        log.warning("%s; kept as it is, the controller's summary %s not fetched over it", said, source)


def _damaged_kept(here: Path, fetched: str, problem: str) -> None:
    """`here`, a summary.json that does not read (`problem`), kept aside whole; the fetched copy (which reads:
    `_with_launchers_keys`) written in its place, saying where (`replace_damaged`)."""
    aside, _ = replace_damaged(here, json.loads(fetched), problem=problem)
    log.warning("%s: %s; kept as %s, the controller's copy fetched in its place", here, problem, aside)


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


def fetch_appended(fs: HostFiles, path: str, local: Path, *, then: Callable[[], None] | None = None) -> bool:
    """Bring the local copy of a log the host only appends to up to date, whole lines only: the bytes past the
    copy where it is a prefix of the host's file (its last TAIL_MATCH_BYTES equal the host's at the same offset),
    else the whole file (a resume cut the log back). True when lines arrived. The host is read with no lock held;
    the lines are written here, and `then` called, under the fetch lock (`fetching`), where the copy here is still
    as it was when the host was read; one another fetch wrote meanwhile is read against again (up to FETCH_TRIES
    times, then left to the next fetch, said)."""
    for _ in range(FETCH_TRIES):
        seen = _state(local)
        have = seen[2] if seen else 0
        probe = fs.read_from(path, max(0, have - TAIL_MATCH_BYTES), min(have, TAIL_MATCH_BYTES))
        if probe is None:
            return False
        data, size = probe
        if have and (size < have or data != _bytes_before(local, have, len(data))):
            have = 0
        if size <= have:
            return False
        part = _own_part(local)
        try:
            fs.get_range(path, part, have, size)
            whole = _whole_lines(part)  # the controller may be writing its last line
            if not whole:
                return False
            os.truncate(part, whole)
            with fetching(local.parent):
                if _state(local) != seen:  # another fetch wrote it since it was read: read against it again
                    continue
                if have:
                    with part.open("rb") as src, local.open("ab") as dst:
                        shutil.copyfileobj(src, dst)
                else:
                    os.replace(part, local)
                if then is not None:
                    then()
            return True
        finally:
            part.unlink(missing_ok=True)
    log.info("%s: written by other fetches as this one read %s, %d times; fetched next time", local, path, FETCH_TRIES)
    return False


def _state(path: Path) -> tuple[int, int, int] | None:
    """(inode, modification time, size) of `path`: an append, or the file replaced, changes it; None for none."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _own_part(path: Path) -> Path:
    """This fetch's own temporary name beside `path` (its process and thread: fetches at once write one each; no
    tracker's name in it, which TensorBoard would read as a run's events)."""
    return path.with_name(f".fetch-{os.getpid()}-{threading.get_ident()}.part")


def _bytes_before(path: Path, end: int, n: int) -> bytes:
    """The `n` bytes of the file before offset `end`."""
    with path.open("rb") as f:
        f.seek(end - n)
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
    mine = record_text(local).splitlines() if local.exists() else []
    seen = set(mine)
    theirs = [(remote, n, line) for n, line in enumerate(record_text(remote).splitlines(), 1) if line not in seen]
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


def record_view(job_dir: Path) -> tuple[Site, str, str] | None:
    """Where the controller of the job in `job_dir` (the operator's) keeps the record; None before staging."""
    staged = read_staged(job_dir)
    jd = JobDir(job_dir)
    plan = jd.read_plan_or_none()
    if not staged or plan is None:
        return None
    cs = jd.plan_site(plan, "controller_site")
    sites = read_sites(job_dir)
    if cs not in staged or cs not in sites:
        return None
    local = job_dir / AGENTS_FILE
    # only the controller's host is wanted here: a damaged line of the record is its readers' to say (the stop's,
    # which stops every agent it can read, those recorded on the controller's site among them)
    rows = agents_from_lines(record_text(local), skipped=[]) if local.exists() else []
    host = next((h.ident.get("host") for h in rows if h.spec.role == "controller"), None)
    site, view, root = controller_view(staged, sites, cs, host)
    return site, view, here_root(site, root, job_dir)
