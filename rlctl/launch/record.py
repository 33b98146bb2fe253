"""The job's record on the controller's site, and bringing it back here. The record (events, metrics, summary,
controller.json, the sample log) is written by the controller on its site; `fetch_record` brings it to the
operator's job dir (the logs by the bytes they grew since the last fetch: `fetch_appended`; the site's events
merged into the operator's: `_merge_lines`, rlctl.launch.eventtail), and `event_to_record` puts an event written
here on it too."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import shlex
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlctl import procfs
from rlctl.config.inventory import Site
from rlctl.errors import LaunchError
from rlctl.launch import eventtail
from rlctl.launch.backends import AGENTS_FILE, agents_from_lines, kind_of, read_sites
from rlctl.launch.jobdir import JobDir, event_time
from rlctl.launch.locks import flock, open_lock
from rlctl.launch.recordfiles import appending, open_record, record_text, replace_lines, replace_text
from rlctl.launch.sitefs import HostFiles, host_files, is_remote
from rlctl.launch.spillsort import SpillSort
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
# beside them: one fetch, or a resume's move of the summary, at a time (`fetching`); then, inside it where both are
# held, one read-change-write of summary.json here at a time (`summary_lock`)
FETCH_LOCK = ".record-fetch.lock"
SUMMARY_LOCK = ".summary.lock"
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
    Returns the names fetched. The whole fetch holds the fetch lock (`fetching`); its read-change-write of the
    summary here holds the summary lock too (`summary_lock`), which the launcher's summary writes (a `rlctl stop`'s
    record of its agents' exits: `rlctl.ops.runstate.update_summary`) take alone: they wait for that short write,
    never for the site (whose reads, where it does not answer, each run up to its timeout: minutes)."""
    if record_is_here(site, root, job_dir):
        return []
    with fetching(job_dir):
        return _fetch(job_dir, site, host, root)


@contextlib.contextmanager
def fetching(job_dir: Path) -> Iterator[None]:
    """One fetch into `job_dir` at a time (an exclusive flock on FETCH_LOCK, waited for, held across the fetch's
    reads of the site): `rlctl status` or `stop` while the job's launcher fetches as its run ends, or a `launch
    --resume` as it takes the job over, each read how much of a log was here and appended what was past it (a row
    appended twice; where the filesystem has no flock, each appends only to a copy as long as it read it, through a
    `.part` of its own: `fetch_appended`). A resume's moves of summary.json (aside as its run starts, here and on
    the controller's site; back where it never started: `rlctl.ops.runstart`) hold it too: a fetch that read the run
    before's summary on the site before the move wrote it here after it (taken for the new run's end). Lock order:
    FETCH_LOCK, then SUMMARY_LOCK (`summary_lock`), never the reverse: a holder of the summary lock takes no fetch
    lock. Not reentrant (a flock per open file): no holder takes it again, nor the launcher lock (taken without
    waiting)."""
    with _exclusive(
        job_dir / FETCH_LOCK, "the lock of the job's record fetch", "the job's record is fetched into the job dir"
    ):
        yield


@contextlib.contextmanager
def summary_lock(job_dir: Path) -> Iterator[None]:
    """One read-change-write of summary.json in `job_dir` at a time (an exclusive flock on SUMMARY_LOCK, waited
    for): the launcher's (`rlctl.ops.runstate.update_summary`: held-out figures, its agents' exits, a state), a
    fetch's (`_with_launchers_keys`: the controller's copy with the launcher's keys of the one here) and a resume's
    moves of it. A fetch takes it inside the fetch lock (`fetching`) and only around local files, so the launcher's
    writes never wait on the controller's site, versus the fetch lock taken for them: a `rlctl stop` recording exits
    waited behind a `status -w` whose site did not answer (and with no lock, a key written between a fetch's read
    and its write was lost). Not reentrant; no holder takes the fetch lock (the order: `fetching` first)."""
    with _exclusive(
        job_dir / SUMMARY_LOCK, "the lock of the job's summary", "the job's summary is written in the job dir"
    ):
        yield


