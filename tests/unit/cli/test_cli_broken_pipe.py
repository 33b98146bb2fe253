"""Output into a pipe whose reader went away (`rlctl logs JOB trainer/0 | head -1`): rlctl ends as a standard Unix tool
does, quietly, exit status 141 (128 + SIGPIPE), versus exit 1, unsaid, as if an error had happened. Real processes,
real pipes (rlctl.cli.main)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def rlctl(*args: str, stdout: int, home: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RLCTL_HOME": str(home)}
    cmd = [sys.executable, "-m", "rlctl", *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=stdout, stderr=subprocess.PIPE)


def test_a_reader_that_stops_early_ends_rlctl_quietly_with_141(tmp_path: Path) -> None:
    job = tmp_path / "job"
    (job / "logs").mkdir(parents=True)
    (job / "job.json").write_text(json.dumps({"source": "job.yaml", "job": {"name": "job"}}))
    (job / "logs" / "trainer-0.log").write_text("".join(f"line {i}\n" for i in range(200_000)))  # > a pipe's buffer
    with rlctl("logs", str(job), "trainer/0", "-n", "200000", stdout=subprocess.PIPE, home=tmp_path / "home") as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline() == b"line 0\n"
        proc.stdout.close()  # `| head -1`
        err = proc.stderr.read()
    assert proc.returncode == 141 and err == b"", err.decode()


def test_output_flushed_at_the_end_into_a_closed_pipe_ends_quietly_with_141(tmp_path: Path) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before rlctl writes (`rlctl version | true`)
    try:
        proc = rlctl("version", stdout=write, home=tmp_path / "home")
    finally:
        os.close(write)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141 and err == b"", err.decode()


def test_only_a_broken_stdout_is_a_reader_gone(monkeypatch) -> None:
    """A broken pipe that is not stdout's (a peer's socket, a child's stdin) is not read as `| head` (review of
    ae482f9: any EPIPE ended rlctl with 141, quietly)."""
    import io

    from rlctl.cli import stdout_reader_gone

    read, write = os.pipe()
    try:
        with open(write, "w", closefd=False) as out:
            monkeypatch.setattr(sys, "stdout", out)
            assert not stdout_reader_gone()  # its reader is there
            os.close(read)
            read = -1
            assert stdout_reader_gone()
        monkeypatch.setattr(sys, "stdout", io.StringIO())  # no descriptor
        assert not stdout_reader_gone()
    finally:
        os.close(write)
        if read >= 0:
            os.close(read)


def said_full_disk(cmd: list[str], env: dict[str, str]) -> None:
    """`cmd > /dev/full`: one line, exit 1."""
    with open("/dev/full", "w") as full:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=full, stderr=subprocess.PIPE)
    assert (proc.returncode, proc.stderr) == (
        1,
        b"rlctl: error: cannot write the output to stdout: No space left on device\n",
    )


def said_closed_stdout(cmd: list[str], env: dict[str, str]) -> None:
    """`cmd >&-`: one line, exit 1."""
    proc = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *cmd], cwd=ROOT, env=env, stderr=subprocess.PIPE)
    assert (proc.returncode, proc.stderr) == (
        1,
        b"rlctl: error: stdout is closed: nothing can be written (hint: redirect it instead, e.g. > /dev/null)\n",
    )


@pytest.mark.parametrize(
    "args",
    [["version"], ["--version"], ["profile", "-c", "clusters/local.yaml", "-m", "tiny-demo"], ["completion", "bash"]],
)
def test_a_stdout_that_cannot_be_written_or_is_closed_is_one_line_exit_1(args: list[str], tmp_path: Path) -> None:
    """`rlctl plan job.yaml > /dev/full` (a full disk) and `rlctl version >&-` (no stdout at all) ended in a traceback
    (OSError: No space left on device; AttributeError: 'NoneType' object has no attribute 'write'); the profile's
    YAML and a completion script too; `rlctl --version` (a print of its own) in that traceback, or exit 0 unsaid."""
    env = {**os.environ, "RLCTL_HOME": str(tmp_path / "home")}
    cmd = [sys.executable, "-m", "rlctl", *args]
    said_full_disk(cmd, env)
    said_closed_stdout(cmd, env)


@pytest.mark.parametrize("agent", [[], ["trainer/0"]])
def test_logs_into_a_stdout_that_cannot_take_them_is_one_line_exit_1(agent: list[str], tmp_path: Path) -> None:
    """`rlctl logs JOB > /dev/full` (every agent's tail, or one agent's) wrote past rlctl.render: a traceback."""
    job = tmp_path / "job"
    (job / "logs").mkdir(parents=True)
    (job / "job.json").write_text("{}")
    (job / "logs" / "trainer-0.log").write_text("a\nb\n")
    env = {**os.environ, "RLCTL_HOME": str(tmp_path / "home")}
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "rlctl", "logs", str(job), *agent],
            cwd=ROOT,
            env=env,
            stdout=full,
            stderr=subprocess.PIPE,
        )
    assert (proc.returncode, proc.stderr) == (
        1,
        b"rlctl: error: cannot write the output to stdout: No space left on device\n",
    )


@pytest.mark.parametrize("args", [["--help"], ["status", "--help"], []])
def test_help_into_a_full_disk_or_a_closed_pipe_ends_as_other_output_does(args: list[str], tmp_path: Path) -> None:
    """typer's help is printed by rich, past rlctl.render: `rlctl --help > /dev/full` ended in a traceback (OSError: No
    space left on device), and `rlctl --help | true` in exit 1, unsaid (rich put /dev/null in stdout's place and
    exited 1), versus one line, exit 1, and a quiet 141 as for any other output (`rlctl` alone prints its help too);
    `rlctl --help >&-` (no stdout at all) ended 0, unsaid (rich wrote to nothing), versus 'stdout is closed', exit 1."""
    env = {**os.environ, "RLCTL_HOME": str(tmp_path / "home")}
    cmd = [sys.executable, "-m", "rlctl", *args]
    said_full_disk(cmd, env)
    said_closed_stdout(cmd, env)
    read, write = os.pipe()
    os.close(read)  # the reader is gone before rlctl writes
    try:
        piped = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=write, stderr=subprocess.PIPE)
    finally:
        os.close(write)
    _, err = piped.communicate(timeout=120)
    assert piped.returncode == 141 and err == b"", err.decode()
