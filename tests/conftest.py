"""Shared fixtures: the real services started by tests/services/all.sh, and the CLI runner."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVICES_ENV = Path(os.environ.get("RLCTL_TEST_SERVICES_ENV", "/tmp/rlctl-test-services.env"))

# `python -m rlctl` as a terminal starts it: SIGINT (Ctrl-C) raises KeyboardInterrupt even where the tests run with
# SIGINT ignored, as a background job of a shell without job control does (its children inherit the ignore, and
# Python then installs no handler: the command would go on as its user asked when starting it that way)
RLCTL_AT_A_TERMINAL = [
    sys.executable,
    "-c",
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('rlctl', run_name='__main__', alter_sys=True)",
]


def bench_json(name: str, *, timeout_s: float) -> Any:
    """`python -m bench NAME --quick --json` run from the repository root: the JSON it printed (the test fails with
    the end of its stderr when it exits non-zero)."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench", name, "--quick", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


def run_cli(*args: str) -> CliResult:
    """Run `rlctl ARGS` in-process through the real entry point (error mapping included)."""
    from rlctl.cli import main

    out, err = io.StringIO(), io.StringIO()
    old_argv = sys.argv
    sys.argv = ["rlctl", *args]
    code = 0
    try:
        with redirect_stdout(out), redirect_stderr(err):
            main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old_argv
    return CliResult(code, out.getvalue(), err.getvalue())


@pytest.fixture
def cli() -> Callable[..., CliResult]:
    return run_cli


@pytest.fixture(scope="session")
def services() -> dict[str, str]:
    """Settings of the services from tests/services/all.sh; required in CI (RLCTL_REQUIRE_SERVICES=1)."""
    if not SERVICES_ENV.exists():
        msg = f"test services are not up ({SERVICES_ENV} missing): run `make services-up` as root"
        if os.environ.get("RLCTL_REQUIRE_SERVICES") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    env = {}
    for line in SERVICES_ENV.read_text().splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            env[k.strip()] = v.strip()
    return env


@pytest.fixture(autouse=True, scope="session")
def _rlctl_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Jobs started by tests go into a throwaway index ($RLCTL_HOME), never the operator's ~/.rlctl."""
    os.environ["RLCTL_HOME"] = str(tmp_path_factory.mktemp("rlctl-home"))


@pytest.fixture(autouse=True)
def _own_signal_handlers() -> Iterator[None]:
    """Each test's signal handlers its own: a launch run in the test's process (`run_cli("launch", …)`) installs the
    launcher's SIGTERM handler (sys.exit(143)) and `survive_hangup`'s SIGHUP one (stdout and stderr moved to a job's
    log, an xdist worker's channel to its controller with them); they stayed for every later test in the worker."""
    kept = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    yield
    for s, handler in kept.items():
        if handler is not None and signal.getsignal(s) is not handler:
            signal.signal(s, handler)


@pytest.fixture(autouse=True)
def _own_index(_rlctl_home: None, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own index: most launch into `tmp_path / "run"`, and in one index every launch after the first
    would get the id `run-<digest>` (`JobDB.id_for`), its sites' job dirs `W/jobs/run-<digest>`; the session's
    index stays for what fixtures of wider scope start."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path_factory.mktemp("rlctl-home")))
