"""A job launched with `transport.kind: ucx` (every control, sample and weight connection over UCX, here its TCP
transport on loopback): it ends done with every prompt trained once, and `launch -o json` prints the summary alone on
stdout (UCX logs to stdout unless told otherwise). Skipped without the optional ucxx."""

from __future__ import annotations

import importlib.util
import json

import pytest

from .conftest import REPO, job_yaml, rlctl

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        importlib.util.find_spec("ucxx") is None, reason="ucxx not installed (optional extra: pip install 'rlctl[ucx]')"
    ),
]


def test_a_job_over_ucx_runs_to_the_end_and_prints_only_its_summary(tmp_path, monkeypatch):
    monkeypatch.delenv("UCX_TLS", raising=False)  # (the launcher passes its environment to local agents)
    iterations, prompts = 6, 4
    job = job_yaml(
        tmp_path / "ucx-job.yaml",
        inventory=[str(REPO / "clusters" / "local.yaml")],
        trainer="local",
        rollout="local",
        iterations=iterations,
        transport={"kind": "ucx"},
        tracking=[],
    )
    job_dir = tmp_path / "run"
    proc = rlctl("launch", str(job), "--job-dir", str(job_dir), "-o", "json", timeout_s=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout)  # nothing else on stdout
    assert s["state"] == "done" and s["iterations"] == iterations, s
    assert json.loads((job_dir / "controller.json").read_text())["address"].startswith("ucx://")
    assert s["ledger"]["prompts"] == s["ledger"]["trained"] == iterations * prompts
    assert (s["ledger"]["lost"], s["ledger"]["duplicated"]) == (0, 0)
    assert s["weights"]["version"] == iterations and s["weights"]["units_at_version"] == 1
    # the local site's inventory says no RDMA: its agents left InfiniBand out of UCX (this run's env sets no UCX_TLS)
    unit_log = (job_dir / "logs" / "rollout-0.log").read_text()
    assert "ucx: UCX_TLS=^ib (the site's network.rdma is false)" in unit_log
