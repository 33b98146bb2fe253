"""The alerting rules shipped for rlctl jobs (docs/prometheus/rlctl-alerts.yml), through Prometheus's own promtool:
they load, each fires on the series it is for and only then (alerts_test.yml: a controller that is gone and not one
that ended its job, a job that stops training, an agent stuck in one phase, a skipped step, a quarantined prompt, a
staleness violation, not again at a resume nor at a rollback's lower count), and every metric they read is one rlctl
declares."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rlctl.metrics import JobMetrics
from tests.conftest import ROOT

pytestmark = pytest.mark.integration

RULES = ROOT / "docs/prometheus/rlctl-alerts.yml"
HERE = Path(__file__).parent


def promtool(services: dict[str, str]) -> str:
    """The promtool of the test services' Prometheus (the Debian package)."""
    del services  # up: the package is installed
    found = shutil.which("promtool")
    assert found, "promtool not found: the test services install Prometheus (`make services-up`)"
    return found


def test_the_rules_load_and_fire_on_what_they_are_for(services: dict[str, str]) -> None:
    tool = promtool(services)
    check = subprocess.run([tool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "SUCCESS: 6 rules found" in check.stdout, check.stdout + check.stderr
    tested = subprocess.run(
        [tool, "test", "rules", "alerts_test.yml"], cwd=HERE, capture_output=True, text=True, timeout=60
    )
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_every_metric_the_rules_read_is_declared() -> None:
    declared = {m.name for m in JobMetrics().registry.collect()}
    read = {re.sub(r"_total$", "", n) for n in re.findall(r"\brlctl_[a-z0-9_]+", RULES.read_text())}
    assert read and read <= declared, read - declared
