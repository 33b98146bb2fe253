"""The Grafana dashboard against rlctl/metrics.py: every metric on a panel, every panel metric declared."""

from __future__ import annotations

import json
import re
from typing import Any

from rlctl.metrics import JobMetrics
from tests.conftest import ROOT

DASHBOARD = ROOT / "docs/grafana/rlctl-dashboard.json"
# What Prometheus scrapes for each declared type (prometheus_client names counters without `_total`).
EXPOSED = {"gauge": ("",), "counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def declared() -> dict[str, set[str]]:
    """Declared metric → the series names Prometheus stores for it."""
    out = {}
    for metric in JobMetrics().registry.collect():
        assert metric.type in EXPOSED, f"{metric.name}: no dashboard rule for type {metric.type}"
        out[metric.name] = {metric.name + suffix for suffix in EXPOSED[metric.type]}
    return out


def panels(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every panel, including those inside collapsed rows."""
    return [q for p in items for q in [p, *panels(p.get("panels", []))]]


def expressions(dash: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(dash["panels"]) for t in p.get("targets", [])]


def referenced(exprs: list[str]) -> set[str]:
    return {name for e in exprs for name in re.findall(r"\brlctl_[a-z0-9_]+", e)}


def test_every_declared_metric_is_on_a_panel_and_every_panel_metric_is_declared() -> None:
    dash = json.loads(DASHBOARD.read_text())
    names = referenced(expressions(dash))
    series = declared()
    assert series["rlctl_scale_events"] == {"rlctl_scale_events_total"}  # the walk sees what metrics.py declares
    assert [m for m, exposed in series.items() if not names & exposed] == []
    everything = set().union(*series.values())
    annotations = [a["expr"] for a in dash["annotations"]["list"] if "expr" in a]
    assert sorted(referenced([*expressions(dash), *annotations]) - everything) == []


def test_dashboard_shape() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["schemaVersion"] == 39
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["instance"]["query"]["query"] == "label_values(rlctl_job_iteration, instance)"
    every = panels(dash["panels"])
    ids = [p["id"] for p in every]
    assert len(ids) == len(set(ids))
    rows = [p["title"] for p in every if p["type"] == "row"]
    assert rows == ["Progress", "Stages", "Throughput", "Staleness & ledger", "Weights", "Agents", "Training"]
    for p in every:
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["fieldConfig"]["defaults"]["unit"], p["title"]
        for t in p["targets"]:
            assert 'instance=~"$instance"' in t["expr"], (p["title"], t["expr"])
            assert "_bucket" not in t["expr"] or "histogram_quantile" in t["expr"] or 'le="' in t["expr"], t["expr"]
