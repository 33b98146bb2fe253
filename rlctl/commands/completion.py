"""`rlctl completion bash|zsh|fish`: print the shell completion script."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer
from typer._completion_shared import get_completion_script


class Shell(StrEnum):
    bash = "bash"
    zsh = "zsh"
    fish = "fish"


def register(app: typer.Typer) -> None:
    @app.command()
    def completion(shell: Annotated[Shell, typer.Argument(help="bash, zsh or fish")]) -> None:
        """Print a completion script; e.g. `source <(rlctl completion bash)`."""
        typer.echo(get_completion_script(prog_name="rlctl", complete_var="_RLCTL_COMPLETE", shell=shell.value))
