"""`python -m bench reward --quick` runs the hf-demo job through `rlctl launch` with its reward and with the same
reward hanging past its timeout on 2 % of calls: both jobs finish with every prompt trained once. Nothing about
speed is asserted here: the benchmark reports it."""

from __future__ import annotations

import pytest

from tests.conftest import bench_json

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_the_reward_benchmark_runs_both_jobs_to_the_end() -> None:
    r = bench_json("reward", timeout_s=540)
    (eta,) = [k for k in r if k.startswith("eta")]
    e = r[eta]
    assert (e["lost"], e["duplicated"]) == (0, 0)
    assert e["period_s_clean"] > 0 and e["period_s_hung"] > 0
    assert all(isinstance(e[k], int) for k in ("timeouts", "aborted", "filtered", "discarded_tokens"))
    assert r["hung_loss"] == e["hung_loss"] < 1
