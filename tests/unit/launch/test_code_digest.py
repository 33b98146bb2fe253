"""Which rlctl runs a job's agents, finer than the version (rlctl.buildid): the same sources give one digest
wherever they are installed; the launcher gives every agent its digest, and an agent of other code exits at start
with one line (exit 2) before it touches the job, versus running half of another protocol beside the job's agents."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import rlctl
from rlctl.buildid import DIGEST_CHARS, code_digest
from rlctl.launch.agentenv import ENV_CODE, code_mismatch

PACKAGE = Path(rlctl.__file__).resolve().parent


def digest_of(root: Path) -> str:
    """code_digest of the package copied under `root`, asked of a fresh interpreter there."""
    proc = subprocess.run(
        [sys.executable, "-c", "from rlctl.buildid import code_digest; print(code_digest())"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_the_same_sources_anywhere_have_one_digest_and_an_edit_another(tmp_path: Path) -> None:
    here = code_digest()
    assert len(here) == DIGEST_CHARS and int(here, 16) >= 0
    copy = tmp_path / "elsewhere"
    shutil.copytree(PACKAGE, copy / "rlctl", ignore=shutil.ignore_patterns("__pycache__"))
    assert digest_of(copy) == here  # another directory, no compiled files: the same code
    (copy / "rlctl" / "buildid.py").write_text((copy / "rlctl" / "buildid.py").read_text() + "\n# patched\n")
    assert digest_of(copy) != here
    (copy / "rlctl" / "buildid.py").write_text((PACKAGE / "buildid.py").read_text())
    (copy / "rlctl" / "extra.py").write_text("")  # a file more: other code
    assert digest_of(copy) != here


def test_an_editors_lock_beside_the_sources_is_no_source(tmp_path: Path) -> None:
    """Emacs marks a file with unsaved edits by a symlink `.#NAME.py` to nothing: not a source (Python imports no
    such module), counted by nothing, versus read as one: `rlctl version`, a launch and every agent's start ended in
    a FileNotFoundError traceback while a file of the checkout was being edited."""
    copy = tmp_path / "elsewhere"
    shutil.copytree(PACKAGE, copy / "rlctl", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "rlctl" / ".#buildid.py").symlink_to("someone@host.4242:1700000000")
    assert digest_of(copy) == code_digest()


def test_an_agent_compares_its_launchers_digest_with_its_own() -> None:
    assert code_mismatch({}) is None  # started by hand, or by an older launcher: nothing to compare
    assert code_mismatch({ENV_CODE: code_digest()}) is None
    line = code_mismatch({ENV_CODE: "0" * DIGEST_CHARS})
    assert line is not None and "\n" not in line
    assert f"code {code_digest()}" in line and f"the rlctl that started this (code {'0' * DIGEST_CHARS})" in line
    assert str(PACKAGE) in line


def test_an_agent_of_other_code_exits_at_start_in_one_line(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PACKAGE.parent), ENV_CODE: "f" * DIGEST_CHARS}
    job_dir = tmp_path / "job"  # never made: the agent stops before it reads anything of the job
    proc = subprocess.run(
        [sys.executable, "-m", "rlctl.agents", "rollout", "--job-dir", str(job_dir), "--controller", "x:1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = proc.stderr.splitlines()
    assert "ERROR rollout-0" in line and f"the rlctl that started this (code {'f' * DIGEST_CHARS})" in line
    assert not job_dir.exists()


def test_a_sites_profile_probe_of_other_code_refuses_to_measure(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PACKAGE.parent), ENV_CODE: "e" * DIGEST_CHARS}
    out = tmp_path / "probe.json"
    argv = ["--model", "tiny-demo", "--kv-capacity-tokens", "1000", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "rlctl.profiler.probe", *argv], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = proc.stderr.splitlines()  # what measure_on_site says as the site's one line (exit 2)
    assert line.startswith("rlctl profile probe: on ")
    assert f"the rlctl that started this (code {'e' * DIGEST_CHARS})" in line
    assert not out.exists()
