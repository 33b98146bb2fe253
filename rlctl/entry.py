"""The `rlctl` console script (pyproject's [project.scripts]): the CLI is imported here, inside the Ctrl-C guard.

Importing it (typer, click, every command module) takes a noticeable part of a second; a Ctrl-C then printed an
import traceback, since `rlctl.cli.main`'s own guard only starts once that module is loaded."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from rlctl.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("rlctl: interrupted\n")
        sys.exit(130)
    cli_main()
