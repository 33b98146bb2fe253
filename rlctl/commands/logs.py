"""`rlctl logs JOB [ROLE/N] [-f]`: an agent's log (or the tail of every agent's), wherever it runs."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from rlctl.commands.status import JobArg
from rlctl.errors import RlctlError, UsageError
from rlctl.launch.base import AgentHandle
from rlctl.textutil import did_you_mean

ROLES = ("controller", "trainer", "rollout")


def agent_name(text: str) -> str:
    """'rollout/1', 'rollout-1' → 'rollout-1'; a bare role means replica 0."""
    role, _, n = text.replace("/", "-").partition("-")
    if role not in ROLES:
        raise UsageError(f"agent {text!r}: role must be one of {', '.join(ROLES)}{did_you_mean(role, ROLES)}")
    if n and not n.isdigit():
        raise UsageError(f"agent {text!r}: replica must be a number, e.g. {role}/1")
    return f"{role}-{n or 0}"


def _tail(path: Path, lines: int) -> list[str]:
    return path.read_text(errors="replace").splitlines()[-lines:] if lines else []


def _site_tail(job_dir: Path, handle: AgentHandle, lines: int) -> list[str] | None:
    """The log of an agent whose file is not visible here, read on its site (sites share no filesystem)."""
    from rlctl.launch.backends import read_sites
    from rlctl.launch.sitefs import agent_view, host_files

    site = read_sites(job_dir).get(handle.spec.site)
    if site is None or handle.spec.log_path is None:
        return None
    fs = host_files(site, agent_view(site, handle.ident.get("host")))
    try:
        return fs.tail(str(handle.spec.log_path), lines)
    finally:
        fs.close()


def register(app: typer.Typer) -> None:
    @app.command()
    def logs(
        job: JobArg = None,
        agent: Annotated[
            str | None, typer.Argument(help="controller, trainer/N or rollout/N (default: the tail of every agent)")
        ] = None,
        follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new lines (one agent)")] = False,
        lines: Annotated[int, typer.Option("--lines", "-n", min=0, help="lines from the end")] = 40,
    ) -> None:
        """Print an agent's log: from the job directory, or over SSH from the host the agent runs on."""
        from rlctl.launch.jobref import resolve
        from rlctl.launch.stage import all_recorded_agents

        ref = resolve(job)
        log_dir = ref.jobdir.path / "logs"
        handles = {h.spec.name: h for h in all_recorded_agents(ref.jobdir.path)}
        if agent is None:
            if follow:
                raise UsageError("--follow needs one agent, e.g. `rlctl logs JOB rollout/0 -f`")
            names = sorted({*handles, *(p.stem for p in log_dir.glob("*.log"))})
            for name in names:
                sys.stdout.write(f"==> {name} <==\n")
                sys.stdout.writelines(line + "\n" for line in _agent_tail(ref.jobdir.path, handles, name, 10))
            return
        name = agent_name(agent)
        path = log_dir / f"{name}.log"
        recorded_log = handles[name].spec.log_path if name in handles else None
        if recorded_log is not None:
            path = recorded_log
        if not path.exists():
            remote = _site_tail(ref.jobdir.path, handles[name], lines) if name in handles else None
            if remote is None:
                raise UsageError(f"job {ref.id}: no log for {name}; known: {', '.join(sorted(handles)) or 'none'}")
            if follow:
                raise UsageError(f"--follow reads logs on this machine; {name} logs on site {handles[name].spec.site}")
            sys.stdout.writelines(line + "\n" for line in remote)
            return
        sys.stdout.writelines(line + "\n" for line in _tail(path, lines))
        if not follow:
            return
        sys.stdout.flush()
        with path.open(errors="replace") as f:
            f.seek(0, 2)
            while True:
                chunk = f.read()
                if chunk:
                    sys.stdout.write(chunk)
                    sys.stdout.flush()
                else:
                    time.sleep(0.3)


def _agent_tail(job_dir: Path, handles: dict[str, AgentHandle], name: str, lines: int) -> list[str]:
    """An agent's last lines wherever its log is; a site that does not answer says so in one line."""
    h = handles.get(name)
    path = h.spec.log_path if h is not None and h.spec.log_path is not None else job_dir / "logs" / f"{name}.log"
    if path.exists():
        return _tail(path, lines)
    if h is None:
        return ["(no log)"]
    try:
        return _site_tail(job_dir, h, lines) or ["(no log)"]
    except RlctlError as e:
        return [f"(log on site {h.spec.site} unreadable: {e})"]
