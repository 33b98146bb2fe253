"""The `local` launch backend: agents as subprocesses of this machine, each in its own process group.

Each agent is a session leader (`start_new_session`), so Ctrl-C at the terminal does not reach it
(we stop it ourselves, in order) and stopping it reaches everything it started:

    stop: SIGTERM to every group ─▶ wait ≤ grace_s ─▶ SIGKILL to groups still alive ─▶ verify empty
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rlctl.errors import LaunchError
from rlctl.launch.base import AgentHandle, AgentSpec, LaunchBackend

if TYPE_CHECKING:
    from rlctl.config.inventory import Site


def _group_alive(pgid: int, *, ours: bool) -> bool:
    """Some member of the group is left. For a group we started, that means any process, zombies too
    (we reap our own). For someone else's (an agent `rlctl stop` stops from another terminal) zombies
    do not count: one stays until *its* parent reaps it, and `kill(0)` still succeeds on it."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return ours or any(pgrp == pgid and state != "Z" for state, pgrp in _proc_states())


def _proc_states() -> list[tuple[str, int]]:
    """(state, process group) of every process, from /proc/PID/stat (fields after the "(comm) ")."""
    out = []
    for d in os.scandir("/proc"):
        if not d.name.isdigit():
            continue
        try:
            with open(f"/proc/{d.name}/stat") as f:
                fields = f.read().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        out.append((fields[0], int(fields[2])))
    return out


class LocalBackend(LaunchBackend):
    kind = "local"
    on_this_machine = True

    @classmethod
    def for_site(cls, site_name: str, site: Site, *, job: str, job_dir: Path) -> LocalBackend:
        return cls()

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
        return AgentHandle(spec, {"pid": proc.pid, "pgid": proc.pid}, self.kind)

    def poll(self, handle: AgentHandle) -> int | None:
        proc = self._procs.get(handle.ident["pid"])
        if proc is None:
            return None if _group_alive(handle.ident["pgid"], ours=False) else 0
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
        return _group_alive(h.ident["pgid"], ours=proc is not None)

    @staticmethod
    def _signal(h: AgentHandle, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(h.ident["pgid"], sig)
