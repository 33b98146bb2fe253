"""`rlctl --help` and every subcommand's help match golden files (refresh: RLCTL_UPDATE_GOLDEN=1)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import typer.main

from rlctl.cli import app
from tests.conftest import ROOT

GOLDEN = ROOT / "tests" / "golden" / "help"
COMMANDS = sorted(c.name or c.callback.__name__ for c in app.registered_commands if c.callback is not None)
ENV = {
    **os.environ,
    "COLUMNS": "100",
    "LINES": "50",
    "NO_COLOR": "1",
    "TERM": "dumb",
    "_TYPER_FORCE_DISABLE_TERMINAL": "1",
}


def help_text(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "rlctl", *args, "--help"],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=ROOT,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("command", ["rlctl", *COMMANDS])
def test_help_matches_golden(command: str) -> None:
    text = help_text() if command == "rlctl" else help_text(command)
    path = GOLDEN / f"{command}.txt"
    if os.environ.get("RLCTL_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with RLCTL_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"help of {command} changed; review, then refresh with RLCTL_UPDATE_GOLDEN=1"


def test_every_golden_file_has_a_command() -> None:
    stale = {p.stem for p in GOLDEN.glob("*.txt")} - {"rlctl", *COMMANDS}
    assert not stale, f"golden files for commands that no longer exist: {sorted(stale)}"


@pytest.mark.parametrize("command", ["stop", "scale"])
def test_an_omitted_job_of_stop_and_scale_is_said_to_be_the_one_that_runs(command: str) -> None:
    """`stop` and `scale` resolve an omitted JOB to the one job that runs (`jobref.resolve(..., changes=)`); their
    help said 'the job launched or resumed last', as the commands that read a job do."""
    params = {p.name: p for p in typer.main.get_command(app).commands[command].params}  # type: ignore[attr-defined]
    help_text = params["job"].help or ""
    assert "default: the job that runs; refused while several run" in help_text
    assert "default: the job launched or resumed last" not in help_text


def test_launch_s_job_dir_default_is_the_job_file_s_then_rlctl_home_s() -> None:
    """A launch without --job-dir goes to the job file's `job_dir`, else runs/<name>-<time> under $RLCTL_HOME where it
    is set (`launch_dir`, `JobDir.create`); the help said 'default runs/<name>-<time>' alone."""
    params = {p.name: p for p in typer.main.get_command(app).commands["launch"].params}  # type: ignore[attr-defined]
    help_text = params["job_dir"].help or ""
    assert "the job file's job_dir" in help_text
    assert "$RLCTL_HOME" in help_text


@pytest.mark.parametrize("command", ["rlctl", *COMMANDS])
def test_no_help_text_is_cut_short_in_an_80_column_terminal(command: str) -> None:
    """A word longer than its column is cut with an ellipsis: `launch --detach` said
    '(JOB_DIR/logs/launcher.lo…' in an 80-column terminal (the golden files are 100 columns wide)."""
    args = () if command == "rlctl" else (command,)
    proc = subprocess.run(
        [sys.executable, "-m", "rlctl", *args, "--help"],
        capture_output=True,
        text=True,
        env={**ENV, "COLUMNS": "80"},
        cwd=ROOT,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "…" not in proc.stdout, proc.stdout
