"""`rlctl logs JOB [ROLE/N] [-f]`: an agent's log (or the tail of every agent's), wherever it runs; `launcher`:
the log of a launcher that watches the job without a terminal (`launch --detach`, or after a SIGHUP)."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer

from rlctl.commands import said_if_interrupted
from rlctl.commands.status import JobArg
from rlctl.errors import UsageError
from rlctl.render import write_out
from rlctl.textutil import did_you_mean

if TYPE_CHECKING:
    from pathlib import Path

    from rlctl.ops.jobref import JobRef

ROLES = ("controller", "trainer", "rollout")
LAUNCHER = "launcher"  # logs/launcher.log (rlctl.ops.detach.LOG_NAME)
ONE_AGENT_LINES = 40  # `-n`'s default for one agent's log
EACH_AGENT_LINES = 10  # and for each agent's without one


def agent_name(text: str) -> str:
    """'rollout/1', 'rollout-1' → 'rollout-1'; a bare role means replica 0; 'launcher' is the launcher's log."""
    if text == LAUNCHER:
        return LAUNCHER
    role, _, n = text.replace("/", "-").partition("-")
    if role == LAUNCHER:
        raise UsageError(f"agent {text!r}: the launcher has no replicas: `rlctl logs JOB launcher`")
    if role not in ROLES:
        known = (*ROLES, LAUNCHER)
        raise UsageError(f"agent {text!r}: role must be one of {', '.join(known)}{did_you_mean(role, known)}")
    if n and not (n.isascii() and n.isdigit()):  # ('²'.isdigit(), but int('²') fails)
        raise UsageError(f"agent {text!r}: replica must be a number, e.g. {role}/1")
    return f"{role}-{int(n or 0)}"  # rollout/01: rollout-1, as agents are named


def _log_names(log_dir: Path) -> list[str]:
    """The agents' and the launcher's logs in `log_dir`, not a detached launcher's hidden start log
    (`.launcher.start-PID-NS.log`, copied to launcher.log: it was shown as one more agent while the job prepared)."""
    return [p.stem for p in log_dir.glob("*.log") if not p.name.startswith(".")]


def _in_order(names: set[str]) -> list[str]:
    """Agents by role, then replica as a number: rollout-2 before rollout-10 (a string's order put rollout-10 and
    rollout-11 between rollout-1 and rollout-2)."""

    def key(name: str) -> tuple[str, int]:
        role, _, n = name.rpartition("-")
        return (role, int(n)) if role and n.isascii() and n.isdigit() else (name, -1)

    return sorted(names, key=key)