@contextlib.contextmanager
def _exclusive(path: Path, what: str, why: str) -> Iterator[None]:
    """An exclusive flock on the file `path` (made where missing), waited for; where the filesystem has no flock it
    goes unlocked, as `appending` does. A lock that cannot be opened (another user's job dir, a read-only mount) is a
    LaunchError, one line naming it as `what`, its hint `why` the lock is there (`locks.open_lock`), said before a
    fetch asks the site for a record that could not be written here, versus the OSError's traceback (the launcher's
    stop, end and summary writes) or a warning naming no lock (`rlctl status`, `stop`: as if the controller's site had
    not answered)."""
    with open_lock(path, what=what, why=why, error=LaunchError) as f:
        flock(f, fcntl.LOCK_EX)  # (none on this filesystem: unlocked)
        yield  # (the lock goes with the file's close)


def failed_here(job_dir: Path, e: BaseException) -> bool:
    """Whether the fetch into `job_dir` failed `e` there, not on the controller's site: an OSError (or the cause of an
    error raised for one: the fetch lock that cannot be opened, a copy that cannot be written) naming a file in the job
    dir, or an OSError naming none (a write here: ENOSPC); not one naming a file elsewhere (a local site's job dir),
    nor an error of the site's own (an SSH command that failed, a host that does not answer)."""
    cause = e if isinstance(e, OSError) else e.__cause__
    if not isinstance(cause, OSError):
        return False
    named = [str(n) for n in (cause.filename, cause.filename2) if isinstance(n, (str, os.PathLike))]
    if not named:
        return cause is e
    here = os.path.realpath(job_dir)
    return any(os.path.realpath(n) == here or os.path.realpath(n).startswith(here + os.sep) for n in named)


def fetch_failure(e: BaseException) -> str:
    """What failed a fetch, in one line, with the error's hint (an RlctlError's; for an OSError refusing a file its
    permissions or a read-only mount, where to look), versus the hint dropped."""
    hint = getattr(e, "hint", None)
    if isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS) and isinstance(e.filename, str):
        hint = f"look at its owner and permissions (`ls -la {shlex.quote(os.path.dirname(e.filename) or '.')}`)"
    return f"{e}" + (f" (hint: {hint})" if hint else "")


def _fetch(job_dir: Path, site: Site, host: str, root: str) -> list[str]:
    fs = host_files(site, host)
    fetched = []
    try:
        for name in RECORD_FILES:
            text = fs.read_text(f"{root}/{name}")
            # an empty controller.json: a run's start emptied the run before's (`_set_run_before_aside`) and its
            # controller has not written its own; none here, versus an empty one (read as a controller to ask)
            if text is None or (name == "controller.json" and not text.strip()):
                continue
            if name == "summary.json":
                if _summary_fetched(job_dir / name, text, source=f"{host}:{root}/{name}"):
                    fetched.append(name)
                continue
            replace_text(job_dir / name, text)
            fetched.append(name)
        sweep = PartSweep()  # the job dir listed once, for the parts that gone fetches left
        mirror = job_dir / SITE_EVENTS  # the site's events as they are there; merged into the operator's
        if fetch_appended(fs, f"{root}/{EVENTS}", mirror, sweep=sweep):
            _merge_events(job_dir / EVENTS, mirror)
            fetched.append(EVENTS)
        fetched += [name for name in APPENDED_LOGS if fetch_appended(fs, f"{root}/{name}", job_dir / name, sweep=sweep)]
        for tree in TRACKER_DIRS:  # after the record: a tracker file that goes away meanwhile costs only itself
            for rel in fs.list_files(f"{root}/{tree}"):
                dst = job_dir / tree / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                try:
                    if not fetch_grown(fs, f"{root}/{tree}/{rel}", dst, part=own_part(job_dir / tree, sweep)):
                        continue
                except LaunchError as e:  # a tracker's temporary file, removed since the listing
                    log.info("tracker file %s/%s not fetched: %s", tree, rel, e)
                    continue
                fetched.append(f"{tree}/{rel}")
    finally:
        fs.close()
    return fetched


