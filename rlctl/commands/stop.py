"""`rlctl stop JOB`: graceful stop through the controller, then every agent on every site, verified."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer

from rlctl.commands import seconds_at_least
from rlctl.commands.status import RunningJobArg
from rlctl.errors import PartialFailure
from rlctl.render import OutputFormat, OutputOpt, emit, grid


def _table(r: dict[str, Any]) -> str:
    if "ended" in r:
        told = f"; its launcher ({r['launcher']}) is told not to resume it" if r.get("launcher") else ""
        lines = [f"\nproblem: {p}" for p in r["problems"]] + [f"\nnot recorded: {u}" for u in r.get("unrecorded", [])]
        return f"job {r['id']} already ended ({r['ended']}){told}" + "".join(lines)
    # a job that ended on its own meanwhile: its agents had exited or were ending; the stop made sure they did
    done = "agents checked gone" if r.get("ended_meanwhile") else "agents stopped"
    rows = [["graceful", r["graceful"]], [done, ", ".join(r["agents"]) or "-"]]
    if (c := r.get("checkpoint")) is not None:  # the one the trainer had reached when the stop came
        rows.insert(1, ["checkpoint", f"iter-{c['version']}: {c['outcome']}"])
    if r.get("launcher"):  # the stop waited for it: a `launch --resume` is refused while it runs
        rows.append(["launcher", r["launcher"]])
    rows += [["problem", p] for p in r["problems"]]
    rows += [["not recorded", u] for u in r.get("unrecorded", [])]
    if r.get("copy"):  # named by a copy of its dir: stopped where it runs
        rows.insert(0, ["job dir", f"{r['job_dir']}, where the job runs ({r['copy']}, named, is a copy of it)"])
    return grid(rows, ["", ""], f"Stop {r['id']}")


def register(app: typer.Typer) -> None:
    @app.command()
    def stop(
        job: RunningJobArg = None,
        grace_s: Annotated[
            float | None,
            typer.Option(
                "--grace",
                min=0.0,
                help="seconds for a graceful exit before SIGKILL / scancel (default: 15, and up to 600 more while "
                "the controller completes a checkpoint the trainer reached)",
                callback=seconds_at_least(0.0),
                show_default=False,
            ),
        ] = None,
        output: OutputOpt = OutputFormat.table,
    ) -> None:
        """Stop a job: the controller stops its agents and writes the summary; then every agent the job
        started, on every site, is terminated (TERM, grace, KILL) and checked gone."""
        from rlctl.ops.jobref import resolve
        from rlctl.ops.stop import stop as do_stop
        from rlctl.ops.stop import stop_cut_short

        ref = resolve(job, changes="stop")
        since = time.time()
        try:
            result = do_stop(ref, grace_s=grace_s, say=lambda line: sys.stderr.write(f"rlctl: {line}\n"))
        except KeyboardInterrupt:  # what the stop left is said (typer ends a Ctrl-C with exit 130 and no word)
            sys.stderr.write(f"rlctl: interrupted: {stop_cut_short(ref, since=since)}\n")
            raise typer.Exit(130) from None
        result.update(ref.copy_said())
        emit(result, output, _table)
        if result["problems"]:
            raise PartialFailure(f"job {ref.id}: some agents could not be verified stopped: {result['problems'][0]}")
        if result.get("unrecorded"):  # stopped, but its job dir does not say so (another user's, a read-only mount)
            raise PartialFailure(f"job {ref.id}: stopped, but {result['unrecorded'][0]}")
