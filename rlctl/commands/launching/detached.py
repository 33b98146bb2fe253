"""`rlctl launch --detach` (and `attach --detach`): the launch as a launcher in the background (`detach.spawn`),
its lines shown here until the job runs; a Ctrl-C meanwhile stops it and says what it left."""

from __future__ import annotations

import contextlib
import logging
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from rlctl.commands.launching.interrupts import InterruptSaid
from rlctl.ops import detach
from rlctl.render import OutputFormat, emit, grid

if TYPE_CHECKING:
    from rlctl.ops.jobref import JobRef


def _started_table(r: dict[str, Any]) -> str:
    ref = shlex.quote(r["id"])  # as a shell reads it (a job dir `my run (2)`)
    rows = [
        ["job dir", r["job_dir"]],
        ["launcher", f"pid {r['launcher_pid']}, watching the job to its end; its log: {r['launcher_log']}"],
        ["follow", f"rlctl status -w {ref}  ·  rlctl logs {ref} launcher -f"],
        ["stop", f"rlctl stop {ref}"],
    ]
    return grid(rows, ["", ""], f"Job {r['id']}: running (detached)")


def _flags() -> list[str]:
    """This process's --debug / -v, for a launcher it starts."""
    level = logging.getLogger().getEffectiveLevel()
    return ["--debug"] if level <= logging.DEBUG else ["-v"] if level <= logging.INFO else []


def run_detached(
    args: list[str],
    job_dir: Path,
    output: OutputFormat,
    *,
    env: dict[str, str] | None = None,
    pass_fds: tuple[int, ...] = (),
    cancelled: Callable[[], object] = lambda: None,
    unstarted: Callable[[], object] = lambda: None,
) -> None:
    """`rlctl ARGS` as a launcher in the background (`detach.spawn`, with `env`, inheriting `pass_fds`); its lines
    shown here until the job runs. A Ctrl-C stops it (`cancelled` then puts right what it left) and says in one line
    what is left; one that ended before the job ran (its error among its lines) is put right by `unstarted`."""
    child = detach.spawn([*_flags(), *args], detach.log_path(job_dir), env=env, pass_fds=pass_fds)

    def write(data: bytes) -> None:
        sys.stderr.buffer.write(data)
        sys.stderr.flush()

    try:
        info = child.follow(write)
    except KeyboardInterrupt as e:
        sys.stderr.write("rlctl: interrupted: stopping the launch in the background... ")  # (up to a minute)
        sys.stderr.flush()
        try:
            child.cancel()
            ended = "it stopped"
        except KeyboardInterrupt:  # a second Ctrl-C: not waited for (SIGTERMed, it stops what it started), versus
            # 'stopped before it started anything: nothing to stop' said, and what it left not put right
            ended = "not waited for (told to stop, it may still be stopping)"
        try:
            cancelled()
            left = _left_by_cancel(job_dir, ended)
        except KeyboardInterrupt:  # a third: the line said without looking, versus a plain KeyboardInterrupt that
            # `rlctl launch` said of as 'stopped before it started anything: nothing to stop'
            left = (
                f"{ended}; what it left not looked at (interrupted again): `rlctl status {shlex.quote(str(job_dir))}`"
            )
        sys.stderr.write(left + "\n")
        raise InterruptSaid from e
    if info is None:  # it ended before the job ran: its error was among its lines
        try:
            unstarted()
        except KeyboardInterrupt as e:  # the line said without looking, versus a plain KeyboardInterrupt that
            # `rlctl launch` said of as 'stopped before it started anything: nothing to stop'
            sys.stderr.write(
                "rlctl: interrupted: the launch in the background ended before the job ran (its lines above say "
                f"why); what it made in {shlex.quote(str(job_dir))} may be left (interrupted as it was removed)\n"
            )
            raise InterruptSaid from e
        code = child.proc.returncode
        raise typer.Exit(code if code else 1)
    emit(info, output, _started_table)


def _left_by_cancel(job_dir: Path, ended: str = "it stopped") -> str:
    """What a launcher in the background, stopped as it began (`run_detached`), left: the job in the index and its
    state, a job dir outside it, or nothing; and the command that looks at it. Versus 'stopping the launch in the
    background' alone, which said neither."""
    from rlctl.launch.jobdir import JobDir
    from rlctl.ops.jobdb import JobDB
    from rlctl.ops.jobref import JobRef

    if not job_dir.is_dir():
        return f"{ended}; nothing is left (no job dir)"
    here = job_dir.resolve()
    with contextlib.closing(JobDB()) as db:
        row = next((r for r in db.list() if Path(r.job_dir).resolve() == here), None)
    ref = JobRef(row.name if row is not None else JobDir(here).id, JobDir(here), row)
    look = f"`rlctl status {ref.arg}`; its launcher's lines: `rlctl logs {ref.arg} launcher`"
    if row is None:
        return f"{ended}; its job dir {here} is left, outside the index ({look}){_go_on(ref)}"
    return f"{ended}; job {row.name} is left in the index, {row.state}, its job dir {here} ({look}){_go_on(ref)}"


def _go_on(ref: JobRef) -> str:
    """What `_left_by_cancel` says goes on from the job left, as an attached launch's Ctrl-C line says it: a job
    never prepared (no job.json) launched anew from its job file, a finished one trained on (--iterations), another
    continued; nothing for one still live (its launcher not waited for, still stopping: `status` says when)."""
    from rlctl.launch.jobdir import resume_command
    from rlctl.ops.jobdb import LIVE
    from rlctl.ops.jobprep import launch_again

    if ref.row is not None and ref.row.state in LIVE:
        return ""
    if not ref.jobdir.job_json.is_file():
        return f"; launch it anew with `{launch_again(ref.row.info.get('source') if ref.row is not None else None)}`"
    if ref.row is not None and ref.row.state == "finished":
        return f"; train it on with `rlctl launch --resume {ref.arg} --iterations N`"
    return f"; continue it with `{resume_command(ref.id if ref.row is not None else ref.jobdir.path)}`"
