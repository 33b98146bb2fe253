"""`rlctl completion bash|zsh|fish`: print the shell completion script, and answer the shell's completion requests.

The script runs `rlctl` with `_RLCTL_COMPLETE=complete_<shell>` (and the words typed so far) each time the user
presses Tab; typer answers that before any command runs, with the completion class registered for the shell.
The app is built without typer's `--install-completion` / `--show-completion` options (this command prints the
script instead), so those classes are registered here: `enable`, called by the CLI's entry point."""

from __future__ import annotations

import os
from enum import StrEnum
from typing import Annotated

import typer
from typer._completion_shared import get_completion_script

from rlctl.render import write_out

COMPLETE_VAR = "_RLCTL_COMPLETE"


class Shell(StrEnum):
    bash = "bash"
    zsh = "zsh"
    fish = "fish"


def enable() -> None:
    """Register typer's bash/zsh/fish completion classes when this process answers a completion request (they
    live in typer's own copy of click, which knows no shell until they are: 'Shell bash not supported.')."""
    if os.environ.get(COMPLETE_VAR):
        from typer.completion import completion_init

        completion_init()


def register(app: typer.Typer) -> None:
    @app.command()
    def completion(shell: Annotated[Shell, typer.Argument(help="bash, zsh or fish")]) -> None:
        """Print a completion script; e.g. `source <(rlctl completion bash)`."""
        write_out(get_completion_script(prog_name="rlctl", complete_var=COMPLETE_VAR, shell=shell.value))