def register(app: typer.Typer) -> None:
    @app.command()
    def logs(
        job: JobArg = None,
        agent: Annotated[
            str | None,
            typer.Argument(help="controller, trainer/N, rollout/N or launcher (default: the tail of every agent)"),
        ] = None,
        follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new lines (one agent)")] = False,
        lines: Annotated[
            int | None,
            typer.Option(
                "--lines",
                "-n",
                min=0,
                help=f"lines from the end (default: {ONE_AGENT_LINES}; without an agent, {EACH_AGENT_LINES} of each)",
                show_default=False,
            ),
        ] = None,
    ) -> None:
        """Print an agent's log: from the job directory, or over SSH from the host the agent runs on."""
        from rlctl.launch.agentrecords import readable_agents
        from rlctl.ops import agentlogs
        from rlctl.ops.jobref import require_job_dir, resolve

        ref = resolve(job)
        require_job_dir(ref)
        log_dir = ref.jobdir.path / "logs"
        handles = {h.spec.name: h for h in readable_agents(ref.jobdir.path)}  # past a damaged line
        if agent is None:
            if follow:
                raise UsageError("--follow needs one agent, e.g. `rlctl logs JOB rollout/0 -f`")
            names = _in_order({*handles, *_log_names(log_dir)})
            if not names:
                raise UsageError(
                    f"job {ref.id}: no logs yet: none of its agents has started (no {log_dir}/*.log)",
                    hint=f"`rlctl status {shlex.quote(ref.id if ref.row is not None else str(ref.jobdir.path))}` says "
                    "where it stands",
                )
            tails = agentlogs.tail_all(ref.jobdir.path, handles, names, EACH_AGENT_LINES if lines is None else lines)
            for name, shown in zip(names, tails, strict=True):
                write_out(f"==> {name} <==\n" + "".join(line + "\n" for line in shown), end="")
            return
        name = agent_name(agent)
        lines = ONE_AGENT_LINES if lines is None else lines
        h = handles.get(name)
        if h is not None:  # recorded: where its log was looked for
            where = agentlogs.looked_for_at(ref.jobdir.path, h)
            no_log = UsageError(f"job {ref.id}: {name} has no log at {where} (removed?)")
        elif name == LAUNCHER:
            no_log = UsageError(
                f"job {ref.id}: no launcher log at {log_dir}/{LAUNCHER}.log: a launcher writes one only without a "
                "terminal (`launch --detach`, `attach --detach`, or after a SIGHUP)"
            )
        else:
            known = _in_order({*handles, *_log_names(log_dir)})
            no_log = UsageError(f"job {ref.id}: no log for {name}; known: {', '.join(known) or 'none'}")
        found = agentlogs.locate(ref.jobdir.path, handles, name)
        if found is None:
            raise no_log
        if name == LAUNCHER:  # the log is every launcher's: one in a terminal writes its header alone there
            from rlctl.ops.detach import latest_in_terminal

            if (note := latest_in_terminal(log_dir / f"{LAUNCHER}.log")) is not None:
                sys.stderr.write(f"rlctl: {note}\n")
        named = shlex.quote(ref.id if ref.row is not None else str(ref.jobdir.path))
        with said_if_interrupted(
            lambda: (
                f"stopped following {name}'s log of job {ref.id}; the job goes on (`rlctl logs {named} {name} -f` "
                "follows it again)"
                if follow
                else f"{name}'s log of job {ref.id} was not shown (reading it changes nothing)"
            )
        ):
            try:
                if not follow:
                    tail = found.files.tail(found.path, lines)
                    if tail is None:
                        raise no_log
                    write_out("".join(line + "\n" for line in tail), end="")
                    return
                # until the agent exits (its site's backend says so; the launcher: its process; an agent with no record,
                # which no site can be asked about: the job, as its record says) or Ctrl-C
                end: list[str] = []
                if name == LAUNCHER:
                    ending = launcher_ended(ref)
                elif found.handle is None:
                    ending = job_ended(ref, end)
                else:
                    ending = agentlogs.agent_ended(ref.jobdir.path, found.handle)
                with ending as ended:
                    if not agentlogs.follow(found, lines, ended=ended, write=_write):
                        raise no_log
                if end:
                    sys.stderr.write(
                        f"rlctl: job {ref.id} ended ({end[0]}); {name} has no agent record: its log ends here\n"
                    )
            finally:
                found.close()


@contextmanager
def launcher_ended(ref: JobRef) -> Iterator[Callable[[], bool]]:
    """Whether the launcher the job index records has exited (one on another machine: never, Ctrl-C stops); of a job
    the index lacks (named by its directory), whether none holds the job dir's launcher lock (it followed for ever)."""
    from rlctl.ops.detach import launcher_running

    if ref.row is None:
        yield lambda: ref.jobdir.launcher_holder() is None
        return
    info = ref.row.info.get("launcher")
    yield lambda: launcher_running(info) is False


@contextmanager
def job_ended(ref: JobRef, end: list[str]) -> Iterator[Callable[[], bool]]:
    """Whether the job has ended (`rlctl.ops.operate.job_end`), its end state then appended to `end`."""
    from rlctl.ops.operate import job_end

    def ended() -> bool:
        state = job_end(ref)
        if state is not None:
            end.append(state)
        return state is not None

    yield ended


def _write(text: str) -> None:
    write_out(text, end="")
