"""`rlctl version`."""

from __future__ import annotations

import platform

import typer

from rlctl import __version__
from rlctl.buildid import code_digest
from rlctl.render import OutputFormat, OutputOpt, emit


def register(app: typer.Typer) -> None:
    @app.command()
    def version(output: OutputOpt = OutputFormat.table) -> None:
        """Print the rlctl version and its code's digest (a job's sites must run the same)."""
        data = {"rlctl": __version__, "code": code_digest(), "python": platform.python_version()}
        emit(data, output, lambda d: f"rlctl {d['rlctl']} (code {d['code']}, python {d['python']})")
