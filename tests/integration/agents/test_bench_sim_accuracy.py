"""`python -m bench sim-accuracy --quick --json` end to end: real jobs through `rlctl launch`, their
iteration times predicted by the simulator from a profile measured here. No accuracy bound (this machine
is shared and noisy): every evaluated run was measured, replayed and predicted, per mode."""

from __future__ import annotations

import pytest

from rlctl.planner.simjob import MODES
from tests.conftest import bench_json

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def test_sim_accuracy_quick_predicts_every_mode():
    r = bench_json("sim-accuracy", timeout_s=840)
    assert set(r["mape"]) == set(MODES) and all(v >= 0 for v in r["mape"].values())
    assert [c["mode"] for c in r["cases"]] == list(MODES)
    for c in r["cases"]:
        assert c["predicted_s"] > 0 and c["measured_s"] > 0
        # the dedicated-core clock only removes time spent waiting for a core
        assert c["measured_s"] <= c["measured_wall_s"] * 1.001
        assert all(sum(units.values()) == 64 for units in c["samples_per_unit"])  # every sample replayed
        assert len(c["periods_s"]["predicted"]) == len(c["periods_s"]["measured"]) == r["iterations"] - 1
    cal = r["calibration"]["demo"]
    assert min(cal["trainer_s"], cal["rollout_s_per_unit"], cal["weight_sync_s"]) >= 0
