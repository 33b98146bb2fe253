"""A real Prometheus server scrapes rlctl's metrics endpoint; the series appear in its HTTP API."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from rlctl.metrics import JobMetrics

pytestmark = pytest.mark.integration


def query(base: str, promql: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


@pytest.mark.timeout(120)
def test_prometheus_scrapes_job_metrics(services: dict[str, str], tmp_path: Path) -> None:
    metrics = JobMetrics()
    port = metrics.serve(0, addr="127.0.0.1")
    metrics.iteration.set(7)
    metrics.imbalance_seconds.set(1.5)
    metrics.agent_up.labels(role="rollout", name="rollout-0", site="local").set(1)
    metrics.staleness_versions.observe(1)
    target = Path(services["RLCTL_TEST_PROMETHEUS_TARGETS"]) / f"metrics-test-{port}.json"
    target.write_text(json.dumps([{"targets": [f"127.0.0.1:{port}"], "labels": {"test": "metrics"}}]))
    base = services["RLCTL_TEST_PROMETHEUS_URL"]
    try:
        deadline = time.monotonic() + 60
        found: list[dict] = []
        while time.monotonic() < deadline and not found:  # poll until the first scrape lands
            found = query(base, f'rlctl_job_iteration{{instance="127.0.0.1:{port}"}}')
            time.sleep(0.5)
        assert found, "Prometheus never scraped the endpoint"
        assert float(found[0]["value"][1]) == 7.0
        names = {r["metric"]["__name__"] for r in query(base, f'{{__name__=~"rlctl_.+",instance="127.0.0.1:{port}"}}')}
        assert {"rlctl_stage_imbalance_seconds", "rlctl_agent_up", "rlctl_sample_staleness_versions_bucket"} <= names
    finally:
        target.unlink()
