"""`python -m bench checkpoint --quick` times a checkpoint written in the training thread against one snapshotted
and written beside training, on the hf-demo trainer's policy, and restores the background one. Nothing about
speed is asserted here: the benchmark reports it."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT


def test_the_checkpoint_benchmark_restores_what_it_wrote_in_the_background() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "checkpoint", "--quick", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    r = json.loads(out.stdout)
    (case,) = r["cases"].values()
    assert case["restored_exact"] is True
    assert len(case["sync_s_all"]) == len(case["blocked_s_all"]) == r["repeats"]
    assert min(case["sync_s_all"]) > 0 and min(case["blocked_s_all"]) > 0 and case["checkpoint_bytes"] > 0
    assert r["blocked_over_sync"] == case["blocked_over_sync"] > 0
