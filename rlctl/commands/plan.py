"""`rlctl plan JOB.yaml`: allocation, parallel configs, dispatch split, predicted times, cost, rebalance δ'."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from rlctl.commands import said_if_interrupted
from rlctl.render import OutputFormat, OutputOpt, emit


def register(app: typer.Typer) -> None:
    @app.command()
    def plan(
        job: Annotated[Path, typer.Argument(help="job file (jobs/*.yaml)")],
        profile: Annotated[
            Path | None,
            typer.Option(
                "--profile",
                "-p",
                help="profile file from `rlctl profile` (default: the job's planning.profile, else analytical from the "
                "inventory's GPU specs)",
            ),
        ] = None,
        plot: Annotated[Path | None, typer.Option("--plot", help="write a PNG of the stage-time breakdown")] = None,
        output: OutputOpt = OutputFormat.table,
    ) -> None:
        """Plan a job: Algorithm 1 allocation, TP/PP/DP, Algorithm 2 dispatch, simulated iteration time per mode."""
        from rlctl.config import load_job
        from rlctl.errors import ConfigError, UsageError
        from rlctl.models.readonce import reads_once
        from rlctl.ops.counts import job_profile
        from rlctl.planner.plan import make_plan
        from rlctl.planner.view import plan_plot, plan_table, plot_path

        with (
            said_if_interrupted(
                lambda: f"the plan of {shlex.quote(str(job))} was not made (planning changes nothing); run it again"
            ),
            reads_once(),  # (a model's config.json and weight headers read once)
        ):
            png = plot_path(plot) if plot is not None else None  # a path it cannot write: refused before planning
            j = load_job(job, profile_must_exist=profile is None)  # --profile prices it: the job's may be unwritten
            try:
                prof, prof_file = job_profile(j, profile)
            except ConfigError as e:  # a --profile not there (or not readable): the option's line, as --plot's
                if profile is None or e.file != str(profile) or not isinstance(e.__cause__, OSError):
                    raise
                raise UsageError(f"--profile {profile}: {e.detail}", hint=e.hint) from e
            result = make_plan(j, prof, profile_file=prof_file)
            if prof is not None:  # which file priced it (--profile, else the job's planning.profile)
                result["profile_file"] = prof_file
            if png is not None:
                plan_plot(result, png)
                sys.stderr.write(f"wrote {png}\n")
            emit(result, output, plan_table)
