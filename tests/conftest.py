"""Shared fixtures: the real services started by tests/services/all.sh, and the CLI runner."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVICES_ENV = Path(os.environ.get("RLCTL_TEST_SERVICES_ENV", "/tmp/rlctl-test-services.env"))


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