def _summary_fetched(here: Path, text: str, *, source: str) -> bool:
    """The controller's summary `text` (from `source`) written `here` with the launcher's keys of the copy here
    (`_with_launchers_keys`), under the summary lock (`summary_lock`: the fetch lock is held already); False where
    the copy here stays (the controller's does not read and one is here, or the one here cannot be read)."""
    with summary_lock(here.parent):
        merged = _with_launchers_keys(here, text, source=source)
        if merged is None:
            return False
        text, damage = merged
        if damage:  # the copy here does not read: kept aside whole, the fetched one says where
            _damaged_kept(here, text, damage)
        else:
            replace_text(here, text)
    return True


def _merge_events(events: Path, mirror: Path) -> None:
    """The site's events as fetched (`mirror`) merged into the operator's `events`."""
    with appending(events) as f:  # an event appended here meanwhile would go with the file replaced
        if eventtail.tail(events, mirror, f):  # the site's new lines appended, where they merge as such
            f.flush()
        else:
            replace_lines(events, _merge_lines(events, mirror))
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


def fetch_appended(fs: HostFiles, path: str, local: Path, *, sweep: PartSweep | None = None) -> bool:
    """Bring the local copy of a log the host only appends to up to date, whole lines only: the bytes past the
    copy where it is a prefix of the host's file (its last TAIL_MATCH_BYTES equal the host's at the same offset);
    where a resume cut the log back, the copy's lines the host's file still begins with (`_kept`) and the bytes past
    them, written anew (a new file, as a whole copy is: `eventtail` tells a site's events cut since by it), versus
    the whole file again (the sample log: ≈ 355 bytes a sample, GBs after weeks, at the first fetch after each
    resume); the whole file where it begins with none. True when the copy changed. Under the fetch lock
    (`fetching`); where that goes unlocked (a filesystem with no flock), through a `.part` of its own (`own_part`),
    and appended only to a copy as long as it was read: a fetch beside it appended meanwhile (the next fetch brings
    the rest), versus the same rows appended twice. `sweep`: the fetch's (`own_part`)."""
    had = have = local.stat().st_size if local.exists() else 0
    probe = _probe(fs, path, local, have)
    if probe is None:
        return False
    size, prefix = probe
    if not prefix:
        have = _kept(fs, path, local, min(have, size))
    if size <= have == had:
        return False
    part = own_part(local, sweep)
    try:
        if size > have:
            fs.get_range(path, part, have, size)
        else:
            part.write_bytes(b"")
        whole = _whole_lines(part)  # the controller may be writing its last line
        os.truncate(part, whole)
        if have < had:  # cut back (to none: the whole file)
            return _written_anew(local, had=had, keep=have, then=part)
        if not whole:
            return False
        if have:
            return _appended(part, local, have)
        os.replace(part, local)
    finally:
        part.unlink(missing_ok=True)
    return True


def _probe(fs: HostFiles, path: str, local: Path, have: int) -> tuple[int, bool] | None:
    """The host's file `path`'s size, and whether the copy `local` (`have` bytes) is a prefix of it: its last
    TAIL_MATCH_BYTES equal the host's at the same offset (an empty copy is); None where the host has no such file."""
    probe = fs.read_from(path, max(0, have - TAIL_MATCH_BYTES), min(have, TAIL_MATCH_BYTES))
    if probe is None:
        return None
    data, size = probe
    return size, size >= have and (not have or data == _tail(local, len(data)))


