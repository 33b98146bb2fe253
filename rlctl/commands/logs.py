"""`rlctl logs JOB [ROLE/N] [-f]`: an agent's log (or the tail of every agent's), wherever it runs."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from rlctl.commands.status import JobArg
from rlctl.errors import UsageError
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


def _remote_tail(job_dir: Path, name: str, lines: int) -> list[str] | None:
    """The log of an agent on an SSH site whose file is not visible here (no shared filesystem)."""
    from rlctl.launch.backends import make_backend, read_sites, recorded_agents
    from rlctl.launch.remote import SshRunner, sh_path
    from rlctl.launch.ssh import SshBackend

    h = next((h for h in recorded_agents(job_dir) if h.spec.name == name and h.backend == "ssh"), None)
    if h is None:
        return None
    backend = make_backend(h.spec.site, read_sites(job_dir)[h.spec.site], job=job_dir.name, job_dir=job_dir)
    assert isinstance(backend, SshBackend)
    runner = SshRunner(backend.target(h.ident["host"]))
    try:
        res = runner.run(f"tail -n {int(lines)} {sh_path(h.ident['log'])}", timeout_s=15.0)
    finally:
        runner.close()
    return res.stdout.splitlines()


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

        ref = resolve(job)
        log_dir = ref.jobdir.path / "logs"
        if agent is None:
            if follow:
                raise UsageError("--follow needs one agent, e.g. `rlctl logs JOB rollout/0 -f`")
            for path in sorted(log_dir.glob("*.log")):
                sys.stdout.write(f"==> {path.stem} <==\n")
                sys.stdout.writelines(line + "\n" for line in _tail(path, min(lines, 10)))
            return
        name = agent_name(agent)
        path = log_dir / f"{name}.log"
        if not path.exists():
            remote = _remote_tail(ref.jobdir.path, name, lines)
            if remote is None:
                known = sorted(p.stem for p in log_dir.glob("*.log"))
                raise UsageError(f"job {ref.id}: no log for {name}; known: {', '.join(known) or 'none'}")
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
