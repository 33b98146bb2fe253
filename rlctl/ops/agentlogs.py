"""An agent's log wherever it runs: on this filesystem, or — sites share no filesystem — read through its
site's view of the file (`sitefs.host_files`: SSH to the agent's host, or to a SLURM site's submit host);
printed as a tail, or followed until the agent ends (`rlctl logs -f`).

    follow:  last N lines ──▶ read_from(offset) ──new bytes──▶ complete lines out ──▶ read again
                                  │ nothing new: sleep POLL_INTERVAL_S; every ENDED_CHECK_S ask the
                                  │ agent's backend (`poll`) whether it exited
                                  └─ exited ──▶ one more read (its last lines) ──▶ stop
             Ctrl-C ──▶ KeyboardInterrupt leaves the loop; the caller closes the SSH connection

Following polls the file by byte offset (one short command per interval over one SSH connection) rather
than streaming `tail -F`: nothing is left running on the site when this process dies, and what an agent
wrote just before it exited is read, once, after its backend says it ended. A file that shrank (the agent
was started again and its log truncated) is read again from its start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rlctl.errors import LaunchError, RlctlError
from rlctl.launch.backends import Backends, read_sites
from rlctl.launch.base import AgentHandle
from rlctl.launch.jobdir import JobDir
from rlctl.launch.record import here_root
from rlctl.launch.sitefs import HostFiles, LocalFiles, agent_view, host_files
from rlctl.launch.stage import read_staged

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5
ENDED_CHECK_S = 2.0  # how often a follower asks the agent's backend whether it exited
READ_CHUNK_BYTES = 1 << 20
HOSTS_AT_ONCE = 8  # hosts whose agents' logs `tail_all` reads at once (an SSH connection each)


@dataclass
class AgentLog:
    """Where one agent's log is read: a view of a host's files and the path on that host."""

    name: str
    files: HostFiles
    path: str
    handle: AgentHandle | None  # None: a log file in the job dir with no agent record
    shared: bool = False  # `files` belongs to the caller's `views` (several agents' logs on one host): not closed here

    def close(self) -> None:
        if not self.shared:
            self.files.close()


Views = dict[tuple[str, str], HostFiles]  # (site, host) → one view of that host's files, for several agents' logs


def locate(job_dir: Path, handles: dict[str, AgentHandle], name: str, *, views: Views | None = None) -> AgentLog | None:
    """Agent `name`'s log: here when the file is, else on its site; None when neither can say where (LaunchError when
    the job's sites.json is gone). With `views`, a host's view is opened once for every agent on it, and the caller
    closes them."""
    h = handles.get(name)
    path = h.spec.log_path if h is not None and h.spec.log_path is not None else job_dir / "logs" / f"{name}.log"
    if h is not None and not path.is_relative_to(job_dir):  # recorded under another dir: this one's own log
        moved = _moved_here(job_dir, h)
        if moved is not None:  # a moved or copied job dir: its own log or none, never its original's, still there
            return AgentLog(name, LocalFiles(), str(moved), h) if moved.exists() else None
    if path.exists():
        return AgentLog(name, LocalFiles(), str(path), h)
    if h is None or h.spec.log_path is None:
        return None
    site = read_sites(job_dir, required=True).get(h.spec.site)  # gone: not "no log", where its site is was deleted
    if site is None:
        return None
    host = agent_view(site, h.ident.get("host"))
    if views is None:
        return AgentLog(name, host_files(site, host), str(h.spec.log_path), h)
    if (h.spec.site, host) not in views:
        views[(h.spec.site, host)] = host_files(site, host)
    return AgentLog(name, views[(h.spec.site, host)], str(h.spec.log_path), h, shared=True)


def looked_for_at(job_dir: Path, h: AgentHandle) -> Path:
    """Where `locate` looks for recorded agent `h`'s log on this filesystem: the path its record names, or, in a job
    dir moved or copied since, that path in this one (`_moved_here`)."""
    path = h.spec.log_path if h.spec.log_path is not None else job_dir / "logs" / f"{h.spec.name}.log"
    return path if path.is_relative_to(job_dir) else _moved_here(job_dir, h) or path


def _moved_here(job_dir: Path, h: AgentHandle) -> Path | None:
    """Where the agent's log is in `job_dir` when its site keeps the job's files in the operator's job dir (a local
    site without a work root) and that dir was moved or copied since: its record names the log under the dir the job
    was staged in (staged.json's root), where it is no more ("has no log at <the old path> (removed?)"), or where the
    original's is, which goes on without the copy (the copy's `logs` showed it). None for any other site, or where
    the job's sites.json does not say (`locate` says that itself)."""
    try:
        site = read_sites(job_dir).get(h.spec.site)
    except LaunchError:
        return None
    if h.spec.log_path is None or site is None:
        return None
    for root in read_staged(job_dir).get(h.spec.site, {}).get("roots", {}).values():
        if h.spec.log_path.is_relative_to(root):
            here = here_root(site, root, job_dir)  # the staged root itself, but for such a site
            return None if here == root else Path(here) / h.spec.log_path.relative_to(root)
    return None