def _appended(part: Path, local: Path, have: int) -> bool:
    """`part` appended to `local` where `local` is still `have` bytes long; False where another fetch appended since
    (unlocked: a filesystem with no flock), and nothing is appended."""
    with part.open("rb") as src, local.open("ab") as dst:
        if os.fstat(dst.fileno()).st_size != have:
            return False
        shutil.copyfileobj(src, dst)
    return True


def _written_anew(local: Path, *, had: int, keep: int, then: Path) -> bool:
    """`local`'s first `keep` bytes and then the file `then`, as a new file renamed over it, where it is still `had`
    long (another fetch unlocked may have changed it: left as it is, False)."""
    joined = own_part(local)
    try:
        with local.open("rb") as src, joined.open("wb") as dst:
            if os.fstat(src.fileno()).st_size != had:
                return False
            left = keep
            while left > 0 and (chunk := src.read(min(left, 1 << 20))):
                dst.write(chunk)
                left -= len(chunk)
            with then.open("rb") as more:
                shutil.copyfileobj(more, dst)
        os.replace(joined, local)
    finally:
        joined.unlink(missing_ok=True)
    return True


KEPT_CHECKS = 8  # windows compared below the lines `_kept` finds, spread over them


def _kept(fs: HostFiles, path: str, local: Path, limit: int) -> int:
    """The length of the copy's first lines that the host's file `path` begins with too (at most `limit` bytes): a
    resume cut the log back to a checkpoint and appended its own lines past it. The end of what they share is found
    by halving, a window of TAIL_MATCH_BYTES ending at each offset compared (a few dozen reads of the host's, versus
    its whole file), then taken back to the copy's last line end at or before it, and checked at KEPT_CHECKS
    offsets spread below it; 0 (the whole file is fetched) where one differs."""

    def same(end: int) -> bool:
        n = min(end, TAIL_MATCH_BYTES)
        got = fs.read_from(path, end - n, n)
        return got is not None and got[0] == _read_at(local, end - n, n)

    shared, differs = 0, limit + 1  # same(shared); not same(differs) (past `limit`: not compared)
    if same(limit):
        shared = limit
    else:
        differs = limit
        while differs - shared > 1:
            mid = (shared + differs) // 2
            shared, differs = (mid, differs) if same(mid) else (shared, mid)
    kept = _whole_lines(local, end=shared)
    checks = {kept * k // KEPT_CHECKS for k in range(1, KEPT_CHECKS + 1)}
    return kept if all(same(end) for end in sorted(checks) if end) else 0


def _read_at(path: Path, offset: int, n: int) -> bytes:
    """`n` bytes of the file from `offset` on."""
    with path.open("rb") as f:
        f.seek(offset)
        return f.read(n)


def fetch_grown(fs: HostFiles, path: str, local: Path, *, part: Path) -> bool:
    """Bring the local copy of a file the host writes by appending (a tracker's: TensorBoard's event file, W&B's run
    file) up to date: nothing where the copy is the host's whole file, the bytes past it where it is a prefix of the
    host's (as `fetch_appended` tells it), else the whole file (one written anew); True when the copy changed. Each
    through `part` (outside the tracker's dir), so that one cut short (the site gone mid-copy, SFTP's get opening the
    local file first) leaves the copy here as it was: the whole file renamed over it, the bytes past it appended (any
    part of them keeps it a prefix). Versus the whole file copied at every fetch: an event file grows by a few kB an
    iteration, hundreds of MB after weeks, copied again by every `rlctl status` of a job whose controller is done."""
    here = local.exists()  # (an empty copy of an empty file is its whole file too, versus copied at every fetch)
    have = local.stat().st_size if here else 0
    probe = _probe(fs, path, local, have)
    if probe is None:
        raise LaunchError(f"{path}: not on the site any more")
    size, prefix = probe
    grown = here and prefix
    if grown and size == have:
        return False
    try:
        if not grown:
            fs.get(path, part)
            os.replace(part, local)
            return True
        fs.get_range(path, part, have, size)
        return _appended(part, local, have)
    finally:
        part.unlink(missing_ok=True)


class PartSweep:
    """One fetch's removal of the `own_part`s that gone fetches left: each dir listed once, at the first part asked for
    in it, and each name's parts removed at its first, versus a listing at each part (one a tracker file fetched)."""

    def __init__(self) -> None:
        self._listed: dict[Path, list[str]] = {}
        self._swept: set[Path] = set()

    def sweep(self, local: Path, here: str) -> None:
        if local in self._swept:
            return
        self._swept.add(local)
        if local.parent not in self._listed:
            try:
                self._listed[local.parent] = os.listdir(local.parent)
            except OSError:
                self._listed[local.parent] = []
        _remove_dead_parts(local, here, self._listed[local.parent])


def own_part(local: Path, sweep: PartSweep | None = None) -> Path:
    """A temporary name beside `local` (a log fetched; a tracker's dir, for a file of it) that is this fetch's own (its
    process, thread and a random token), versus one `NAME.part` every fetch shared: where the filesystem has no flock
    (NFS mounted `nolock`) the fetch lock goes unlocked, and a `rlctl status -w` fetching beside the launcher renamed
    or removed the `.part` under it (a FileNotFoundError that ended the launcher with its traceback). Its name says its
    pid, host and pid space (`procfs.pid_space`): the parts of `local` a fetch of this pid space left as it was killed
    (SIGKILL, no `finally` run) are removed here (`_remove_dead_parts`), versus kept in the job dir for good; where
    there is no pid space to say (no /proc), none is. `sweep`: the fetch's, which lists the dir once for all its
    parts (none: a listing for this one)."""
    space = procfs.pid_space()
    here = f"{socket.gethostname()}-{space}" if space is not None else socket.gethostname()
    if space is not None:
        (sweep or PartSweep()).sweep(local, here)
    return local.with_name(f".{local.name}.{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(4)}-{here}.part")


def _remove_dead_parts(local: Path, here: str, names: list[str]) -> None:
    """Remove the `own_part`s of `local` among `names` (its dir's, as listed) whose fetch was a process of `here` (this
    host and pid space) that is gone. A part of a process alive, of another host or pid space (a job dir on NFS; a
    container of another machine with this host name, whose pids name nothing here) or with no pid space in its name
    (an older rlctl's) stays: nothing here can tell that its fetch ended."""
    prefix = f".{local.name}."
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".part")):
            continue
        fields = name[len(prefix) : -len(".part")].split("-", 3)
        if len(fields) == 4 and fields[3] == here and fields[0].isdecimal() and not procfs.alive(int(fields[0])):
            with contextlib.suppress(OSError):  # gone meanwhile (a fetch beside this one), or not ours to remove
                (local.parent / name).unlink()


