"""`rlctl version`."""

from __future__ import annotations

import platform

import typer

from rlctl import __version__
from rlctl.render import OutputFormat, OutputOpt, emit


def register(app: typer.Typer) -> None:
    @app.command()
    def version(output: OutputOpt = OutputFormat.table) -> None:
        """Print the rlctl version."""
        data = {"rlctl": __version__, "python": platform.python_version()}
        emit(data, output, lambda d: f"rlctl {d['rlctl']} (python {d['python']})")
