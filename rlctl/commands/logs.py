"""`rlctl logs JOB [ROLE/N] [-f]`: an agent's log (or the tail of every agent's), wherever it runs."""

from __future__ import annotations

import sys
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
        from rlctl.launch.stage import all_recorded_agents
        from rlctl.ops import agentlogs
        from rlctl.ops.jobref import resolve

        ref = resolve(job)
        log_dir = ref.jobdir.path / "logs"
        handles = {h.spec.name: h for h in all_recorded_agents(ref.jobdir.path)}
        if agent is None:
            if follow:
                raise UsageError("--follow needs one agent, e.g. `rlctl logs JOB rollout/0 -f`")
            names = sorted({*handles, *(p.stem for p in log_dir.glob("*.log"))})
            if not names:
                raise UsageError(
                    f"job {ref.id}: no logs yet: none of its agents has started (no {log_dir}/*.log)",
                    hint=f"`rlctl status {ref.id if ref.row is not None else ref.jobdir.path}` says where it stands",
                )
            for name in names:
                sys.stdout.write(f"==> {name} <==\n")
                shown = agentlogs.tail_or_why(ref.jobdir.path, handles, name, 10)
                sys.stdout.writelines(line + "\n" for line in shown)
            return
        name = agent_name(agent)
        no_log = UsageError(f"job {ref.id}: no log for {name}; known: {', '.join(sorted(handles)) or 'none'}")
        found = agentlogs.locate(ref.jobdir.path, handles, name)
        if found is None:
            raise no_log
        try:
            if not follow:
                tail = found.files.tail(found.path, lines)
                if tail is None:
                    raise no_log
                sys.stdout.writelines(line + "\n" for line in tail)
                return
            # until the agent exits (its site's backend says so) or Ctrl-C
            with agentlogs.agent_ended(ref.jobdir.path, found.handle) as ended:
                if not agentlogs.follow(found, lines, ended=ended, write=_write):
                    raise no_log
        finally:
            found.close()


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
