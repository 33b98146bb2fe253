"""The `local` launch backend: agents as subprocesses of this machine, each in its own process group.

Each agent is a session leader (`start_new_session`), so Ctrl-C at the terminal does not reach it
(we stop it ourselves, in order) and stopping it reaches everything it started:

    stop: SIGTERM to every group ─▶ wait ≤ grace_s ─▶ SIGKILL to groups still alive ─▶ verify empty

An agent started by another rlctl process (`rlctl stop` / `status` from another terminal, reading agents.jsonl)
is known by its pid and its start time (`start_ticks`, field 22 of /proc/PID/stat), as the ssh backend does: a
pid whose start time differs is someone else's now (PID reuse after the agent ended) and is never signalled.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rlctl import procfs
from rlctl.config.hosts import same_host
from rlctl.errors import LaunchError
from rlctl.launch.base import LOST, AgentHandle, AgentSpec, LaunchBackend, SiteProblem
from rlctl.launch.jobdir import why_not_made
from rlctl.procfs import start_ticks

if TYPE_CHECKING:
    from rlctl.config.inventory import Site

log = logging.getLogger(__name__)

_unverified_said = False  # an old agents.jsonl's handle (no start time): said once per process


def _reused(ident: dict[str, int], name: str, *, signal: bool = False) -> bool:
    """The recorded leader's pid names another process now (another start time): its group is not the agent's.
    A leader that is gone is no sign of reuse: the pid of a group that still has members is not handed out again
    (they are the agent's leftovers). A handle without a start time (an agents.jsonl of an older rlctl) cannot be
    checked and is taken as the agent's, as before (said once, when it is to be signalled)."""
    recorded = ident.get("start_ticks")
    if recorded is None:
        global _unverified_said
        if signal and not _unverified_said:
            _unverified_said = True
            log.warning(
                "%s: agents.jsonl records no start time (an older rlctl wrote it): its process group %s is taken "
                "as the agent's without checking that the pid was not reused",
                name,
                ident["pgid"],
            )
        return False
    now = start_ticks(ident["pid"])
    return now is not None and now != recorded


def _group_alive(pgid: int, *, ours: bool) -> bool:
    """Some member of the group is left. For a group we started, that means any process, zombies too
    (we reap our own). For someone else's (an agent `rlctl stop` stops from another terminal) zombies
    do not count: one stays until *its* parent reaps it, and `kill(0)` still succeeds on it. A pgid no group can
    have (a hand-edited agents.jsonl: `procfs.possible`) is none left."""
    if not procfs.possible(pgid, group=True):
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return ours or any(int(f[procfs.PGRP]) == pgid and f[procfs.STATE] != "Z" for _, f in procfs.every_stat())


def this_machine(host: str) -> bool:
    """Whether `host` names this machine: localhost, its host name, or a name or address that resolves to one of
    its addresses (one a socket can bind here). Read as the inventory reads a host (`same_host`: its case and one
    trailing dot are not its name), versus `localhost.` refused here as 'not this machine' and taken for this
    machine by the GPU-twice check (`inventory._machine`)."""
    name = same_host(host)
    if name in ("localhost", same_host(socket.gethostname())):
        return True
    try:
        found = socket.getaddrinfo(name, 0, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    for family, kind, proto, _, where in found:
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.bind(where)
            except OSError:
                continue
            return True
    return False


def _not_executable(command: str) -> str | None:
    """Why `command` (an absolute path or a name looked up in PATH) would not start here, None when it would."""
    if "/" not in command:
        return None if shutil.which(command) else f"{command}: no such command in this machine's PATH"
    path = Path(command)
    if not path.exists():
        return f"{command}: no such file"
    if not path.is_file() or not os.access(path, os.X_OK):
        return f"{command}: not an executable file"
    return None


class LocalBackend(LaunchBackend):
    kind = "local"
    on_this_machine = True

    @classmethod
    def for_site(cls, site_name: str, site: Site, *, job: str, job_dir: Path) -> LocalBackend:
        return cls()

    @classmethod
    def site_problems(cls, site: Site) -> list[SiteProblem]:
        """The site's agents run here: its nodes must be one host, this machine (each host's GPU slots are handed out
        apart: two hosts here would give two agents one GPU), its `python` an executable of this machine (a command
        name: in this PATH, which they inherit) and its work root a directory this machine can make."""
        out = []
        hosts = [h for h, _ in site.hosts]
        field = "nodes" if len(site.nodes) > 1 else "nodes[0].host"
        if len(hosts) > 1:
            shown = ", ".join(hosts[:4]) + (", …" if len(hosts) > 4 else "")
            out.append(
                SiteProblem(
                    field,
                    f"{len(hosts)} hosts ({shown}): a local site's agents all run on this machine, one host",
                    "list this machine once (e.g. {host: localhost, gpus: N}); a site of other hosts is an ssh or "
                    "slurm site",
                )
            )
        elif not this_machine(hosts[0]):
            out.append(
                SiteProblem(
                    field,
                    f"{hosts[0]!r} is not this machine (localhost, {socket.gethostname()} or one of its addresses): "
                    "a local site's agents run here",
                    "name this machine (e.g. localhost); a site of other hosts is an ssh or slurm site",
                )
            )
        if site.python is not None and (why := _not_executable(site.python)) is not None:
            hint = "give an interpreter of this machine that has rlctl, or leave python out (this one)"
            out.append(SiteProblem("python", why, hint))
        workdir = cls.work_root(site)
        if workdir is not None and (why := why_not_made(Path(workdir))) is not None:
            hint = "give a directory this machine can make, or leave workdir out (the job directory is the root)"
            out.append(SiteProblem("scheduler.workdir", why, hint))
        return out

    def __init__(self) -> None:
        self._procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, spec: AgentSpec) -> AgentHandle:
        env = {**os.environ, **spec.env}
        try:
            if spec.log_path is not None:
                spec.log_path.parent.mkdir(parents=True, exist_ok=True)
                with spec.log_path.open("ab") as log:
                    proc = subprocess.Popen(
                        spec.argv,
                        env=env,
                        cwd=spec.cwd,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
            else:
                proc = subprocess.Popen(
                    spec.argv, env=env, cwd=spec.cwd, stdin=subprocess.DEVNULL, start_new_session=True
                )
        except OSError as e:
            raise LaunchError(f"cannot start {spec.name}: {e}") from e
        self._procs[proc.pid] = proc
        ident = {"pid": proc.pid, "pgid": proc.pid}
        ticks = start_ticks(proc.pid)  # not reaped before we poll it: readable even if it exited at once
        if ticks is not None:  # None: no /proc (not Linux); the handle is then unchecked, as before
            ident["start_ticks"] = ticks
        return AgentHandle(spec, ident, self.kind)

    def identifies(self, handle: AgentHandle) -> bool:
        return "start_ticks" in handle.ident

    def poll(self, handle: AgentHandle) -> int | None:
        proc = self._procs.get(handle.ident["pid"])
        if proc is None:  # not ours (`rlctl status` from another terminal): only its parent learns how it ended
            return None if self._running(handle) else LOST
        return proc.poll()

    def stop(self, handles: list[AgentHandle], *, grace_s: float = 10.0) -> None:
        for h in handles:
            self._signal(h, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(self._running(h) for h in handles):
            time.sleep(0.05)
        for h in handles:
            if self._running(h):
                self._signal(h, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(self._running(h) for h in handles):
            time.sleep(0.05)
        left = [h.spec.name for h in handles if self._running(h)]
        if left:
            raise LaunchError(f"agents still running after SIGKILL: {', '.join(left)}")

    def _running(self, h: AgentHandle) -> bool:
        """The agent or anything in its process group is still alive (the agent itself reaped)."""
        proc = self._procs.get(h.ident["pid"])
        if proc is not None:
            proc.poll()  # reap: a zombie leader would otherwise keep the group "alive"
        elif _reused(h.ident, h.spec.name):  # ours (a Popen we hold, not yet reaped) cannot be reused
            return False
        return _group_alive(h.ident["pgid"], ours=proc is not None)

    def _signal(self, h: AgentHandle, sig: signal.Signals) -> None:
        if h.ident["pid"] not in self._procs and _reused(h.ident, h.spec.name, signal=True):
            log.info("%s: pid %s is another process now (the agent ended): not signalled", h.spec.name, h.ident["pid"])
            return
        if not procfs.possible(h.ident["pgid"], group=True):  # 0: our own group; 1: every process
            log.warning("%s: agents.jsonl's pgid %s is no process group: not signalled", h.spec.name, h.ident["pgid"])
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(h.ident["pgid"], sig)
