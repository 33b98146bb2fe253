"""`rlctl stop JOB`: graceful stop through the controller, then every agent on every site, verified."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from rlctl.commands import seconds_at_least
from rlctl.commands.status import JobArg
from rlctl.errors import PartialFailure
from rlctl.render import OutputFormat, OutputOpt, emit, grid


def _table(r: dict[str, Any]) -> str:
    if "ended" in r:
        told = f"; its launcher ({r['launcher']}) is told not to resume it" if r.get("launcher") else ""
        return f"job {r['id']} already ended ({r['ended']}){told}" + "".join(f"\nproblem: {p}" for p in r["problems"])
    rows = [["graceful", r["graceful"]], ["agents stopped", ", ".join(r["agents"]) or "-"]]
    rows += [["problem", p] for p in r["problems"]]
    return grid(rows, ["", ""], f"Stop {r['id']}")


def register(app: typer.Typer) -> None:
    @app.command()
    def stop(
        job: JobArg = None,
        grace_s: Annotated[
            float,
            typer.Option(
                "--grace",
                min=0.0,
                help="seconds for a graceful exit before SIGKILL / scancel",
                callback=seconds_at_least(0.0),
            ),
        ] = 15.0,
        output: OutputOpt = OutputFormat.table,
    ) -> None:
        """Stop a job: the controller stops its agents and writes the summary; then every agent the job
        started, on every site, is terminated (TERM, grace, KILL) and checked gone."""
        from rlctl.ops.jobref import resolve
        from rlctl.ops.operate import stop as do_stop

        ref = resolve(job)
        result = do_stop(ref, grace_s=grace_s)
        emit(result, output, _table)
        if result["problems"]:
            raise PartialFailure(f"job {ref.id}: some agents could not be verified stopped: {result['problems'][0]}")
