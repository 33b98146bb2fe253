"""`make gpu-check` on a machine whose Python lacks rlctl's runtime packages: it installs them from the carried
.gpu-wheels/, and without them it stops in one line naming them and `make gpu-wheels`, where the check went on
and died importing pydantic before any piece ran (an empty gpu-check.json, the machine's one run spent)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("wheels", ["absent", "empty"])
def test_gpu_check_stops_in_one_line_when_the_wheels_are_not_there(tmp_path: Path, wheels: str) -> None:
    folder = tmp_path / "wheels"
    if wheels == "empty":  # carried, but made before a package was added to the list
        folder.mkdir()
    argv = ["make", "-s", "--no-print-directory", "gpu-check", f"GPU_PY={sys.executable}", f"GPU_WHEELS={folder}"]
    argv += [f"GPU_SITE={tmp_path / 'site'}", "GPU_DEPS=yaml:pyyaml rlctl_absent_module:rlctl-absent-dist"]
    argv += ["GPU_PIECE_DEPS=", f"GPU_CHECK_OUT={tmp_path / 'gpu-check.json'}"]
    env = {**os.environ, "RLCTL_GPU_CHECK_ONLY": "none"}  # (the old recipe went on to run the check: its build only)
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    line = next(x for x in proc.stderr.splitlines() if x.startswith("gpu-check:"))
    assert f"lacks rlctl-absent-dist and {folder}/ " in line and "make gpu-wheels" in line, line
    assert ("is not here" if wheels == "absent" else "did not install them") in line, line
    assert not (tmp_path / "gpu-check.json").exists() and "pyyaml" not in line


def test_gpu_check_runs_the_check_unbuffered_and_timed_from_its_start(tmp_path: Path) -> None:
    """The check's pieces print their results into pipes (bench.gpu_megatron's JSON, pytest's `-v` lines): without
    PYTHONUNBUFFERED, which the GPU machine's shell does not set, what a piece ended by a signal at its deadline
    printed could be lost in Python's buffer. Its budget counts from the recipe's start (RLCTL_GPU_CHECK_T0), its
    installs within it. GPU_PY here records the check's environment instead of running it."""
    started = time.time()
    seen = tmp_path / "env"
    py = tmp_path / "py"
    check = '[ "$1 $2 $3" = "-m bench gpu-check" ]'
    py.write_text(f'#!/bin/sh\n{check} && exec env > {seen}\nexec {sys.executable} "$@"\n')
    py.chmod(0o755)
    argv = ["make", "-s", "--no-print-directory", "gpu-check", f"GPU_PY={py}", f"GPU_WHEELS={tmp_path / 'wheels'}"]
    argv += [f"GPU_SITE={tmp_path / 'site'}", "GPU_DEPS=yaml:pyyaml", "GPU_PIECE_DEPS="]
    argv += [f"GPU_CHECK_OUT={tmp_path / 'gpu-check.json'}"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # (this machine's shell sets it)
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    got = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    assert got.get("PYTHONUNBUFFERED") == "1" and got["RLCTL_GPU_CHECK_OUT"] == str(tmp_path / "gpu-check.json")
    assert int(started) <= int(got["RLCTL_GPU_CHECK_T0"]) <= time.time()


def test_what_the_check_writes_beside_its_json_is_git_ignored() -> None:
    """Without OUT `make gpu-check` writes into the repository's root: gpu-check.json was ignored, but not the
    logs beside it (bench/gpu_check.py's launch-logs.txt and gpu-tests.txt) nor the JSON's part-written file."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    names = ["gpu-check.json", "gpu-check.json.part", "gpu-tests.txt", "launch-logs.txt"]
    proc = subprocess.run(["git", "check-ignore", *names], cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.stdout.split() == names, proc.stdout + proc.stderr