def tail(
    job_dir: Path, handles: dict[str, AgentHandle], name: str, lines: int, *, views: Views | None = None
) -> list[str] | None:
    """The last `lines` lines of agent `name`'s log; None when there is none."""
    found = locate(job_dir, handles, name, views=views)
    if found is None:
        return None
    try:
        return found.files.tail(found.path, lines)
    finally:
        found.close()


def tail_or_why(
    job_dir: Path, handles: dict[str, AgentHandle], name: str, lines: int, *, views: Views | None = None
) -> list[str]:
    """An agent's last lines; a site that does not answer, no log, or an empty one says so in one line (the
    every-agent view). `lines` 0: none, as `tail -n 0` (it said "(no log)" of each agent's)."""
    try:
        got = tail(job_dir, handles, name, lines, views=views)
        return ["(no log)"] if got is None else got if got or not lines else ["(empty)"]
    except RlctlError as e:
        h = handles.get(name)
        return [f"(log on site {h.spec.site if h is not None else '?'} unreadable: {e})"]


def tail_all(
    job_dir: Path, handles: dict[str, AgentHandle], names: list[str], lines: int, *, hosts_at_once: int = HOSTS_AT_ONCE
) -> list[list[str]]:
    """`tail_or_why` of each of `names`, in their order: one connection per host for the agents on it, up to
    `hosts_at_once` hosts at a time (one after another, 64 units on SSH hosts took 64 connections in turn)."""
    hosts: dict[tuple[str, str], list[int]] = {}
    for i, name in enumerate(names):
        h = handles.get(name)
        hosts.setdefault((h.spec.site, str(h.ident.get("host"))) if h is not None else ("", ""), []).append(i)
    out: list[list[str]] = [[] for _ in names]

    def one_host(members: list[int]) -> None:
        views: Views = {}
        try:
            for i in members:
                out[i] = tail_or_why(job_dir, handles, names[i], lines, views=views)
        finally:
            for files in views.values():
                files.close()

    with ThreadPoolExecutor(max_workers=max(1, min(hosts_at_once, len(hosts)))) as pool:
        list(pool.map(one_host, hosts.values()))
    return out


@contextmanager
def agent_ended(job_dir: Path, handle: AgentHandle | None) -> Iterator[Callable[[], bool]]:
    """Whether the agent has exited, as its site's backend sees it. No record, or a backend that does
    not answer: not ended (the follower goes on; Ctrl-C stops it)."""
    if handle is None:
        yield lambda: False
        return
    backends = Backends(read_sites(job_dir), job=JobDir(job_dir).id, job_dir=job_dir)
    warned = False

    def ended() -> bool:
        nonlocal warned
        try:
            return backends.for_site(handle.spec.site).poll(handle) is not None
        except LaunchError as e:
            if not warned:
                log.warning("cannot tell whether %s still runs (%s); following until Ctrl-C", handle.spec.name, e)
                warned = True
            return False

    try:
        yield ended
    finally:
        backends.close()


def follow(
    agent_log: AgentLog,
    lines: int,
    *,
    ended: Callable[[], bool],
    write: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Write the log's last `lines` lines, then each new line, until `ended()` says the agent exited;
    False when there is no such file."""
    files, path = agent_log.files, agent_log.path
    first = files.last_lines(path, lines)
    if first is None:
        return False
    shown, pending, offset = first
    write("".join(_text(line) for line in shown))
    checked, finishing = -float("inf"), False
    while True:
        got = files.read_from(path, offset, READ_CHUNK_BYTES)
        if got is not None and got[1] < offset:  # truncated: the agent was started again
            offset, pending = 0, b""
            continue
        data = got[0] if got is not None else b""
        if data:
            offset += len(data)
            *complete, pending = (pending + data).split(b"\n")
            write("".join(_text(line) for line in complete))
            continue  # more may be waiting
        if finishing:
            break
        if clock() - checked >= ENDED_CHECK_S:
            checked = clock()
            finishing = ended()
            if finishing:
                continue  # one more read: what it wrote before it exited
        sleep(POLL_INTERVAL_S)
    if pending:
        write(_text(pending))
    return True


def _text(line: bytes) -> str:
    return line.decode(errors="replace") + "\n"