def _tail(path: Path, n: int) -> bytes:
    """The file's last `n` bytes."""
    with path.open("rb") as f:
        f.seek(f.seek(0, os.SEEK_END) - n)
        return f.read(n)


def _whole_lines(path: Path, *, end: int | None = None) -> int:
    """The length of the file's whole lines (up to and with its last newline; within its first `end` bytes)."""
    with path.open("rb") as f:
        end = path.stat().st_size if end is None else end
        while end > 0:
            start = max(0, end - (1 << 20))
            f.seek(start)
            i = f.read(end - start).rfind(b"\n")
            if i >= 0:
                return start + i + 1
            end = start
    return 0


def _merge_lines(local: Path, remote: Path) -> Iterator[str]:
    """Both event logs as one: the operator's `local` (no lines where it is missing) and the site's `remote` (as
    fetched), for the caller to write as `local`. The contract, which the tail (rlctl.launch.eventtail) keeps too:

    - Lines: each file read as text (`open_record`: UTF-8, a byte that is no UTF-8 as U+FFFD; \\r\\n and \\r end a
      line as \\n does) and split as str.splitlines splits (\\v, \\f, \\x1c-\\x1e, \\x85, U+2028, U+2029 end one too).
      A last line without its newline (its writer mid-write, or killed) is a line as any other. A line of
      whitespace only is left out.
    - Each event once: a line of `remote` the same (character for character) as a line anywhere in `local` is left
      out: fetching twice adds nothing. Nothing else is: a line repeated in `local`, or repeated in `remote` and not
      in `local`, is kept each time.
    - A line that is not a JSON object (an append cut short by a full disk, the next one on the same line) is left
      out, with one warning naming the file and line of the first (and how many more), and appended to
      `<events>.damaged` unless a line there is the same (once: a later merge reads the site's again; a line
      repeated in one merge, each time); the merged log reads again (`rlctl status`).
    - Order: every other line, with a newline, sorted by time (`event_time`: an object without a usable time, null
      or text, an older version's row or an edited one, is an event at time 0, before anything, as every reader
      takes it); at one time, `local`'s lines in their order, then `remote`'s in theirs.

    So a line on one side only is kept (the merge only adds): a whole object on a last line without its newline is
    merged, and adds nothing again once its writer ends the line; one cut short is set aside, and the whole line
    merges once written. A resume's cut of the site's copy takes nothing away here (what earlier merges brought
    is `local`'s now); a `local` cut back gets from `remote` the lines that it still holds.

    Read, sorted (`SpillSort`: sorted runs in an unnamed file beside `local`) and given back a line at a time: what is
    held is about `spillsort.BUDGET_BYTES` of rows, the lines that are no JSON object, and `local`'s lines of the time
    being given back (events at one time are few; those without a usable time are all at 0), versus both files whole,
    as text, as a set and parsed (3.5× them: GBs for a week-long job, at each resume of one whose controller ran on
    another site)."""
    bad: list[tuple[str, str]] = []  # (file and line, line)
    mine_bad: set[str] = set()  # `local`'s lines that are no JSON object: a line of `remote` the same goes with them
    with tempfile.TemporaryFile(dir=local.parent) as spill:  # unnamed: gone with this merge, or its process
        merge = SpillSort(spill)
        for side, path in enumerate((local, remote)):
            if side == 0 and not local.exists():
                continue
            for n, line in enumerate(_record_lines(path), 1):
                if not line.strip() or (side == 1 and line in mine_bad):
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    row = None
                if isinstance(row, dict):
                    merge.add((event_time(row), side, n, line))
                else:
                    bad.append((f"{path}: line {n}", line))
                    if side == 0:
                        mine_bad.add(line)
        _keep_damaged(local.with_name(local.name + ".damaged"), bad)
        # a line of `remote` the same as one of `local` has its time: among `local`'s of that time, sorted before it
        at: float | None = None  # the time of the lines last sorted
        mine: set[str] = set()  # `local`'s lines of that time
        for t, side, _, line in merge.rows():
            if t != at:
                at, mine = t, set()
            if side == 0:
                mine.add(line)
            elif line in mine:
                continue
            yield line + "\n"


def _record_lines(path: Path) -> Iterator[str]:
    """The lines of `path` as `record_text(path).splitlines()` has them, read a piece at a time."""
    with open_record(path) as f:
        for physical in f:
            yield from physical.splitlines()


def _keep_damaged(damaged: Path, bad: list[tuple[str, str]]) -> None:
    """Append to `damaged` the `bad` lines (file and line, line) it does not hold, and say them in one warning."""
    # the site's copy keeps its damaged lines, and every merge reads them again: each is kept and said once
    kept = set(damaged.read_text().splitlines()) if damaged.exists() else set()
    bad = [(where, line) for where, line in bad if line not in kept]
    if bad:
        with damaged.open("a") as f:
            f.write("".join(line + "\n" for _, line in bad))
        more = f" (and {len(bad) - 1} more)" if bad[1:] else ""
        log.warning("%s is not a JSON event: left out of the merged events%s, kept in %s", bad[0][0], more, damaged)


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
