"""The controller's loop sets the agents' gauges once every GAUGES_EVERY_S, not at each message it handles; a trained
iteration's staleness violations reach their counter."""

from __future__ import annotations

import time
from pathlib import Path

from rlctl.agents.controller import GAUGES_EVERY_S
from rlctl.agents.views import status
from tests.unit.agents.test_agents_gone_peers import Running
from tests.unit.controller_harness import HandledController, small_job


def test_the_agents_gauges_are_set_once_a_period_and_when_the_loop_ends(tmp_path: Path) -> None:
    # an update reads every agent and every sample in the ledger: at each message of the loop, seconds an iteration
    h = HandledController(tmp_path, small_job("gauges", iterations=2), listen="inproc://gauges-every")
    try:
        value = h.ctl.metrics.registry.get_sample_value
        labels = {"role": "rollout", "name": "rollout-0", "site": h.ctl.sites.get("rollout-0", "")}
        h.ctl.peers["rollout-0"].last_seen = 0.0
        h.ctl._gauges(100.0)
        assert value("rlctl_agent_heartbeat_age_seconds", labels) == 100.0
        h.ctl._gauges(100.0 + GAUGES_EVERY_S / 2)
        assert value("rlctl_agent_heartbeat_age_seconds", labels) == 100.0  # not due yet
        h.ctl._gauges(100.0 + GAUGES_EVERY_S)
        assert value("rlctl_agent_heartbeat_age_seconds", labels) == 100.0 + GAUGES_EVERY_S
        h.ctl._gauges(100.5 + GAUGES_EVERY_S, due=True)  # the loop's end: what its last turn saw
        assert value("rlctl_agent_heartbeat_age_seconds", labels) == 100.5 + GAUGES_EVERY_S
    finally:
        h.close()


def test_a_staleness_violation_a_trainer_step_reports_reaches_the_counter_and_status(tmp_path: Path) -> None:
    # the violations (samples staler than η: must stay 0) were in status's `-o json` and the summary alone, no metric
    r = Running(tmp_path, "gauges-violations")
    try:
        value = r.ctl.metrics.registry.get_sample_value
        r.train()
        assert value("rlctl_sample_staleness_violations_total") == 0.0
        r.train(violations=2)
        r.train(violations=1)
        assert value("rlctl_sample_staleness_violations_total") == 3.0
        assert status(r.ctl.snapshot(), now=time.monotonic())["staleness_violations"] == 3
    finally:
        r.close()
