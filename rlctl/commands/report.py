"""`rlctl report [JOB]`: write the PNG and HTML report of a job run (see rlctl.report)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from rlctl.commands import said_if_interrupted
from rlctl.commands.status import JobArg
from rlctl.render import OutputFormat, OutputOpt, emit
from rlctl.textutil import home_path


def _table(paths: dict[str, str]) -> str:
    return f"{paths['png']}\n{paths['html']}"


def register(app: typer.Typer) -> None:
    @app.command()
    def report(
        job: JobArg = None,
        out: Annotated[
            Path | None,
            typer.Option(
                "--out",
                help="write here (ends in .png or .html; the other is written beside it) "
                "instead of JOB_DIR/report.{png,html}",
            ),
        ] = None,
        output: OutputOpt = OutputFormat.table,
    ) -> None:
        """Write a PNG and an HTML report of a job: reward, T_gen/T_train/δ with scale events, agent busy/idle timeline."""  # noqa: E501 (one line: typer keeps newlines in the command list)
        from rlctl.ops.jobref import require_job_dir, resolve
        from rlctl.ops.operate import fetch_job_record, job_end
        from rlctl.ops.refusals import refuse_if_unprepared
        from rlctl.report import build_report

        ref = resolve(job)
        require_job_dir(ref)
        # one its launcher still prepares, or stopped before it wrote job.json: said so, with what to do, versus
        # `not a job directory (no job.json)`
        if not ref.jobdir.job_json.exists():
            source = ref.row.info.get("source") if ref.row is not None else None
            refuse_if_unprepared(ref.jobdir, source=source, nothing="nothing to report")
        again = " ".join([ref.arg, *(["--out", shlex.quote(str(out))] if out is not None else [])])
        with said_if_interrupted(  # (typer ended a Ctrl-C with exit 130 and no word)
            lambda: (
                f"the report of job {ref.id} did not finish (the job is unchanged; a report file may be cut short); "
                f"`rlctl report {again}` writes it again"
            )
        ):
            fetch_job_record(ref)  # the record lives with the controller; a copy here when it ran on another site
            out = home_path(out, named="--out") if out is not None else None  # `--out=~/r.png`
            # a run that ended without a summary (its controller killed) is said as ended, not `running`
            files = build_report(ref.jobdir.path, out=out, ended=job_end(ref))
        emit({"png": str(files.png), "html": str(files.html)}, output, _table)
